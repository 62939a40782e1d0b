"""The built-in aligned VLM: the tiny LLaVA that `postrl vlm-pretrain` builds and aligns on captions of the
shapes pictures with `recipe()`, shipped as package data beside this file so that `postrl demo` starts its
vision branch from an aligned model in a second instead of aligning it for minutes. `postrl demo
--from-scratch` runs the same recipe itself.

The files here (config.json, model.safetensors, tokenizer.json, processor_config.json, ...) are a
`save_pretrained` folder with its processor: `AutoModelForImageTextToText.from_pretrained(folder)` and
`AutoProcessor.from_pretrained(folder)` load it. provenance.json records how it was made: the `postrl
vlm-pretrain` command, the resolved config, the held-out caption loss, the time and the weights' SHA-256.
To make it again:

    OMP_NUM_THREADS=1 python -m postrl.lm.vlm.base_model            # writes into this folder
    OMP_NUM_THREADS=1 python -m postrl.lm.vlm.base_model --out DIR  # elsewhere, to compare

On one thread of the same torch build the run is deterministic, so the weights' checksum repeats.

What it knows: captions ("Describe the picture." → "3 red dots"), so its vision features and projector are
tied to the language model, but never a question of the task: it scores near chance on task:shapes until
SFT shows it the questions and their answers.
"""

from __future__ import annotations

from dataclasses import replace

from postrl.lm.builtin_model import PROVENANCE, WEIGHTS, BuiltinModel
from postrl.lm.vlm.train import VLMPretrainConfig, run_vlm_pretrain

__all__ = [
    "BASE_VLM",
    "PROVENANCE",
    "WEIGHTS",
    "command",
    "is_available",
    "make",
    "path",
    "provenance",
    "recipe",
]


def align_recipe(seed: int = 0) -> VLMPretrainConfig:
    """The alignment config of the built-in VLM (and of `postrl demo --from-scratch`'s vlm-align stage):
    `postrl vlm-pretrain`'s defaults (600 steps; held-out caption loss 1.24 at 100, 0.41 at 200, 0.13 at
    600) on one thread."""
    default = VLMPretrainConfig()
    return replace(default, run=replace(default.run, seed=seed, threads=1))


BASE_VLM = BuiltinModel(
    package="postrl.lm.vlm",
    stage="vlm-pretrain",
    recipe=align_recipe,
    config_class=VLMPretrainConfig,
    run=run_vlm_pretrain,
    keys=("heldout_loss", "steps", "train_examples", "peak_rss_mb"),
    files=("config.json", WEIGHTS, "tokenizer.json", "processor_config.json"),
    description=__doc__.split("\n\n")[0],
)
# The module's functions are BASE_VLM's.
recipe = BASE_VLM.recipe
path = BASE_VLM.path
provenance = BASE_VLM.provenance
is_available = BASE_VLM.is_available
command = BASE_VLM.command
make = BASE_VLM.make
