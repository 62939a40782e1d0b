"""``postrl control train``, ``eval``, ``bench`` (many seeds of a preset: ``bench.py``) and ``prefs``.

torch, numpy and gymnasium load inside the handlers (only argparse and the config reader at module level), so
``--help`` is instant. Config precedence: the algorithm's defaults, then the shipped preset ``<algo>-<env>.yaml`` (when
it exists and no ``--config`` is given) or ``--config FILE``, then ``--env/--total-steps/--seed``, then
``key=value`` overrides.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from postrl.runtime.config import ConfigError, format_help, load_config, read_yaml
from postrl.runtime.presets import presets_dir

ALGOS = ("reinforce", "a2c", "trpo", "ppo")


def add_control_command(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``control`` with its ``train`` and ``eval`` subcommands."""
    control = subparsers.add_parser("control", help="Part 1: REINFORCE, A2C, TRPO, PPO on Gymnasium envs")
    sub = control.add_subparsers(dest="control_command", metavar="{train,eval,bench,prefs}")
    sub.required = True
    train = sub.add_parser(
        "train",
        help="train an agent; writes RUN_DIR/metrics.jsonl, summary.json, checkpoints, curves.png",
        description="Train an agent. Any config key can be overridden as key=value (e.g. ppo.lr=3e-4); "
        "--list-keys prints them all with their help.",
    )
    train.add_argument("--algo", choices=ALGOS, default="ppo", help="algorithm (default ppo)")
    train.add_argument("--env", default=None, help="Gymnasium id, e.g. CartPole-v1 (default: the config's)")
    train.add_argument(
        "--total-steps", type=float, default=None, help="environment steps to train for (run.steps)"
    )
    train.add_argument("--seed", type=int, default=None, help="random seed")
    train.add_argument("--out", default=None, help="run folder (default runs/<algo>-<env>-s<seed>)")
    train.add_argument(
        "--config",
        default=None,
        help="YAML config or preset name (default: the preset <algo>-<env> if postrl has one)",
    )
    _add_resume(
        train,
        "continue the run in --out RUN_DIR (or in RUN_DIR, the older spelling) exactly from its last "
        "checkpoint, with its saved config and any key=value overrides (rerunning the same command with --out "
        "RUN_DIR also resumes a run without summary.json)",
    )
    _add_overwrite(train)
    train.add_argument(
        "--list-keys", action="store_true", help="print every config key with its help and exit"
    )
    train.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    train.set_defaults(handler=_train)
    ev = sub.add_parser(
        "eval", help="evaluate a trained run: mean ± std return, deterministic and stochastic"
    )
    ev.add_argument("run_dir", help="run folder written by `postrl control train`")
    ev.add_argument("--episodes", type=int, default=20, help="evaluation episodes (default 20)")
    ev.add_argument("--seed", type=int, default=None, help="evaluation seed (default: the run's)")
    ev.add_argument(
        "--gif", default=None, metavar="PATH", help="also write a GIF of one deterministic episode"
    )
    ev.set_defaults(handler=_eval)
    _add_bench_parser(sub)
    _add_prefs_parser(sub)
    return control


def _add_resume(parser: argparse.ArgumentParser, help_text: str) -> None:
    """``--out RUN_DIR --resume``, as every LM stage spells it; ``--resume RUN_DIR`` is kept too."""
    parser.add_argument("--resume", nargs="?", const="", default=None, metavar="RUN_DIR", help=help_text)


def resume_dir(args: argparse.Namespace) -> str | None:
    """The run folder a command line resumes (None: it does not): ``--resume RUN_DIR``, or ``--out RUN_DIR
    --resume``. A ``key=value`` right after a bare ``--resume`` is an override, not a folder."""
    value = args.resume
    if value is not None and "=" in value and not Path(value).is_dir():
        args.overrides = [value, *args.overrides]
        value = ""
    if value == "":
        if args.out is None:
            raise ConfigError("--resume needs the run folder: --out RUN_DIR --resume (or --resume RUN_DIR)")
        value = args.out
    elif value is not None and args.out is not None and Path(value) != Path(args.out):
        raise ConfigError(f"--resume {value} and --out {args.out} name two folders; give one")
    args.resume = value
    return value


