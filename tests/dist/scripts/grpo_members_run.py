"""Every member of the policy-gradient family (grpo.advantage × importance level × aggregation) under torchrun,
run by the tests with 1 process or 2.

``python -m torch.distributed.run --standalone --nproc_per_node 2 grpo_members_run.py MODEL_DIR OUT_DIR``:

1. for each member of ``MEMBERS``: the global batch of `grpo_run.global_rollout` (identical on every rank),
   each rank keeps its share of whole groups, computes their advantages with the trainer's own
   `postrl.lm.grpo.rollouts.compute_advantages` from its rows' rewards only (REINFORCE++'s whitening then
   needs every rank's rewards), and takes μ = 2 passes of `optimise_grpo`, 2 minibatches each, 2 micro-batches
   per minibatch; rank 0 saves the weights to ``OUT_DIR/<member>.safetensors``;
2. a 2-step `run_grpo` of DAPO (β = 0, dynamic sampling, overlong penalty) with REINFORCE++ advantages into
   ``OUT_DIR/run`` (the refill decision is all-reduced; checkpoint and export by rank 0).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import save_model

sys.path.insert(0, str(Path(__file__).parent))  # grpo_run, beside this file (also when loaded by path)
from grpo_run import MAX_LEN, N_PROMPTS, global_rollout  # noqa: E402

from postrl.lm.grpo import GRPOConfig, GRPOLossConfig, optimise_grpo, run_grpo  # noqa: E402
from postrl.lm.grpo.rollouts import compute_advantages  # noqa: E402
from postrl.lm.models import load_causal_lm  # noqa: E402
from postrl.lm.rollout import SamplingConfig, score  # noqa: E402
from postrl.lm.rollout.batch import RolloutBatch  # noqa: E402
from postrl.lm.spine import RunConfig  # noqa: E402
from postrl.lm.tokenizer import load_tokenizer  # noqa: E402
from postrl.lm.trainer import OptimConfig  # noqa: E402
from postrl.runtime import distributed as dist  # noqa: E402

G = 4
MEMBERS = {  # name → GRPOLossConfig keys (the presets' choices, on the test's tiny batch)
    "dr_grpo": {"advantage": "dr_grpo", "loss_type": "dr_grpo", "beta": 0.04},
    "rloo": {"advantage": "rloo", "loss_type": "grpo", "beta": 0.04},
    "reinforce_pp": {"advantage": "reinforce_pp", "loss_type": "token", "beta": 0.04},
    "gspo": {"advantage": "grpo", "importance_level": "sequence", "loss_type": "grpo", "beta": 0.04},
    "dapo": {"advantage": "grpo", "loss_type": "token", "clip_eps_high": 0.28, "beta": 0.0},
}


def one_step(model_dir: Path, member: str, info: dist.DistInfo) -> torch.nn.Module:
    """This rank's share of the global batch, its advantages and `optimise_grpo` (μ = 2, grad_accum 2)."""
    tokenizer = load_tokenizer(model_dir)
    model, ref = load_causal_lm(model_dir), load_causal_lm(model_dir).eval()
    rollout, rewards = global_rollout(model, tokenizer)
    cfg = GRPOLossConfig(
        group_size=G,
        prompts_per_step=N_PROMPTS,
        epochs=2,
        minibatches=2,
        grad_accum=2,
        **MEMBERS[member],
    )
    groups = dist.shard_range(N_PROMPTS, info)
    rows = torch.tensor([g * G + j for g in groups for j in range(G)])
    ids, mask, P = rollout.input_ids[rows], rollout.attention_mask[rows], rollout.prompt_len
    with torch.no_grad():
        old = score(model, ids, mask, P)
        ref_lp = score(ref, ids, mask, P) if cfg.beta else None
    advantages = compute_advantages(rewards[rows], cfg)
    batch = RolloutBatch(ids, mask, P, rollout.response_mask[rows], old, advantages, ref_lp)
    policy = dist.wrap_model(model, info, "ddp")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # linear in the gradient (see grpo_run.py)
    optimise_grpo(policy, optimizer, batch, cfg, 1.0, MAX_LEN, 1.0)
    return model


def run_config(model_dir: Path) -> GRPOConfig:
    """2 DAPO steps of 2 prompts × G = 4 responses of ≤ 4 tokens with REINFORCE++ advantages."""
    return GRPOConfig(
        model=str(model_dir),
        task={"n_train": 40, "n_test": 6},
        max_prompt_length=64,
        sampling=SamplingConfig(max_new_tokens=4),
        grpo=GRPOLossConfig(
            group_size=G,
            prompts_per_step=2,
            beta=0.0,
            loss_type="token",
            clip_eps_high=0.28,
            advantage="reinforce_pp",
            dynamic_sampling=True,
            max_refills=1,
            overlong_buffer=2,
        ),  # fmt: skip
        optim=OptimConfig(lr=2e-4, warmup_steps=0, min_lr_ratio=1.0),
        run=RunConfig(steps=2, eval_every=0, save_every=0, log_every=1, device="cpu", threads=1),
        eval_size=6,
    )


def main(model_dir: Path, out: Path) -> None:
    info = dist.init_distributed("cpu")
    for member in MEMBERS:
        model = one_step(model_dir, member, info)
        if info.is_main:
            save_model(model, str(out / f"{member}.safetensors"))
    run_grpo(run_config(model_dir), out / "run")
    dist.cleanup()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
