"""`postrl demo`: the notes' whole pipeline on the built-in world, then a report.

pretrain → SFT → reward model → PPO-RLHF → DPO (on the reward model's pairs) → GRPO → continued SFT for each
RL stage's time → evaluation of every checkpoint → report, with a vision branch beside the text stages. The
pretrained LM is the built-in base model that postrl ships (`postrl.lm.base_model`, made by `postrl pretrain`
with the recipe in `DemoConfig.pretrain`); ``from_scratch`` (``--from-scratch``) runs that pretraining here.

The package uses the library only through its public names and the stage registry (`postrl.lm.stages`);
nothing in the library imports it. Its modules, top to bottom:

    config.py       `DemoConfig` (every stage's config, nested) and `quick` (the same stages, small budgets)
    stages.py       the pipeline as `DemoStage` rows: a registry stage, its config, the stages it needs
    pipeline.py     `run_demo`: check, schedule the stages and the evaluation, write summary.json and the report
    schedule.py     a job, the critical path of the jobs, the progress line
    runner.py       running the jobs: the ready ones at the same time on lanes (a thread here, workers)
    machine.py      how many lanes the machine has free, CPU seconds and peak memory
    evaluation.py   every checkpoint on the same held-out prompts; the gold-reward frontier's points
    verdicts.py     each stage against its baseline, with two standard errors of the difference
    report.py       report.md and the learning-curve plots; report_html.py its HTML page
    vlm.py          the vision branch's config and rows; vlm_eval.py its evaluation and report section

How the budgets were tuned and what the demo measured on which machine: benchmarks/demo.py.
"""

from postrl.demo.config import ARITHMETIC, SFT_DEMOS, DemoConfig, quick
from postrl.demo.pipeline import build_summary, check_same_config, evaluation_jobs, run_demo
from postrl.demo.stages import check_base_model, continued_sft, copy_base_model, demo_stages, rl_seconds, wire

__all__ = [
    "ARITHMETIC",
    "SFT_DEMOS",
    "DemoConfig",
    "build_summary",
    "check_base_model",
    "check_same_config",
    "continued_sft",
    "copy_base_model",
    "evaluation_jobs",
    "quick",
    "rl_seconds",
    "run_demo",
    "demo_stages",
    "wire",
]