def _add_overwrite(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="start over in an --out folder that holds a run (finished or not): the old run is deleted "
        "once the new config and env are checked",
    )


def control_preset_path(algo: str, env_id: str) -> Path | None:
    """The shipped preset ``<algo>-<env>`` for e.g. ("ppo", "CartPole-v1") → ppo-cartpole.yaml, if postrl has
    one (`postrl.runtime.presets`); without one the algorithm's defaults run (logged at info level)."""
    name = re.sub(r"-v\d+$", "", env_id).lower().replace("/", "-")
    path = presets_dir() / f"{algo}-{name}.yaml"
    if path.is_file():
        return path
    logging.getLogger(__name__).info(
        "no preset %s for %s on %s: %s's defaults run", path.name, algo, env_id, algo
    )
    return None


def resolve_control_config(args: argparse.Namespace):
    """The config of a ``train`` (or ``prefs``) command line (see the module docstring for the precedence)."""
    resume_dir(args)
    return train_config(
        args.algo, env=args.env, config=args.config, total_steps=args.total_steps, seed=args.seed,
        resume=args.resume, overrides=args.overrides,
    )  # fmt: skip


def train_config(
    algo: str,
    *,
    env: str | None = None,
    config: str | os.PathLike[str] | None = None,
    total_steps: float | None = None,
    seed: int | None = None,
    resume: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
):
    """The config ``postrl control train`` resolves, and `postrl.control.train` with it: on ``resume`` the run
    folder's config.yaml; else the ``config`` file (default: the shipped preset ``<algo>-<env>`` when there is
    one, else the algorithm's defaults), then ``env`` / ``total_steps`` / ``seed``, then ``overrides``."""
    from postrl.control.loop import algorithm  # deferred: torch, which `postrl --help` must not import

    if resume:
        run_dir = os.fspath(resume)
        cfg = load_config(
            algorithm(_run_algo(run_dir)).config, Path(run_dir) / "config.yaml", list(overrides)
        )
        check_env_code(cfg.env.id, env, run_dir)
        return cfg
    config_class = algorithm(algo).config
    path = config
    if path is None:
        path = control_preset_path(algo, env or config_class().env.id)
    if path is not None and (found := read_yaml(path).get("algo", algo)) != algo:
        raise ConfigError(f"{path} is a config for algo '{found}', not '{algo}'")
    flags = [f"env.id={env}"] if env else []
    if total_steps is not None:
        flags.append(f"run.steps={int(total_steps)}")
    if seed is not None:
        flags.append(f"run.seed={seed}")
    return load_config(config_class, path, [*flags, *overrides])


def check_env_code(env_id: str, named: str | None, run_dir: str) -> None:
    """A run folder's env id of the form ``module:Env`` imports ``module`` (Gymnasium's entry-point ids): a run
    folder received from someone else would run its code on resume, so the user must name the env again."""
    if ":" in env_id and named != env_id:
        raise ConfigError(
            f"--resume {run_dir}: its config.yaml has env.id={env_id!r}, which imports the module "
            f"{env_id.split(':')[0]!r} (its code runs); to resume, name it again: --env {shlex.quote(env_id)}"
        )


def _interrupted(run_dir: Path) -> bool:
    """A run folder without summary.json: rerunning the same command resumes it (from its last checkpoint,
    or from step 0 when it was killed before the first)."""
    from postrl.runtime.rundir import run_state  # deferred: torch (rundir imports runtime.distributed)

    return run_state(run_dir) == "interrupted"


def _run_algo(run_dir: str) -> str:
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"--resume {run_dir}: not a run folder (no config.yaml)")
    return str(read_yaml(path).get("algo", "ppo"))


