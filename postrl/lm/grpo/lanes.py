"""Asynchronous GRPO: a generation lane samples the next steps' responses while the training lane trains.

The generation lane is another process (`torch.multiprocessing`, spawned) with its own copy of the policy and
its own torch threads. With ``lanes.max_staleness`` k, step s trains on responses sampled by the policy after
step max(0, s − k):

    training lane   ── train s ──▶ publish weights v = s + 1 ──▶ ask for step s + 1 + k ── train s + 1 ──▶ …
    generation lane      … sample s + 1 … s + k (weights ≤ s) ……… load v ── sample s + 1 + k ──▶ …

so generation of the next k steps overlaps training (prime-rl's one-step overlap is k = 1; AReaL, veRL's
fully-async trainer and TRL's AsyncGRPOTrainer bound staleness the same way). The responses of step s are a
function of (seed, s, rank) and of the weights after step s − k only, never of timing: a run is the same
whichever lane is faster, k = 0 is the synchronous algorithm (same responses, same weights), and a resumed run
is the straight run. A checkpoint after step s holds the responses of steps s + 1 … s + k (sampled by weights
the checkpoint no longer has); the lane regenerates the rest.

Weights travel through k + 1 shared-memory copies of the state dict made once at the start (`WeightSlots`):
publishing version v copies the weights into slot v mod (k + 1) and sends only its number. The slot's previous
version, v − k − 1, has been loaded by then: the step just trained, v − 1, took responses the lane sampled after
loading it. Sampled batches come back as bytes. Each message is then a few hundred bytes of pipe, not one
file-descriptor hand-over per tensor (`torch.multiprocessing`'s sharing: ~10 ms a step for a 28-tensor model).

Samples up to k steps old come from a behaviour policy μ ≠ π: ``grpo.is_correction`` (tis or mis) corrects
for it (`postrl.core.importance`, decoupled PPO). A lane that dies, raises or sends nothing for
``lanes.timeout`` seconds stops the run with one error; a lane whose trainer was killed exits by itself.

The lane also scores what it samples: the reference's log-probs (β > 0) and, with ``lanes.rewards``, the reward
functions' terms, so neither waits in the training lane. PPO-RLHF's lanes (`postrl.lm.ppo.lanes`) reuse the
loop (`serve`), the failure report (`reported`), the `Channel` and `GenerationLane` with their own sampling.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import queue
import time
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp

from postrl.lm.grpo.build import reward_fns
from postrl.lm.grpo.config import GRPOConfig, lane_rewards, sampling_engine
from postrl.lm.grpo.engine import (
    Sampled,
    TextEngine,
    make_vllm_sampler,
    sample_prompts,
    sampling_seed,
    vllm_options,
    vllm_sample,
)
from postrl.lm.grpo.rollouts import PromptStream, sampled_terms
from postrl.lm.memory import checkpointing_on
from postrl.lm.rollout import Rollout, SamplingConfig, response_forward, response_log_probs
from postrl.runtime import distributed as dist
from postrl.runtime.errors import UserError

log = logging.getLogger(__name__)
STARTUP_SECONDS = 300.0
"""How long a lane may take to start (spawn, import torch, unpickle the model) before lanes.timeout applies."""
ROLLOUT_TENSORS = ("input_ids", "attention_mask", "response_ids", "response_mask", "log_probs", "finished")


class LaneError(UserError):
    """The generation lane died, raised, or sent nothing within ``lanes.timeout``."""


def pack(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """Tensors → (dtype, shape, bytes) that pickle as plain bytes (any dtype, bfloat16 included)."""
    out = {}
    for name, t in tensors.items():
        flat = t.detach().cpu().contiguous().reshape(-1)
        raw = flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)
        out[name] = (str(t.dtype).removeprefix("torch."), tuple(t.shape), raw.numpy().tobytes())
    return out


def unpack(packed: dict[str, tuple[str, tuple[int, ...], bytes]]) -> dict[str, torch.Tensor]:
    """The inverse of `pack`: tensors that own their memory."""
    out = {}
    for name, (dtype, shape, raw) in packed.items():
        kind = getattr(torch, dtype)
        if not raw:
            out[name] = torch.empty(shape, dtype=kind)
            continue
        data = torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).copy())
        out[name] = data.view(kind).reshape(shape)
    return out


class WeightSlots:
    """k + 1 copies of a state dict in shared memory, made once; version v of the weights goes to slot
    v mod (k + 1) (see the module docstring for why the lane is done with the slot's previous version)."""

    def __init__(self, state: dict[str, torch.Tensor], count: int) -> None:
        self.slots = [
            {name: t.detach().to("cpu", copy=True).share_memory_() for name, t in state.items()}
            for _ in range(count)
        ]

    def write(self, version: int, state: dict[str, torch.Tensor]) -> int:
        """Copy ``state`` into version ``version``'s slot (one foreach copy); its number."""
        slot = version % len(self.slots)
        with torch.no_grad():
            targets = self.slots[slot]
            torch._foreach_copy_(list(targets.values()), [state[name] for name in targets])
        return slot


def sampler_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A frozen eval-mode copy of the policy for the lane, without activation checkpointing and without the
    input-gradient hook transformers adds with it (a local function: a spawned process cannot unpickle it, and
    a sampler needs neither)."""
    model = copy.deepcopy(module).eval().requires_grad_(False)
    if checkpointing_on(model):
        disable = (
            getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable
        )
        disable()
    if hasattr(model, "disable_input_require_grads"):
        model.disable_input_require_grads()
    return model


def step_prompts(stream: Any, prompts_per_step: int, repeat_prompts: bool) -> list[int]:
    """This rank's share of one step's prompts, drawn from ``stream`` (every rank draws the same global ones)."""
    chosen = stream.take(prompts_per_step, None if repeat_prompts else set())
    return [chosen[i] for i in dist.shard_range(len(chosen))]


# ---- the generation lane (the child process) -----------------------------------------------------------------
@dataclass
class LaneRewards:
    """What the generation lane needs to score its responses as the training lane would (lanes.rewards): the
    run's config (reward specs, weights, task options), the training prompts' rows and the columns the reward
    functions do not get."""

    cfg: GRPOConfig
    rows: list[dict[str, Any]]
    hidden: Any

    def load(self, device: torch.device) -> list[Any]:
        """The run's reward functions, loaded from their specs in this process."""
        return reward_fns(self.cfg, self.rows, device)

    def terms(
        self, fns: list[Any], rollout: Rollout, texts: list[str], indices: list[int], repeat: int, step: int
    ) -> dict[str, torch.Tensor]:
        """Each function's terms for step ``step``'s responses (``repeat`` per prompt of ``indices``)."""
        rows = [self.rows[i] for i in indices for _ in range(repeat)]
        sampled = Sampled(rollout, rows, texts)
        return sampled_terms(fns, sampled, self.hidden, step, self.cfg.run.steps, "training")


def lane_main(
    model: torch.nn.Module,
    tokenizer: Any,
    sampling: SamplingConfig,
    prompt_ids: list[list[int]],
    repeat: int,
    seed: int,
    rank: int,
    threads: int,
    channel: Channel,
    vllm: dict[str, Any] | None = None,
    ref: torch.nn.Module | None = None,
    rewards: LaneRewards | None = None,
) -> None:
    """GRPO's generation lane (`serve` over ``channel``): answer each ("sample", step, indices) with
    ("sampled", step, `pack`ed tensors, prompt_len, texts, packed reward terms or None), a failure with one
    message (`reported`). With
    ``vllm`` (`postrl.lm.grpo.engine.vllm_options`), a vLLM engine of this lane samples, ``model``'s weights
    pushed to it before the first sampling after each load. With the frozen reference ``ref`` (β > 0), the
    lane also scores its responses under it (``tensors["ref_log_probs"]``): the training lane then does not.
    With ``rewards`` (lanes.rewards), the lane loads the reward functions and sends each response's terms; a
    reward's error (a `UserError`) goes back as ("user_error", its message)."""
    torch.set_num_threads(threads)
    device = next(model.parameters()).device
    ref_forward = (
        None
        if ref is None
        else response_forward(ref, sampling.use_fast, gradients=False, gathered=True, padding_free=True)
    )
    sampler = None
    stale = [True]  # the vLLM engine's weights are older than the model's

    def sample(step: int, indices: list[int]) -> tuple[Any, ...]:
        key = sampling_seed(seed, ("train", step, rank, 0))  # the key of `TextEngine.sample` for round 0
        if sampler is None:
            rollout, texts = sample_prompts(
                model, tokenizer, sampling, prompt_ids, indices, repeat, key, device
            )
        else:
            if stale[0]:
                sampler.push(model)
                stale[0] = False
            rollout, texts = vllm_sample(
                sampler, model, tokenizer, sampling, prompt_ids, indices, repeat, key, device
            )
        tensors = {k: getattr(rollout, k) for k in ROLLOUT_TENSORS}
        terms = None if fns is None else rewards.terms(fns, rollout, texts, indices, repeat, step)
        if ref_forward is not None:  # as `TextEngine.log_probs("ref", ...)` scores them
            with torch.no_grad():
                tensors["ref_log_probs"] = response_log_probs(
                    ref_forward, rollout.input_ids, rollout.attention_mask, rollout.prompt_len,
                    temperature=sampling.temperature,
                )  # fmt: skip
        return pack(tensors), rollout.prompt_len, texts, None if terms is None else pack(terms)

    with reported(channel.results):
        try:
            sampler = None if vllm is None else make_vllm_sampler(tokenizer, vllm)
            fns = None if rewards is None else rewards.load(device)
            serve(model, channel, sample, loaded=lambda: stale.__setitem__(0, True))
        finally:
            if sampler is not None:  # a launched vLLM server stops with its lane
                sampler.close()


@contextlib.contextmanager
def reported(results: Any) -> Any:
    """A lane's failure goes back to the training lane as one message: a `UserError` (a reward function's) as
    ("user_error", its message), said as the training lane would say it; anything else as ("error", traceback)."""
    try:
        yield
    except UserError as err:
        results.put(("user_error", str(err)))
    except BaseException:  # noqa: BLE001 - every failure goes back to the training lane as one message
        results.put(("error", traceback.format_exc()))


@dataclass
class Channel:
    """How a generation lane and its training lane talk: the request and result queues, the training lane's
    pid (the generation lane leaves when it is gone) and the weights' shared slots."""

    requests: Any
    results: Any
    parent: int
    weights: WeightSlots


def serve(model: torch.nn.Module, channel: Channel, sample: Any, loaded: Any = lambda: None) -> None:
    """A generation lane's loop: say ready, then serve ("weights", version, slot) (load the slot into
    ``model``, then call ``loaded``), ("sample", step, indices) (answer ("sampled", step, *``sample``(step,
    indices))) and ("stop",) in order; leave when the training lane is gone."""
    channel.results.put(("ready",))
    while True:
        try:
            message = channel.requests.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != channel.parent:  # the training lane is gone (killed): nobody will ask again
                return
            continue
        if message[0] == "stop":
            return
        if message[0] == "weights":
            model.load_state_dict(channel.weights.slots[message[2]])
            loaded()
            continue
        step, indices = message[1], message[2]
        channel.results.put(("sampled", step, *sample(step, indices)))


# ---- the training lane's side ---------------------------------------------------------------------------------
@dataclass
class _Pending:
    indices: list[int]
    rollout: Rollout
    texts: list[str]
    ref_log_probs: torch.Tensor | None = None
    terms: dict[str, torch.Tensor] | None = None  # the reward terms the lane computed (lanes.rewards)


class GenerationLane:
    """The training lane's handle on its generation lane: publishes weights, asks for steps ahead, hands
    `collect` a step's responses (`AsyncEngine.sample`), and keeps the not-yet-trained ones for a checkpoint."""

    def __init__(self, cfg: GRPOConfig, engine: TextEngine) -> None:
        self.cfg, self.engine = cfg, engine
        self.k = cfg.lanes.max_staleness
        self.ready: dict[int, _Pending] = {}  # received (or loaded from a checkpoint), not yet trained on
        self.asked: dict[int, list[int]] = {}  # asked for, not yet received
        self.process: Any = None
        self.weights: WeightSlots | None = None  # k + 1 shared copies, made at start
        self.live: dict[str, torch.Tensor] = {}  # the policy's state dict, kept from the start
        self.up = False  # the lane said it is ready: lanes.timeout applies from then on
        self.ahead: Any = None  # the prompt stream at the next step to ask for
        self.next_step = 0  # the next step to ask for
        self.version = 0  # the optimiser steps of the weights the lane has (or will have when it reads them)
        self.ctx = mp.get_context("spawn")

    # -- life cycle
    def start(self, step: int, stream: Any) -> None:
        """Spawn the lane at ``step`` (the loop's first) with the prompt stream at that step, and ask for the
        steps up to ``step`` + k that no checkpoint holds (all sampled by the current weights)."""
        model = self.open_channel()
        g = self.cfg.grpo
        args = (
            model, self.engine.tokenizer, self.cfg.sampling, self.engine.prompts["train"].ids, g.group_size,
            self.cfg.run.seed, dist.rank(), self.cfg.lanes.threads, self.channel,
            vllm_options(self.cfg, next(model.parameters()).dtype) if sampling_engine(self.cfg) == "vllm" else None,
            None if self.engine.ref is None else copy.deepcopy(dist.unwrap(self.engine.ref)).eval(),
            LaneRewards(self.cfg, self.engine.prompts["train"].rows, self.engine.hidden_columns)
            if lane_rewards(self.cfg) else None,
        )  # fmt: skip
        self.ahead = PromptStream(stream.n, stream.seed, stream.position)
        self.launch(lane_main, args, step)

    def open_channel(self) -> torch.nn.Module:
        """The queues and the weights' shared slots; returns the lane's copy of the policy."""
        self.requests, self.results = self.ctx.Queue(), self.ctx.Queue()
        # the state dict's tensors share the live weights' memory (the optimiser steps them in place): kept, not
        # rebuilt every step (walking the modules took a third of a publish on the built-in model)
        self.live = dist.unwrap(self.engine.policy_module).state_dict()
        self.weights = WeightSlots(self.live, self.k + 1)
        self.channel = Channel(self.requests, self.results, os.getpid(), self.weights)
        return sampler_copy(dist.unwrap(self.engine.policy_module))

    def launch(self, target: Any, args: tuple, step: int) -> None:
        """Spawn ``target``(*``args``) and ask for steps ``step`` … ``step`` + k."""
        self.process = self.ctx.Process(target=target, args=args, daemon=True, name="postrl-generation-lane")
        self.process.start()
        self.next_step, self.version = step, step
        for t in range(step, step + self.k + 1):
            self._ask(t, current=step)

    def draw_prompts(self) -> list[int]:
        """This rank's prompts of the next step to ask for, from the look-ahead stream."""
        g = self.cfg.grpo
        return step_prompts(self.ahead, g.prompts_per_step, g.repeat_prompts)

    def stop(self, wait: float = 10.0) -> None:
        """Ask the lane to leave, give it ``wait`` seconds, and make sure it has."""
        if self.process is None:
            return
        try:
            self.requests.put(("stop",))
            self.process.join(timeout=wait)
        finally:
            if self.process.is_alive():
                self.process.kill()  # SIGKILL: a stopped (SIGSTOP) or hung process ignores SIGTERM until resumed
                self.process.join(timeout=5)
            self.process, self.weights, self.live = None, None, {}

    # -- the steps
    def _ask(self, t: int, current: int) -> None:
        """Ask for step ``t`` (its prompts drawn from the look-ahead stream); the weights it needs,
        max(0, t − k), must be ``current``'s unless a checkpoint gave its responses."""
        indices = self.draw_prompts()
        self.next_step = t + 1
        if t in self.ready:  # loaded from a checkpoint
            if self.ready[t].indices != indices:
                raise LaneError(
                    f"checkpoint's responses of step {t} are for other prompts than the run draws"
                )
            return
        if max(0, t - self.k) != current:
            raise LaneError(
                f"step {t} needs the responses of the policy after step {t - self.k}, which the checkpoint "
                "does not hold (it was written with another lanes.max_staleness?)"
            )
        self.asked[t] = indices
        self.requests.put(("sample", t, indices))

    def published(self, steps_done: int) -> None:
        """After the optimiser step that made ``steps_done`` steps: send those weights and ask for the step
        that needs them (steps_done + k)."""
        if self.process is None:
            return
        slot = self.weights.write(steps_done, self.live)
        self.requests.put(("weights", steps_done, slot))
        self.version = steps_done
        while self.next_step <= steps_done + self.k:
            self._ask(self.next_step, current=steps_done)

    def take(self, step: int, indices: list[int]) -> _Pending:
        """Step ``step``'s responses (waiting for the lane if they have not arrived)."""
        while step not in self.ready:
            self._receive(step)
        pending = self.ready.pop(step)
        if pending.indices != indices:
            raise RuntimeError(f"lane: step {step} was sampled for prompts {pending.indices}, not {indices}")
        return pending

    def _receive(self, step: int) -> None:
        """One message from the lane, or a `LaneError` when it died, raised or hung."""
        start = time.monotonic()
        while True:
            timeout = self.cfg.lanes.timeout if self.up else max(self.cfg.lanes.timeout, STARTUP_SECONDS)
            try:
                message = self.results.get(timeout=min(1.0, timeout))
                if message[0] == "ready":
                    self.up, start = True, time.monotonic()
                    continue
                break
            except queue.Empty:
                if not self.process.is_alive():
                    code = self.process.exitcode
                    self.process = None
                    raise LaneError(
                        f"the generation lane exited (code {code}) before sending step {step}'s responses"
                    ) from None
                if time.monotonic() - start > timeout:
                    self.stop(wait=0.0)  # it does not answer: no point asking it to leave
                    raise LaneError(
                        f"the generation lane sent nothing for {timeout:g} s waiting for step {step} "
                        "(lanes.timeout): it hung or is far too slow"
                    ) from None
        if message[0] == "error":
            self.stop()
            last = message[1].strip().splitlines()[-1]
            raise LaneError(f"the generation lane failed sampling step {step}: {last}")
        if message[0] == "user_error":  # a reward function's: the error it would be in this process
            self.stop()
            raise UserError(message[1])
        _, t, packed, prompt_len, texts, packed_terms = message
        tensors = unpack(packed)
        ref = tensors.pop("ref_log_probs", None)
        rollout = Rollout(prompt_len=prompt_len, texts=texts, **tensors)
        terms = None if packed_terms is None else unpack(packed_terms)
        self.ready[t] = _Pending(self.asked.pop(t), rollout, texts, ref, terms)

    # -- checkpoints
    def state(self) -> dict[str, Any]:
        """Every rank's responses for steps not yet trained on (for the checkpoint), after waiting for those
        sampled by weights older than the current ones: a resumed run could not sample them again."""
        for t in sorted(self.asked):
            if self.process is not None and max(0, t - self.k) < self.version:
                while t not in self.ready:
                    self._receive(t)
        kept = {
            t: {"indices": p.indices, "prompt_len": p.rollout.prompt_len, "texts": p.texts,
                "ref_log_probs": p.ref_log_probs, "terms": p.terms,
                **{k: getattr(p.rollout, k) for k in ROLLOUT_TENSORS}}
            for t, p in self.ready.items()
        }  # fmt: skip
        return {"k": self.k, "ranks": dist.all_gather_object(kept)}

    def load(self, state: dict[str, Any]) -> None:
        if int(state["k"]) != self.k:
            raise LaneError(
                f"the checkpoint was written with lanes.max_staleness={state['k']}; resume with that value"
            )
        for t, p in state["ranks"][dist.rank()].items():
            tensors = {k: p[k] for k in ROLLOUT_TENSORS}
            rollout = Rollout(prompt_len=int(p["prompt_len"]), texts=list(p["texts"]), **tensors)
            self.ready[int(t)] = _Pending(
                list(p["indices"]), rollout, list(p["texts"]), p.get("ref_log_probs"), p.get("terms")
            )


class AsyncEngine:
    """A `TextEngine` whose training responses come from the generation lane (everything else is the text
    engine's: held-out sampling, scoring, the loss's forward)."""

    def __init__(self, engine: TextEngine, lane: GenerationLane) -> None:
        self.inner, self.lane = engine, lane
        self.hidden_columns = engine.hidden_columns
        self.scored: tuple[torch.Tensor, torch.Tensor] | None = None  # the last rollout's ids, its log π_ref

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def sample(
        self, split: str, indices: list[int], repeat: int, sampling: SamplingConfig, key: tuple
    ) -> Sampled:
        if split != "train":
            return self.inner.sample(split, indices, repeat, sampling, key)
        _, step, _, round_ = key
        if round_ != 0:
            raise RuntimeError("lanes: refill rounds (grpo.dynamic_sampling) are not sampled by the lane")
        pending = self.lane.take(step, indices)
        rollout, texts = pending.rollout, pending.texts
        self.scored = None if pending.ref_log_probs is None else (rollout.input_ids, pending.ref_log_probs)
        prompts = self.inner.prompts["train"]
        rows = [prompts.rows[i] for i in indices for _ in range(repeat)]
        return Sampled(rollout, rows, texts, terms=pending.terms)

    def log_probs(self, which: str, rollout: Rollout, inputs: Any) -> torch.Tensor:
        """The lane's log π_ref of the responses it sampled; anything else is the text engine's."""
        if which == "ref" and self.scored is not None and torch.equal(self.scored[0], rollout.input_ids):
            return self.scored[1]
        return self.inner.log_probs(which, rollout, inputs)
