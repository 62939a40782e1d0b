"""End-to-end: short runs that must learn, exact resume, the run folder, the CLI."""

import argparse
import json
import re
import shutil

import numpy as np
import pytest
import torch

from postrl.control import a2c, ppo, prefs, reinforce, trpo
from postrl.control.commands import add_control_command, control_preset_path, resolve_control_config
from postrl.control.loop import evaluate_policy_episodes, train_from_config
from postrl.runtime.config import ConfigError, load_config


def _cli(*argv):
    parser = argparse.ArgumentParser(prog="postrl")
    add_control_command(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def _random_return(episodes=20):
    """CartPole-v1 under the uniform random policy: ≈ 22."""
    import gymnasium as gym

    env, rng, total = gym.make("CartPole-v1"), np.random.default_rng(0), []
    for i in range(episodes):
        env.reset(seed=i)
        ret, done = 0.0, False
        while not done:
            _, r, term, trunc, _ = env.step(int(rng.integers(2)))
            ret, done = ret + r, term or trunc
        total.append(ret)
    return float(np.mean(total))


def test_ppo_learns_cartpole_in_seconds(tmp_path):
    cfg = load_config(
        ppo.ControlPPOConfig,
        control_preset_path("ppo", "CartPole-v1"),
        ["run.steps=12000", "run.eval_episodes=10"],
    )
    summary = train_from_config(cfg, tmp_path / "run")
    assert summary["eval_return_mean"] > 3 * _random_return()  # random ≈ 22; PPO reaches ≈ 150–500 here
    for key in ("eval_return_std", "env_steps", "steps_per_second", "wall_seconds", "peak_rss_mb"):
        assert key in summary
    assert summary["env_steps"] == 12032  # whole iterations of 8 × 32
    written = {p.name for p in (tmp_path / "run").iterdir()}
    assert {"metrics.jsonl", "summary.json", "config.yaml", "curves.png", "checkpoints"} <= written


SMALL = [
    "env.n_envs=2",
    "ppo.n_steps=16",
    "ppo.batch_size=8",
    "ppo.epochs=2",
    "run.steps=192",
    "run.save_every=1",
    "run.keep_last=20",
    "run.eval_episodes=2",
]


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_resume_is_exact(tmp_path, env_id):
    overrides = [f"env.id={env_id}", *SMALL]
    if env_id == "Pendulum-v1":
        overrides += ["env.normalize_obs=true", "env.normalize_reward=true"]
    cfg = load_config(ppo.ControlPPOConfig, None, overrides)
    straight = tmp_path / "straight"
    train_from_config(cfg, straight)
    interrupted = tmp_path / "interrupted"
    shutil.copytree(straight, interrupted)
    for ckpt in (interrupted / "checkpoints").iterdir():
        if int(ckpt.name.split("_")[1]) > 96:  # as if killed after the 3rd of 6 iterations
            shutil.rmtree(ckpt)
    (interrupted / "summary.json").unlink()
    train_from_config(cfg, interrupted, resume=True)
    last = "step_00000192"
    for name in ("actor.safetensors", "critic.safetensors"):
        a = (straight / "checkpoints" / last / name).read_bytes()
        b = (interrupted / "checkpoints" / last / name).read_bytes()
        assert a == b, f"{name} differs after resume"

    def rows(run):
        return [
            {k: v for k, v in r.items() if k != "time"} for r in map(json.loads, open(run / "metrics.jsonl"))
        ]

    assert rows(straight) == rows(interrupted)


def test_cli_preset_flags_and_overrides():
    cfg = resolve_control_config(
        _cli("control", "train", "--algo", "ppo", "--env", "CartPole-v1", "--seed", "3")
    )
    assert (cfg.ppo.n_steps, cfg.ppo.epochs, cfg.ppo.gamma, cfg.ppo.lam) == (32, 20, 0.98, 0.8)
    assert cfg.ppo.anneal_clip and cfg.run.seed == 3 and cfg.env.n_envs == 8
    args = _cli(
        "control", "train", "--env", "Pendulum-v1", "--total-steps", "1e4", "ppo.lr=3e-4", "env.n_envs=2"
    )
    cfg = resolve_control_config(args)
    assert (cfg.env.id, cfg.run.steps, cfg.ppo.lr, cfg.env.n_envs) == ("Pendulum-v1", 10_000, 3e-4, 2)
    with pytest.raises(ConfigError, match="ppo.clip_eps"):
        resolve_control_config(_cli("control", "train", "ppo.clip_epss=0.1"))


RENAMED = [  # old key → new: one vocabulary with the LM trainers (run.*, epochs, vf_clip)
    ("run.total_steps", "run.steps"),
    ("run.torch_threads", "run.threads"),
    ("run.checkpoint_every", "run.save_every"),
    ("run.keep_checkpoints", "run.keep_last"),
    ("ppo.n_epochs", "ppo.epochs"),
    ("ppo.clip_vf", "ppo.vf_clip"),
]


@pytest.mark.parametrize(("old", "new"), RENAMED)
def test_an_old_key_is_an_error_that_names_the_new_one(tmp_path, old, new):
    said = re.escape(f"'{old}' was renamed: use '{new}'")
    with pytest.raises(ConfigError, match=said):
        resolve_control_config(_cli("control", "train", f"{old}=2"))
    section, key = old.split(".")
    path = tmp_path / "old.yaml"
    path.write_text(f"algo: ppo\n{section}:\n  {key}: 2\n")
    with pytest.raises(ConfigError, match=said + r".*old\.yaml"):
        resolve_control_config(_cli("control", "train", "--config", str(path)))


@pytest.mark.parametrize(
    "config_class",
    [
        reinforce.ControlReinforceConfig,
        a2c.ControlA2CConfig,
        trpo.ControlTRPOConfig,
        prefs.ControlPrefsConfig,
    ],
)
def test_every_control_config_names_the_new_keys(config_class):
    with pytest.raises(
        ConfigError, match=re.escape("'run.checkpoint_every' was renamed: use 'run.save_every'")
    ):
        load_config(config_class, None, ["run.checkpoint_every=5"])
    assert load_config(config_class, None, ["run.save_every=5"]).run.save_every == 5
    if config_class is prefs.ControlPrefsConfig:  # prefs' policy learner is PPO
        with pytest.raises(ConfigError, match=re.escape("'ppo.n_epochs' was renamed: use 'ppo.epochs'")):
            load_config(config_class, None, ["ppo.n_epochs=2"])


def test_max_seconds_stops_at_the_end_of_an_iteration(tmp_path):
    cfg = load_config(ppo.ControlPPOConfig, None, [*SMALL, "run.max_seconds=1e-9", "run.threads=null"])
    summary = train_from_config(cfg, tmp_path / "run")
    assert summary["env_steps"] == 32  # one iteration of 2 envs × 16 steps, of the 192 asked for
    assert [p.name for p in (tmp_path / "run" / "checkpoints").glob("step_*")] == ["step_00000032"]


def test_cli_train_then_eval(tmp_path, capsys):
    out = tmp_path / "run"
    args = _cli(
        "control",
        "train",
        "--env",
        "CartPole-v1",
        "--total-steps",
        "512",
        "--out",
        str(out),
        "run.eval_episodes=2",
    )
    assert args.handler(args) == 0
    capsys.readouterr()
    args = _cli("control", "eval", str(out), "--episodes", "3")
    assert args.handler(args) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(result) == {"deterministic", "stochastic"}


def test_stochastic_evaluation_does_not_touch_the_training_rng():
    cfg = load_config(ppo.ControlPPOConfig, None, ["env.n_envs=1"])
    from postrl.control.envs import VecEnv

    env = VecEnv(cfg.env, 0)
    actor = ppo.build_ppo(cfg, env).actor
    torch.manual_seed(1)
    before = torch.get_rng_state()
    evaluate_policy_episodes(actor, env, cfg, 2, deterministic=False)
    assert torch.equal(before, torch.get_rng_state())


def test_cli_resume_continues_an_interrupted_run(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["control", "train", "--env", "CartPole-v1", "--total-steps", "96", "--out", str(out), *SMALL[:4]]
    argv += ["run.save_every=1", "run.keep_last=10", "run.eval_episodes=1"]
    args = _cli(*argv)
    args.handler(args)
    final = (out / "checkpoints" / "step_00000096" / "actor.safetensors").read_bytes()
    for step in ("step_00000064", "step_00000096"):
        shutil.rmtree(out / "checkpoints" / step)
    (out / "summary.json").unlink()
    args = _cli(*argv)  # the same command again: resumes from step 32
    args.handler(args)
    assert "resuming" in capsys.readouterr().err
    assert (out / "checkpoints" / "step_00000096" / "actor.safetensors").read_bytes() == final
    args = _cli("control", "train", "--resume", str(out))  # explicit: finishes at once (already at 96)
    args.handler(args)
    assert json.loads((out / "summary.json").read_text())["env_steps"] == 96


def test_resume_runs_no_env_module_the_run_folder_names_unless_named_again(tmp_path, monkeypatch):
    """A config.yaml edited to an entry-point env id (``module:Env``) would import that module on resume: the
    resume is refused before anything is imported or written, until the user names the env again."""
    out = tmp_path / "run"
    argv = ["control", "train", "--env", "CartPole-v1", "--total-steps", "64", "--out", str(out), *SMALL[:4]]
    args = _cli(*argv, "run.eval_episodes=1")
    args.handler(args)
    marker = tmp_path / "imported"
    (tmp_path / "evil_env_mod.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = out / "config.yaml"
    config.write_text(config.read_text().replace("id: CartPole-v1", "id: evil_env_mod:Env"))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError, match=r"imports the module 'evil_env_mod'.*--env evil_env_mod:Env"):
        resolve_control_config(_cli("control", "train", "--resume", str(out)))
    assert not marker.exists()
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_resume_is_spelt_as_the_lm_stages_spell_it(tmp_path, capsys):
    """``--out RUN --resume`` (every LM stage's spelling) resumes as ``--resume RUN`` does; a key=value after a
    bare --resume is an override; no folder, or two different ones, is one clear error."""
    out = tmp_path / "run"
    args = _cli(
        "control", "train", "--env", "CartPole-v1", "--total-steps", "64", "--out", str(out), *SMALL[:4]
    )
    args.handler(args)
    assert resolve_control_config(
        _cli("control", "train", "--out", str(out), "--resume")
    ) == resolve_control_config(_cli("control", "train", "--resume", str(out)))
    cfg = resolve_control_config(_cli("control", "train", "--out", str(out), "--resume", "run.steps=128"))
    assert cfg.run.steps == 128
    with pytest.raises(ConfigError, match="--resume needs the run folder"):
        resolve_control_config(_cli("control", "train", "--resume"))
    with pytest.raises(ConfigError, match="name two folders"):
        resolve_control_config(_cli("control", "train", "--out", str(tmp_path / "b"), "--resume", str(out)))
