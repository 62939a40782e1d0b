"""The built-in base model: the tiny Llama that `postrl pretrain` makes from scratch with `recipe()`, shipped
as package data beside this file so that `postrl demo` starts from a pretrained LM in a second instead of
pretraining for minutes (and without the luck of one pretraining seed). `postrl demo --from-scratch` runs the
same recipe itself.

The files here (config.json, model.safetensors, tokenizer.json, ...) are a `save_pretrained` folder that any
Hugging Face tool loads; provenance.json records how they were made: the `postrl pretrain` command, the
resolved config, the held-out loss, the time and the weights' SHA-256. To make them again:

    OMP_NUM_THREADS=1 python -m postrl.lm.base_model            # writes into this folder
    OMP_NUM_THREADS=1 python -m postrl.lm.base_model --out DIR  # elsewhere, to compare

On one thread of the same torch build the run is deterministic, so the weights' checksum repeats.

What it knows: the corpus (`postrl.lm.tasks.corpus`) holds the arithmetic task's train problems as bare
equations, "41+38: 79" (every one once per round, a random sign before the result), beside review text and
generic sentences, but not the sums that carry from their units digits (47+38). The base model has learnt
to add 2-digit numbers without carrying and the reviews' language, but has never seen the task's question
format ("What is 47+38?" → " 85"), so it scores about 0 on the task until SFT shows it the format, and the
sums that carry are left for SFT and RL to teach: pretraining does not already solve the task that SFT and
RL are measured on.
"""

from __future__ import annotations

from postrl.lm.builtin_model import PROVENANCE, WEIGHTS, BuiltinModel, install, sha256
from postrl.lm.pretrain import PretrainConfig, run_pretrain
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import OptimConfig, TrainConfig

__all__ = [
    "BASE_LM",
    "PROVENANCE",
    "WEIGHTS",
    "command",
    "install",
    "is_available",
    "make",
    "path",
    "provenance",
    "recipe",
    "sha256",
]


def pretrain_recipe(seed: int = 0) -> PretrainConfig:
    """The pretraining config of the built-in base model (and of `postrl demo --from-scratch`)."""
    return PretrainConfig(
        arithmetic={"digits": 2, "ops": "+"},
        equations="rounds",
        carries=False,
        train=TrainConfig(batch_size=32, max_length=128, packing=True),
        optim=OptimConfig(lr=3e-3, warmup_steps=50, weight_decay=0.1),
        run=RunConfig(steps=800, eval_every=200, save_every=200, seed=seed, threads=1),
    )


BASE_LM = BuiltinModel(
    package="postrl.lm",
    stage="pretrain",
    recipe=pretrain_recipe,
    config_class=PretrainConfig,
    run=run_pretrain,
    keys=("heldout_loss", "steps", "n_params", "peak_rss_mb"),
    files=("config.json", WEIGHTS, "tokenizer.json"),
    description=__doc__.split("\n\n")[0],
)
# The module's functions are BASE_LM's (`postrl.lm.base_model.path()` is the README's).
recipe = BASE_LM.recipe
path = BASE_LM.path
provenance = BASE_LM.provenance
is_available = BASE_LM.is_available
command = BASE_LM.command
make = BASE_LM.make
