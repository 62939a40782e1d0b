#!/usr/bin/env python

"""A control preset on many seeds, recorded: ``postrl control bench`` (``postrl/control/bench.py``: every seed a
``postrl control train`` process, evaluation mean ± std per seed, mean, median, IQM with a 95% stratified-bootstrap
interval, the seeds meeting the preset's target) whose summary and per-seed rows this script writes to
``benchmarks/results/control_seeds-<preset>.json``, the file the docs' "Control over many seeds" table is rendered
from (one file per preset, so rerunning one preset leaves the others' rows alone).

    python benchmarks/control_seeds.py --config ppo-cartpole --seeds 10-19 --workers 2
    nice -n 10 python benchmarks/control_seeds.py --config ppo-pendulum --seeds 200-219 --workers 2

The run folders go to ``--out`` (default ``runs/bench/<preset>-s<seeds>``); rerunning the same command skips the
finished seeds and resumes an interrupted one, so a long bench can be finished later and recorded then.
``--name`` records under another name (a tuning candidate beside the preset: ``--name ppo-pendulum-g95``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _record import ROOT, record

from postrl.control.bench import resolve_spec, run_bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="preset name or YAML config")
    parser.add_argument("--seeds", required=True, help="e.g. 10-19 or 0,3,7")
    parser.add_argument("--workers", type=int, default=2, help="seeds trained at once, one process each")
    parser.add_argument("--out", help="bench folder (default runs/bench/<preset>-s<seeds>)")
    parser.add_argument("--name", help="results name (default: the preset's)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides for every seed")
    args = parser.parse_args()
    spec = resolve_spec(args.config, args.seeds, args.overrides)
    out = Path(args.out or f"runs/bench/{spec.name}-s{args.seeds.replace(',', '_')}")
    summary = run_bench(spec, out, args.workers)
    rows = [json.loads(line) for line in (out / "seeds.jsonl").read_text().splitlines() if line.strip()]
    config = Path(summary["config"]).resolve()
    result = {k: v for k, v in summary.items() if k != "command"}  # the record's own command reruns this
    result["config"] = str(config.relative_to(ROOT)) if config.is_relative_to(ROOT) else config.name
    result.update(target=spec.target, per_seed=rows)
    record(f"control_seeds-{args.name or spec.name}", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
