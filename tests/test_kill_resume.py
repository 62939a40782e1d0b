"""Kill and resume every trainer: SIGKILL at seeded random moments, resume until it finishes, and end exactly
where an uninterrupted run ends.

For each trainer, on tiny budgets with a checkpoint every step (so kills land in checkpoint writes and in
the deletion of old checkpoints): run the command into folder A; run it into folder B and SIGKILL it five
times (twice before any checkpoint exists: at a random early moment, often before the folder does, and in
the first checkpoint's write, after the first metrics rows; then in a checkpoint write, in the deletion of
old checkpoints after a rename, and anywhere in training; see `tests/kill_harness.py`), restarting after each kill
(LM stages: the same command plus ``--resume``; control: ``--resume B`` and the same command with
``--out B``, in turn). Then B must equal A: the final weights bit for bit (LM stages: ``model/`` (and
``critic/``) safetensors; control: the last checkpoint's), ``metrics.jsonl`` row for row without its
wall-clock keys (`kill_harness.is_wall_clock_key`), and no leftovers: no ``.tmp-*``/``.old-*``/``.del-*`` entry
or atomic-write temp file anywhere, every ``checkpoints/step_*`` readable. A table of what happened per
trainer is printed at the end of the module.

Run with ``pytest -m slow tests/test_kill_resume.py`` (part of ``make bench``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import kill_harness as kh

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
KILLS = ("early", "first", "write", "rename", "train")
RESULTS: dict[str, dict] = {}
DROPPED: set[str] = set()

LM = ["run.device=cpu", "run.threads=1"]
TRAIN = ["run.save_every=1", "run.keep_last=2", "run.log_every=1", "train.batch_size=4"]
CONTROL = ["env.n_envs=2", "run.save_every=1", "run.keep_last=2", "run.eval_episodes=2"]
GRPO_REWARD = "[tests.kill_harness:digits_reward]"  # imported from the repository root, the subprocesses' cwd
# The tiny world's values where the stages' defaults (now TRL's, for real models) differ from them: the runs
# below are the ones this test ran before the config vocabulary was renamed.
SFT_PRESET = str(REPO / "configs" / "sft-arithmetic.yaml")
RM_OPTIM = ["optim.lr=3e-4", "optim.min_lr_ratio=0.1", "optim.warmup_steps=20", "optim.betas=[0.9, 0.95]"]
PPO_OLD = ["max_prompt_length=32", "run.log_every=1", "kl.beta=0.1", "sampling.temperature=1.0"]
PPO_OLD += ["optim.lr=3e-5", "optim.min_lr_ratio=1.0", "optim.betas=[0.9, 0.95]"]
PPO_OLD += ["critic_optim.lr=3e-4", "critic_optim.min_lr_ratio=1.0", "critic_optim.betas=[0.9, 0.95]"]
GRPO_OLD = ["run.log_every=1", "grpo.beta=0.04", "grpo.loss_type=grpo"]
GRPO_OLD += ["optim.lr=2e-4", "optim.min_lr_ratio=1.0", "optim.betas=[0.9, 0.95]"]


@dataclass(frozen=True)
class Trainer:
    """One trainer: its command line into ``out`` given the tiny model folders, and what to compare."""

    name: str
    argv: Callable[[dict[str, Path], Path], list[str]]
    weights: tuple[str, ...] = ("model/*.safetensors",)  # () = the last checkpoint's

    @property
    def is_control(self) -> bool:
        return self.name.startswith("control")


TRAINERS = [
    Trainer(
        "control train ppo",
        lambda m, out: (
            ["control", "train", "--algo", "ppo", "--env", "CartPole-v1", "--out", str(out), *CONTROL]
            + ["ppo.n_steps=16", "ppo.batch_size=8", "ppo.epochs=2", "run.steps=1024"]
        ),
        (),
    ),
    Trainer(
        "control train trpo",
        lambda m, out: (
            ["control", "train", "--algo", "trpo", "--env", "CartPole-v1", "--out", str(out), *CONTROL]
            + ["trpo.n_steps=32", "trpo.critic_epochs=2", "trpo.critic_batch_size=16", "run.steps=1024"]
        ),
        (),
    ),
    Trainer(
        "control prefs",
        lambda m, out: (
            ["control", "prefs", "--env", "CartPole-v1", "--out", str(out), *CONTROL]
            + [
                "ppo.n_steps=32",
                "ppo.batch_size=32",
                "ppo.epochs=2",
                "run.steps=768",
                "run.eval_every=0",
            ]
            + [
                "prefs.segment_length=10",
                "prefs.label_budget=40",
                "prefs.initial_labels=20",
                "prefs.label_until=0.5",
            ]
            + [
                "prefs.segments_per_rollout=16",
                "reward_model.pretrain_steps=20",
                "reward_model.steps_per_iteration=4",
            ]
        ),
        (),
    ),
    Trainer(
        "pretrain",
        lambda m, out: (
            ["pretrain", "--out", str(out), *LM, *TRAIN, "vocab_size=300", "corpus_lines=500"]
            + ["model.n_layers=1", "model.hidden_size=32", "model.intermediate_size=64"]
            + ["model.max_position_embeddings=128", "run.steps=12", "train.max_length=32"]
            + ["run.eval_every=6", "train.eval_examples=8"]
        ),
    ),
    Trainer(
        "sft",
        lambda m, out: (
            ["sft", "--config", SFT_PRESET, "--model", str(m["lm"]), "--out", str(out), *LM, *TRAIN]
            + ["task={n_train: 64, n_test: 16}", "run.steps=12", "train.max_length=48", "run.eval_every=6"]
            + ["train.eval_examples=8", "eval_size=8", "eval_max_new_tokens=4"]
        ),
    ),
    Trainer(
        "rm",
        lambda m, out: (
            ["rm", "--model", str(m["lm"]), "--out", str(out), *LM, *TRAIN, *RM_OPTIM]
            + ["task={n_pairs_train: 48, n_pairs_test: 16}", "run.steps=12", "train.max_length=48"]
            + ["run.eval_every=6", "train.eval_examples=8", "eval_size=16", "norm.samples=8"]
            + ["norm.max_new_tokens=6", "plots=false"]
        ),
    ),
    Trainer(
        "ppo (RLHF)",
        lambda m, out: (
            ["ppo", "--model", str(m["lm"]), "--reward-model", str(m["rm"]), "--out", str(out), *LM, *PPO_OLD]
            + [
                "sampling.max_new_tokens=6",
                "run.steps=8",
                "batch_size=8",
                "ppo.epochs=2",
                "ppo.minibatches=2",
            ]
            + ["reward.missing_eos_penalty=null", "run.eval_every=4", "eval_size=8", "run.save_every=1"]
            + ["run.keep_last=2", "plots=false"]
        ),
        ("model/*.safetensors", "critic/*.safetensors"),
    ),
    Trainer(
        "grpo",
        lambda m, out: (
            ["grpo", "--model", str(m["lm"]), "--out", str(out), *LM, *GRPO_OLD, f"rewards={GRPO_REWARD}"]
            + ["task={n_train: 40, n_test: 6}", "max_prompt_length=32", "sampling.max_new_tokens=4"]
            + ["grpo.group_size=4", "grpo.prompts_per_step=2", "run.steps=10", "run.eval_every=5"]
            + ["eval_size=6", "run.save_every=1", "run.keep_last=2"]
        ),
    ),
    # issue #41: the DPO and VLM trainers as the others (a VLM policy under sft and grpo)
    Trainer(
        "dpo",
        lambda m, out: (
            ["dpo", "--model", str(m["lm"]), "--out", str(out), *LM, *TRAIN, "optim.warmup_steps=0"]
            + ["task={n_pairs_train: 48, n_pairs_test: 8}", "run.steps=12", "train.max_length=48"]
            + ["run.eval_every=6", "train.eval_examples=8", "eval_size=8", "eval_samples=4", "plots=false"]
        ),
    ),
    Trainer(  # issue #40: the stage added through the recipe, as the others
        "kto",
        lambda m, out: (
            ["kto", "--model", str(m["lm"]), "--out", str(out), *LM, *TRAIN, "optim.warmup_steps=0"]
            + ["task={n_pairs_train: 48, n_pairs_test: 8}", "run.steps=12", "train.max_length=48"]
            + ["run.eval_every=6", "train.eval_examples=8", "eval_size=8", "eval_samples=4", "plots=false"]
        ),
    ),
    Trainer(  # issue #34: pairs sampled and judged every step, so a kill lands in sampling too
        "online-dpo",
        lambda m, out: (
            ["online-dpo", "--model", str(m["lm"]), "--judge", "task:reviews", "--out", str(out), *LM, *TRAIN]
            + ["task={n_pairs_train: 8, n_pairs_test: 8}", "run.steps=12", "train.max_length=48"]
            + ["sampling.max_new_tokens=12", "run.eval_every=6", "eval_samples=4", "eval_judge_prompts=4"]
            + ["optim.lr=1e-3", "plots=false"]
        ),
    ),
    Trainer(
        "vlm sft",
        lambda m, out: (
            ["sft", "--model", str(m["vlm"]), "--data", "task:shapes", "--out", str(out), *LM, *TRAIN]
            + ["task={n_train: 64, n_test: 8}", "run.steps=10", "train.max_length=128", "run.eval_every=5"]
            + ["train.eval_examples=8", "eval_size=8", "eval_max_new_tokens=4", "optim.warmup_steps=0"]
        ),
    ),
    Trainer(
        "vlm grpo",
        lambda m, out: (
            ["grpo", "--model", str(m["vlm"]), "--data", "task:shapes", "--out", str(out), *LM, *GRPO_OLD]
            + [f"rewards={GRPO_REWARD}", "task={n_train: 40, n_test: 6}", "max_prompt_length=64"]
            + ["sampling.max_new_tokens=4", "grpo.group_size=4", "grpo.prompts_per_step=2", "run.steps=10"]
            + ["run.eval_every=5", "eval_size=6", "run.save_every=1", "run.keep_last=2"]
        ),
    ),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny tokenizer + Llama (as tests/lm/conftest.py builds them) and a reward model on its trunk."""
    import torch

    from postrl.lm.models import ScalarHeadModel, TinyLMConfig, build_tiny_lm, load_causal_lm
    from postrl.lm.reward_model import NORM_FILE
    from postrl.lm.tasks import build_corpus
    from postrl.lm.tokenizer import build_tokenizer, load_tokenizer

    root = tmp_path_factory.mktemp("kill_models")
    build_tokenizer(build_corpus(n_lines=2000, seed=0), vocab_size=400).save_pretrained(str(root / "tok"))
    tokenizer = load_tokenizer(root / "tok")
    shape = TinyLMConfig(
        n_layers=2, hidden_size=32, n_heads=4, intermediate_size=64, max_position_embeddings=128
    )
    ids = dict(
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    with torch.random.fork_rng():
        build_tiny_lm(len(tokenizer), shape, seed=0, **ids).save_pretrained(str(root / "lm"))
        tokenizer.save_pretrained(str(root / "lm"))
        rm = ScalarHeadModel.from_causal_lm(load_causal_lm(root / "lm"), seed=1)
    rm.save_pretrained(root / "rm")
    tokenizer.save_pretrained(str(root / "rm"))
    (root / "rm" / NORM_FILE).write_text(json.dumps({"mean": 0.1, "std": 0.5, "n": 8}))
    return {"lm": root / "lm", "rm": root / "rm", "vlm": _tiny_vlm(root / "vlm")}


def _tiny_vlm(path: Path) -> Path:
    """The built-in tiny LLaVA (random weights) with a tokenizer for the shapes task, as tests/test_bad_input.py
    builds it."""
    import torch

    from postrl.lm.tasks import get_task
    from postrl.lm.vlm import TinyVLMConfig, build_tiny_vlm, build_vlm_tokenizer, save_vlm

    config = TinyVLMConfig(vision_hidden_size=32, hidden_size=64, intermediate_size=128, vocab_size=300)
    tokenizer = build_vlm_tokenizer(get_task("shapes", n_train=50, n_test=10).corpus_lines(300), 300)
    with torch.random.fork_rng():
        save_vlm(*build_tiny_vlm(tokenizer, config, seed=0), path)
    return path


@pytest.fixture(scope="module", autouse=True)
def table(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory):
    """Print (and save beside the runs) the per-trainer table once the module's tests are done."""
    yield
    lines = [
        "| trainer | kills | where the kills landed | resumed from step | weights = A | metrics = A | leftovers |"
        " seconds: A; B's processes | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for trainer in TRAINERS:
        r = RESULTS.get(trainer.name)
        if r is None:
            lines.append(f"| {trainer.name} | not run | | | | | | | |")
            continue
        lines.append(
            f"| {trainer.name} | {len(r['kills'])} | {'; '.join(r['kills'])} | {', '.join(r['resumed_from'])} "
            f"| {_cell(r['weights'])} | {_cell(r['metrics'])} | {_cell(r['leftovers'], 'none')} "
            f"| {r['a_seconds']:.1f}; {' + '.join(f'{x:.1f}' for x in r['seconds'])} "
            f"| {(r['error'] or '').replace('|', '/')} |"
        )
    lines.append(f"\nwall-clock keys dropped from metrics.jsonl: {', '.join(sorted(DROPPED))}")
    text = "\n".join(lines)
    (tmp_path_factory.getbasetemp() / "kill_resume_table.md").write_text(text + "\n")
    capture = pytestconfig.pluginmanager.get_plugin("capturemanager")
    reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    if capture is not None and reporter is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line("\n" + text)


def _cell(problems: list[str] | None, ok: str = "yes") -> str:
    if problems is None:
        return "n/a"
    return ok if not problems else "NO: " + "; ".join(p.replace("|", "/") for p in problems)


def _resume(trainer: Trainer, first: list[str]) -> Callable[[int, Path], list[str]]:
    """The command after the k-th kill: LM stages add --resume. Control: with an intact checkpoint, --resume B
    and the same command in turn (the same command resumes "a run that has checkpoints but no summary.json");
    without one, --resume B once B has its config.yaml, else (no run folder yet) the same command. A kill
    after summary.json was written left a finished run, which only --resume may touch: it must end at once."""

    def argv(k: int, run_dir: Path) -> list[str]:
        if not trainer.is_control:
            return [*first, "--resume"]
        has_config, has_ckpt = (run_dir / "config.yaml").is_file(), kh.intact_step(run_dir) != "-"
        finished = (run_dir / "summary.json").is_file()
        if has_config and (k % 2 == 1 or not has_ckpt or finished):
            return [*first[:2], "--resume", str(run_dir)]
        return first

    return argv


@pytest.mark.parametrize("trainer", TRAINERS, ids=lambda t: t.name.replace(" ", "-"))
def test_killed_and_resumed_run_equals_an_uninterrupted_one(trainer: Trainer, models, tmp_path: Path) -> None:
    a_dir, b_dir = tmp_path / "A", tmp_path / "B"
    timeline = kh.run_uninterrupted(trainer.argv(models, a_dir), a_dir, tmp_path / "A.log", REPO)
    first, kill_log = trainer.argv(models, b_dir), kh.KillLog()
    record = RESULTS[trainer.name] = {"weights": None, "metrics": None, "leftovers": None, "error": None}
    record["a_seconds"] = timeline.exit_s
    try:
        rng = random.Random(f"kill-resume {trainer.name}")
        kh.kill_and_resume(
            first,
            _resume(trainer, first),
            b_dir,
            list(KILLS),
            rng,
            timeline,
            tmp_path / "B.log",
            REPO,
            kill_log,
        )
    except AssertionError as err:
        record["error"] = str(err).splitlines()[0]
        raise
    finally:
        record.update(kills=kill_log.kills, resumed_from=kill_log.resumed_from, seconds=kill_log.seconds)
    patterns = list(trainer.weights)
    if not patterns:  # control: the last checkpoint of A
        last = max((a_dir / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
        patterns = [f"checkpoints/{last.name}/*.safetensors"]
    record["weights"] = kh.compare_weights(a_dir, b_dir, patterns)
    record["metrics"] = kh.compare_metrics(a_dir, b_dir, DROPPED)
    record["leftovers"] = kh.leftovers(b_dir)
    problems = [f"weights: {p}" for p in record["weights"]]
    problems += [f"metrics.jsonl: {p}" for p in record["metrics"]]
    problems += [f"leftover: {p}" for p in record["leftovers"]]
    if len(kill_log.kills) < len(KILLS):
        problems.append(f"only {len(kill_log.kills)} kills landed before the run finished")
    context = f"{trainer.name} after kills {kill_log.kills}, resumed from {kill_log.resumed_from}"
    assert not problems, context + ":\n" + "\n".join(problems)
