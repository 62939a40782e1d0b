"""`postrl grpo`'s entry point: a text policy trains through the recipe (`GRPORecipe`), a vision-language model
through `postrl.lm.vlm.run_vlm_grpo`. It sits above both, so that neither imports the other's caller."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from postrl.lm.grpo.algorithm import GRPORecipe
from postrl.lm.grpo.config import GRPOConfig
from postrl.lm.recipe import run_recipe
from postrl.lm.vlm import is_vlm, run_vlm_grpo


def run_grpo(
    cfg: GRPOConfig, run_dir: str | Path, resume: bool = False, overwrite: bool = False
) -> dict[str, Any]:
    """Train with GRPO, export ``RUN_DIR/model`` (HF format), write the run folder, return the summary.
    Models, prompts and reward functions are loaded and checked before the run folder is touched
    (`postrl.lm.recipe`); a vision-language model runs `postrl.lm.vlm.run_vlm_grpo`."""
    if is_vlm(cfg.model):  # a vision-language model: pictures in the prompts
        return run_vlm_grpo(cfg, run_dir, resume=resume, overwrite=overwrite)
    return run_recipe(GRPORecipe(), cfg, run_dir, resume=resume, overwrite=overwrite)
