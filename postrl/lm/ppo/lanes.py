"""Asynchronous PPO-RLHF: the actor's responses of the next steps are sampled in a generation lane while this
process scores and trains on the last (``lanes.enabled``; GRPO's lanes, `postrl.lm.grpo.lanes`, whose
protocol, shared weight slots, timeouts and checkpointing it reuses: read that docstring first).

With ``lanes.max_staleness`` k, step s trains on responses sampled by the actor after step max(0, s − k). The
lane samples a step exactly as the synchronous step does (`RolloutEngine.generate` on the step's prompts with
the generator of (seed, "rollout", step, rank)), so k = 0 is the synchronous run bit for bit and a resumed run
is the straight run. Scoring (reward model or reward functions), the reference's log-probs, the critic's values
and GAE stay in the training lane: they read the responses, not the actor's weights. The sampler's log-probs
are PPO's π_old (`advantages.make_batch`), so with k > 0 the clipped ratio is taken against the actor that
sampled, the correction GRPO's lanes make with ``grpo.is_correction`` auto on postrl's engine.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import torch

from postrl.lm.grpo.lanes import ROLLOUT_TENSORS, Channel, GenerationLane, pack, reported, serve
from postrl.lm.ppo.build import PPORun, seeded_generator
from postrl.lm.rollout import RolloutEngine, SamplingConfig
from postrl.lm.trainer import iterate_batches
from postrl.runtime import distributed as dist


class PromptOrder:
    """The order PPO draws its steps' prompts in: `iterate_batches` of the prompts from ``position``; under
    torchrun an epoch's short last batch is skipped (each rank needs a full share). ``position`` counts the
    batches drawn, skipped ones included (the checkpoint's prompt position)."""

    def __init__(self, n: int, batch_size: int, seed: int, position: int = 0, say_skips: bool = True) -> None:
        self.batch_size, self.position, self.say_skips = batch_size, position, say_skips
        self.batches = iterate_batches(n, batch_size, seed, position)

    def next(self) -> list[int]:
        """The next step's prompt indices (all ranks')."""
        while True:
            self.position, indices = next(self.batches)
            self.position += 1
            if dist.world_size() == 1 or len(indices) == self.batch_size:
                return indices
            if self.say_skips and dist.is_main():
                print(f"ppo: skipped {len(indices)} prompts (< batch_size; each rank needs a full share)",
                      file=sys.stderr)  # fmt: skip


def mine(indices: list[int]) -> list[int]:
    """This rank's share of a step's prompt indices."""
    return [indices[i] for i in dist.shard_range(len(indices))]


def ppo_lane_main(
    model: torch.nn.Module,
    tokenizer: Any,
    sampling: SamplingConfig,
    prompts: list[Any],
    seed: int,
    rank: int,
    threads: int,
    channel: Channel,
) -> None:
    """The PPO generation lane (`postrl.lm.grpo.lanes.serve`): step ``step``'s responses to ``prompts[i]`` for
    i in the asked indices, sampled as the synchronous step samples them."""
    torch.set_num_threads(threads)
    device = next(model.parameters()).device

    def sample(step: int, indices: list[int]) -> tuple[Any, ...]:
        engine = RolloutEngine(model, tokenizer, sampling)
        generator = seeded_generator(device, seed, "rollout", step, rank)
        rollout = engine.generate([prompts[i] for i in indices], generator)
        tensors = {k: getattr(rollout, k) for k in ROLLOUT_TENSORS}
        return pack(tensors), rollout.prompt_len, rollout.texts, None

    with reported(channel.results):
        serve(model, channel, sample)


class PPOLane(GenerationLane):
    """The training lane's handle on PPO's generation lane: `GenerationLane` with PPO's prompt order and
    sampling (`ppo_lane_main`)."""

    def __init__(self, run: PPORun) -> None:
        super().__init__(run.cfg, SimpleNamespace(policy_module=run.roles.policy))
        self.run = run

    def start(self, step: int, position: int) -> None:
        """Spawn the lane at ``step`` with the prompt order at ``position`` (that step's, not yet drawn), and
        ask for the steps up to ``step`` + k that no checkpoint holds."""
        run, cfg = self.run, self.run.cfg
        model = self.open_channel()
        prompts = [row["prompt"] for row in run.prompts.rows]
        args = (
            model, run.tokenizer, cfg.sampling, prompts, cfg.run.seed, dist.rank(), cfg.lanes.threads, self.channel,
        )  # fmt: skip
        self.ahead = PromptOrder(len(prompts), cfg.batch_size, cfg.run.seed, position, say_skips=False)
        self.launch(ppo_lane_main, args, step)

    def draw_prompts(self) -> list[int]:
        """This rank's share of the next step's prompts to ask for, in PPO's order."""
        return mine(self.ahead.next())
