"""The demo's config: every stage's config nested in one `DemoConfig`, and `quick`, the same stages at small
budgets (`postrl demo --quick`). How these budgets were chosen, seed by seed, is in benchmarks/demo.py."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import postrl.demo.vlm as vision
from postrl.demo.vlm import VLMDemo
from postrl.lm import base_model
from postrl.lm.dpo import DPOConfig, DPOLossConfig
from postrl.lm.grpo import GRPOConfig, GRPOLossConfig
from postrl.lm.grpo.config import GRPOSamplingConfig
from postrl.lm.ppo import KLConfig, PPOConfig, PPOLossConfig, RewardConfig
from postrl.lm.pretrain import PretrainConfig
from postrl.lm.reward_model import RMConfig
from postrl.lm.rollout import SamplingConfig
from postrl.lm.sft import SFTConfig
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import OptimConfig, TrainConfig

# The arithmetic the demo measures: 2-digit sums, asked as "What is 47+38?". The base model's corpus holds
# the train problems that do not carry as bare equations: it adds, but knows neither this format nor carrying.
ARITHMETIC = {"digits": 2, "ops": "+"}
# SFT sees this many demonstrations of it; GRPO's verifier scores any of the task's 5,000 train prompts.
# Checking an answer is cheaper than writing one: the situation RL with a verifier is for.
SFT_DEMOS = 200


@dataclass(frozen=True)
class DemoConfig:
    """`postrl demo --out RUN_DIR [--quick] [--from-scratch]`: every stage's config, nested (override e.g.
    grpo.run.steps=40)."""

    from_scratch: bool = False
    """Pretrain the tiny LM here with `pretrain` (minutes) instead of starting from the built-in base model
    that postrl ships, made by the same config (postrl/lm/base_model/provenance.json)."""
    pretrain: PretrainConfig = field(default_factory=base_model.recipe)
    """Stage 1 (with from_scratch): the tiny LM and its tokenizer, from scratch."""
    sft: SFTConfig = field(
        default_factory=lambda: SFTConfig(
            data="task:arithmetic,task:reviews",
            task={"arithmetic": {**ARITHMETIC, "n_train": SFT_DEMOS}, "reviews": {"n_sft_train": 100}},
            train=TrainConfig(batch_size=64, max_length=48),
            optim=OptimConfig(lr=1e-3, warmup_steps=20, min_lr_ratio=1.0),
            run=RunConfig(steps=200, eval_every=25, save_every=100),
        )
    )
    """Stage 2: supervised fine-tuning on a few hundred demonstrations of both tasks, until they are used up
    (held-out accuracy peaks, then the held-out loss turns up): what is left is RL's."""
    rm: RMConfig = field(
        default_factory=lambda: RMConfig(
            data="task:reviews",
            task={"perturb_fraction": 0.3},
            train=TrainConfig(batch_size=32, max_length=48),
            optim=OptimConfig(lr=5e-4, warmup_steps=20),
            run=RunConfig(steps=200, eval_every=50, save_every=200),
            plots=False,
        )
    )
    """Stage 3: the Bradley–Terry reward model on the labeller's preferences."""
    ppo: PPOConfig = field(
        default_factory=lambda: PPOConfig(
            data="task:reviews",
            max_prompt_length=32,
            sampling=SamplingConfig(max_new_tokens=24, temperature=1.0),
            ppo=PPOLossConfig(minibatches=4),
            kl=KLConfig(beta=0.1),
            reward=RewardConfig(clip=5.0),
            optim=OptimConfig(lr=8e-5, warmup_steps=0, min_lr_ratio=1.0),
            critic_optim=OptimConfig(lr=3e-4, warmup_steps=0, min_lr_ratio=1.0),
            run=RunConfig(steps=30, eval_every=10, save_every=30, log_every=1),
            eval_size=128,
        )
    )
    """Stage 4: PPO-RLHF against the reward model with a frozen reference."""
    dpo: DPOConfig = field(
        default_factory=lambda: DPOConfig(
            data="task:reviews",
            task={"perturb_fraction": 0.3},
            dpo=DPOLossConfig(beta=0.1),
            train=TrainConfig(batch_size=32, max_length=48),
            optim=OptimConfig(lr=1e-4, warmup_steps=0, min_lr_ratio=1.0, betas=(0.9, 0.95)),
            run=RunConfig(steps=100, eval_every=50, save_every=50, keep_last=0),
            eval_samples=128,
            sampling=SamplingConfig(max_new_tokens=24, temperature=1.0),
        )
    )
    """Stage 4b: DPO on the reward model's own preference pairs, no reward model in the loop (its score of
    the samples is logged beside the gold reward); half the steps of configs/dpo-reviews.yaml."""
    grpo: GRPOConfig = field(
        default_factory=lambda: GRPOConfig(
            data="task:arithmetic",
            task=ARITHMETIC,
            max_prompt_length=256,
            sampling=GRPOSamplingConfig(max_new_tokens=8),
            grpo=GRPOLossConfig(group_size=8, beta=0.04, loss_type="grpo", minibatches=2),  # 32 prompts
            optim=OptimConfig(lr=2e-4, warmup_steps=0, min_lr_ratio=1.0),
            run=RunConfig(steps=120, eval_every=30, save_every=120, log_every=1),
            eval_size=200,
        )
    )
    """Stage 5: GRPO on the arithmetic verifier, 2 updates per sampled batch."""
    vlm: VLMDemo = field(default_factory=VLMDemo)
    """The vision branch beside the text stages: the tiny VLM on task:shapes (`postrl.demo.vlm`)."""
    compare_sft: bool = True
    """Also run continued SFT for each RL stage's training time (what RL adds beyond more supervision)."""
    eval_prompts: int = 500
    """Held-out arithmetic prompts for exact match (greedy)."""
    eval_samples: int = 256
    """Held-out review responses for gold reward, RM score and KL (sampled at temperature 1)."""
    frontier_max_n: int = 16
    """Best-of-n on the report's gold-reward frontier: n = 1, 2, 4 … this, from the SFT policy ranked by the
    reward model (0: no best-of-n points)."""
    frontier_prompts: int = 64
    """Held-out review prompts for best-of-n (each gets frontier_max_n samples)."""
    seed: int = 0
    """Seed of every stage."""
    threads: int | None = 1
    """torch intra-op threads for every stage (null: torch's default). One thread: the tiny model gains
    little from a second, and a second CPU-bound process on the machine then slows the demo in proportion
    instead of several times over (oversubscribed threads wait on each other)."""
    workers: int | None = None
    """Stages run at the same time, on lanes with `threads` threads each: one in this process, the others
    worker processes (null: 2, or 1 when other processes, niced ones aside, keep every core busy right now;
    1: one after another in this process)."""

    CHECKS = {
        "eval_prompts": ">= 1",
        "eval_samples": ">= 1",
        "frontier_max_n": ">= 0",
        "frontier_prompts": ">= 1",
        "seed": ">= 0",
        "threads": ">= 1",
        "workers": ">= 1",
    }


