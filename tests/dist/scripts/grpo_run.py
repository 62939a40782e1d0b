"""GRPO under torchrun, run by the tests with 1 process or 2.

``python -m torch.distributed.run --standalone --nproc_per_node 2 grpo_run.py MODEL_DIR OUT_DIR``:

1. the same global batch on every rank (4 prompts × G = 4 responses sampled with one fixed generator), each
   rank keeps its share of whole groups, computes their advantages and takes μ = 2 passes of `optimise_grpo`, 2
   minibatches each (every other row: the same split as 1 process), with
   2 micro-batches per minibatch (4 rows in one process, 2 per rank: the ranks' micro-batches differ from one
   process's), for each loss type;
   rank 0 saves the weights to ``OUT_DIR/<loss_type>.safetensors``;
2. a 2-step `run_grpo` into ``OUT_DIR/run`` (sampling, rewards, checkpoint and export by rank 0).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import save_model

from postrl.core import group_advantages
from postrl.lm.data import encode_prompts
from postrl.lm.grpo import GRPOConfig, GRPOLossConfig, optimise_grpo, run_grpo
from postrl.lm.models import load_causal_lm
from postrl.lm.rollout import SamplingConfig, generate, left_pad, score
from postrl.lm.rollout.batch import RolloutBatch
from postrl.lm.spine import RunConfig
from postrl.lm.tasks import get_task
from postrl.lm.tokenizer import load_tokenizer
from postrl.lm.trainer import OptimConfig
from postrl.runtime import distributed as dist

G, N_PROMPTS, MAX_LEN = 4, 4, 8
LOSS_TYPES = ("grpo", "token", "dr_grpo")


def global_rollout(model: torch.nn.Module, tokenizer) -> tuple:
    """The whole step's responses (G contiguous rows per prompt) and rewards, identical on every rank."""
    rows = get_task("arithmetic").prompt_rows("train")[:N_PROMPTS]
    ids = encode_prompts(tokenizer, [r["prompt"] for r in rows for _ in range(G)])
    ids, mask = left_pad(ids, tokenizer.pad_token_id)
    rollout = generate(
        model.eval(), ids, mask, max_new_tokens=MAX_LEN, temperature=1.0,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    model.train()
    # responses of different lengths (the untrained model rarely stops by itself), so that the three loss
    # aggregations differ: row i keeps 2 + i mod 7 tokens, as if it had stopped there
    keep = torch.arange(MAX_LEN) < (2 + torch.arange(len(ids)) % 7)[:, None]  # (N, T)
    T = rollout.response_mask.shape[1]
    rollout.response_mask = rollout.response_mask * keep[:, :T]
    rollout.attention_mask[:, rollout.prompt_len :] *= keep[:, :T].to(rollout.attention_mask.dtype)
    # a reward that varies within groups: length and the first response token
    rewards = rollout.response_lengths.float() + (rollout.response_ids[:, 0] % 3).float()
    return rollout, rewards


def one_step(model_dir: Path, loss_type: str, info: dist.DistInfo, parallel: str = "ddp") -> torch.nn.Module:
    """This rank's share of the global batch through `optimise_grpo` (μ = 2, grad_accum 2); the policy
    replicated (``parallel=ddp``) or sharded in place (``fsdp``)."""
    tokenizer = load_tokenizer(model_dir)
    model, ref = load_causal_lm(model_dir), load_causal_lm(model_dir).eval()
    rollout, rewards = global_rollout(model, tokenizer)
    groups = dist.shard_range(N_PROMPTS, info)
    rows = torch.tensor([g * G + j for g in groups for j in range(G)])
    ids, mask, P = rollout.input_ids[rows], rollout.attention_mask[rows], rollout.prompt_len
    with torch.no_grad():
        old, ref_lp = score(model, ids, mask, P), score(ref, ids, mask, P)
    batch = RolloutBatch(
        ids, mask, P, rollout.response_mask[rows], old, group_advantages(rewards[rows], G), ref_lp
    )
    cfg = GRPOLossConfig(
        group_size=G,
        prompts_per_step=N_PROMPTS,
        epochs=2,
        minibatches=2,
        grad_accum=2,
        loss_type=loss_type,
        beta=0.04,
    )
    policy = dist.wrap_model(model, info, parallel)
    # SGD, so the weights after the update are linear in the gradients: Adam's first steps are ≈ sign(g), and
    # for an element whose gradient is ~0 the sign is round-off (in 1 process as in 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimise_grpo(policy, optimizer, batch, cfg, 1.0, MAX_LEN, 1.0)
    return model


def run_config(model_dir: Path) -> GRPOConfig:
    """2 steps of 2 prompts × G = 4 responses of ≤ 4 tokens, β 0.04, AdamW 2e-4 constant; a checkpoint at the end."""
    return GRPOConfig(
        model=str(model_dir),
        task={"n_train": 40, "n_test": 6},
        max_prompt_length=64,
        sampling=SamplingConfig(max_new_tokens=4),
        grpo=GRPOLossConfig(group_size=4, prompts_per_step=2, beta=0.04, loss_type="grpo"),
        optim=OptimConfig(lr=2e-4, warmup_steps=0, min_lr_ratio=1.0),
        run=RunConfig(steps=2, eval_every=0, save_every=0, log_every=1, device="cpu", threads=1),
        eval_size=6,
    )


def main(model_dir: Path, out: Path) -> None:
    info = dist.init_distributed("cpu")
    for loss_type in LOSS_TYPES:
        model = one_step(model_dir, loss_type, info)
        if info.is_main:
            save_model(model, str(out / f"{loss_type}.safetensors"))
    run_grpo(run_config(model_dir), out / "run")
    dist.cleanup()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