def _train(args: argparse.Namespace) -> int:
    if args.list_keys:
        from postrl.control.loop import algorithm  # deferred: torch

        print(format_help(algorithm(args.algo).config))
        return 0
    from postrl.control.loop import train_from_config  # deferred: torch

    cfg = resolve_control_config(args)
    return _run(cfg, args, train_from_config)


def _run(cfg, args: argparse.Namespace, train_fn) -> int:
    """``train_fn(cfg, out, resume=…)`` in the run folder (an interrupted one resumes), summary printed."""
    out = args.resume or args.out or f"runs/{cfg.algo}-{cfg.env.id}-s{cfg.run.seed}"
    resume = bool(args.resume) or (_interrupted(Path(out)) and not args.overwrite)
    if resume and not args.resume:
        print(
            f"postrl: {out} holds an interrupted run; resuming it from its last checkpoint", file=sys.stderr
        )
    summary = train_fn(cfg, out, resume=resume, overwrite=args.overwrite)
    print(json.dumps(summary))
    print(f"run folder: {out}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    import numpy as np  # deferred, as torch: `postrl --help` stays instant

    from postrl.control.loop import evaluate_policy_episodes, load_agent, record_gif

    cfg, agent, env = load_agent(args.run_dir)
    seed = cfg.run.seed if args.seed is None else args.seed
    result = {}
    for mode, deterministic in (("deterministic", True), ("stochastic", False)):
        returns = evaluate_policy_episodes(
            agent.actor, env, cfg, args.episodes, deterministic=deterministic, seed=seed
        )
        result[mode] = {"mean": float(np.mean(returns)), "std": float(np.std(returns))}
        print(f"{mode:>13}: {np.mean(returns):9.2f} ± {np.std(returns):.2f}  ({args.episodes} episodes)")
    if args.gif:
        path = record_gif(agent.actor, env, cfg, Path(args.gif))
        if path is not None:
            print(f"gif: {path}")
    print(json.dumps(result))
    return 0


def _add_bench_parser(sub: argparse._SubParsersAction) -> None:
    """``postrl control bench``: one config on many seeds, in parallel processes (``postrl.control.bench``)."""
    bench = sub.add_parser(
        "bench",
        help="train a preset on many seeds in parallel processes; per-seed rows, IQM with a bootstrap "
        "interval, fraction meeting the target, all seeds' curves",
        description="Run `postrl control train` for every seed of --seeds (OUT/seed-S), up to --workers at a "
        "time with one torch thread each, then write OUT/seeds.jsonl and seeds.csv (one row per seed: final "
        "evaluation mean ± std, env steps, wall and CPU seconds), OUT/summary.json (mean, std, median, "
        "IQM with a 95% stratified-bootstrap interval, fraction of seeds meeting the preset's target) and "
        "OUT/curves.png (every seed's learning curve, median, IQR and min-max bands). Rerunning the same "
        "command skips finished seeds and resumes interrupted ones. key=value overrides apply to every seed.",
    )
    bench.add_argument("--config", required=True, help="preset name (e.g. ppo-cartpole) or YAML config file")
    bench.add_argument(
        "--seeds", default="0-9", help="seeds: a range, a list or both, e.g. 0-9, 10-19, 0,3,7"
    )
    bench.add_argument("--out", default=None, help="bench folder (default runs/bench/<config name>)")
    bench.add_argument(
        "--workers",
        type=int,
        default=None,
        help="seeds trained at once, one process each (default: the CPU count, at most the seed count)",
    )
    bench.add_argument(
        "--target",
        type=float,
        default=None,
        help="evaluation return a seed must reach (default: the preset's, postrl.control.bench.TARGETS)",
    )
    bench.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides for every seed")
    bench.set_defaults(handler=_bench)


def _bench(args: argparse.Namespace) -> int:
    """Validate everything (config, overrides, env, seeds, workers, --out) before the folder is touched."""
    from postrl.control import bench  # deferred: gymnasium and torch through the loop

    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: must be at least 1")
    if args.target is not None and args.target != args.target:
        raise ConfigError("--target nan: must be a number")
    spec = bench.resolve_spec(args.config, args.seeds, args.overrides, args.target)
    out = Path(args.out or f"runs/bench/{spec.name}")
    bench.check_out(out, spec)
    workers = args.workers or min(os.cpu_count() or 1, len(spec.seeds))
    command = [
        "postrl",
        "control",
        "bench",
        "--config",
        args.config,
        "--seeds",
        args.seeds,
        "--out",
        str(out),
    ]
    command += [*(["--target", str(args.target)] if args.target is not None else []), *args.overrides]
    summary = bench.run_bench(spec, out, workers, command=shlex.join(command))
    print(json.dumps(summary))
    print(f"bench folder: {out}")
    return 1 if summary["seeds_failed"] else 0


def _add_prefs_parser(sub: argparse._SubParsersAction) -> None:
    """``postrl control prefs``: PPO on a reward learned from segment preferences (``postrl.control.prefs``)."""
    prefs = sub.add_parser(
        "prefs",
        help="PPO on a reward learned from labelled segment pairs (Christiano et al. 2017)",
        description="Learn a reward-model ensemble from preferences between segments of the agent's "
        "behaviour (a synthetic labeller, people on the labelling page, or a judge) and train PPO on it; the "
        "true reward is only logged. Writes RUN_DIR/metrics.jsonl, summary.json (true_return, labels_used, "
        "rm_accuracy, reward_correlation), "
        "checkpoints and true_return_vs_labels.png. Any config key can be overridden as key=value.",
    )
    prefs.add_argument("--env", default=None, help="Gymnasium id, e.g. CartPole-v1 or Pendulum-v1")
    prefs.add_argument(
        "--total-steps", type=float, default=None, help="environment steps to train for (run.steps)"
    )
    prefs.add_argument("--seed", type=int, default=None, help="random seed")
    prefs.add_argument("--labels", type=int, default=None, help="label budget (prefs.label_budget)")
    prefs.add_argument(
        "--noise",
        type=float,
        default=None,
        help="probability that the labeller flips a label (labeller.flip_prob)",
    )
    prefs.add_argument(
        "--labeller",
        default=None,
        metavar="SOURCE",
        help="who labels (labeller.source): synthetic (default), page (people on the labelling page, served "
        "by the run), fn:MODULE:FUNCTION (a judge of two segments), rm:RUN_DIR (an earlier run's reward model)",
    )
    prefs.add_argument("--out", default=None, help="run folder (default runs/prefs-<env>-s<seed>)")
    prefs.add_argument(
        "--config", default=None, help="YAML config or preset name (default: the preset prefs-<env>)"
    )
    _add_resume(prefs, "continue the interrupted run in --out RUN_DIR (or in RUN_DIR) exactly")
    _add_overwrite(prefs)
    prefs.add_argument(
        "--list-keys", action="store_true", help="print every config key with its help and exit"
    )
    prefs.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    prefs.set_defaults(handler=_prefs, algo="prefs")


def _prefs(args: argparse.Namespace) -> int:
    """Run ``postrl.control.prefs`` and print its summary (preference metrics included)."""
    from postrl.control.prefs import ControlPrefsConfig, run  # deferred: torch

    if args.list_keys:
        print(format_help(ControlPrefsConfig))
        return 0
    flags = [f"prefs.label_budget={args.labels}"] if args.labels is not None else []
    if args.noise is not None:
        flags.append(f"labeller.flip_prob={args.noise}")
    if args.labeller is not None:
        flags.append(f"labeller.source={args.labeller}")
    args.overrides = [*flags, *args.overrides]
    return _run(resolve_control_config(args), args, run)