def quick(cfg: DemoConfig) -> DemoConfig:
    """The same stages with small budgets (the test suite runs this end to end). Each stage checks itself
    once, at its end, and still moves its number clearly past its baseline: the reward model trains fewer
    steps at a higher rate, PPO a higher rate against that younger reward model (with a larger KL β), GRPO
    smaller steps with one update per batch; DPO gets its curve and frontier points. The continued-SFT
    baselines are left out (``compare_sft``: the full demo's question). Pretraining keeps its recipe (a
    smaller one would not learn the sums)."""
    r = dataclasses.replace
    return r(
        cfg,
        compare_sft=False,
        frontier_max_n=8,
        frontier_prompts=32,
        sft=r(cfg.sft, eval_size=64, run=r(cfg.sft.run, steps=100, eval_every=100, save_every=100)),
        rm=r(
            cfg.rm,
            eval_size=128,
            norm=r(cfg.rm.norm, samples=32),
            optim=r(cfg.rm.optim, lr=1e-3),
            run=r(cfg.rm.run, steps=80, eval_every=80, save_every=80),
        ),
        ppo=r(
            cfg.ppo,
            eval_size=32,
            kl=r(cfg.ppo.kl, beta=0.2),
            optim=r(cfg.ppo.optim, lr=1.5e-4),
            run=r(cfg.ppo.run, steps=10, eval_every=10, save_every=10),
        ),
        dpo=r(
            cfg.dpo,
            eval_size=128,
            eval_samples=32,
            train=r(cfg.dpo.train, batch_size=16),
            run=r(cfg.dpo.run, steps=20, eval_every=20, save_every=20),
        ),
        grpo=r(
            cfg.grpo,
            eval_size=64,
            grpo=r(cfg.grpo.grpo, minibatches=1),
            optim=r(cfg.grpo.optim, lr=1e-4),
            run=r(cfg.grpo.run, steps=40, eval_every=40, save_every=40),
        ),
        vlm=vision.quick_vlm(cfg.vlm),
    )
