"""VLM SFT and GRPO under ``torchrun --nproc_per_node 2`` (gloo; DDP, and FSDP2 for GRPO with the vision tower
frozen): on the same global batch, 2 ranks take the steps one process takes (weights after 2 and 4 steps), a resume at 2 processes ends on the straight
2-process run's weights bit for bit, and rank 0's checkpoints and export load in one process. This file is
also the script torchrun runs.

GRPO samples per rank (each rank its own generator), so to put the same global batch through 1 and 2
processes the runs sample with `replayable_sample`: a prompt's responses depend on the prompt and the step
only, not on the rank that draws it or the prompts beside it. Both stages train with `sgd`, whose update is
linear in the gradient: AdamW's first steps (≈ lr · sign(g)) would hide a gradient off by a constant factor,
e.g. a loss normalised by one rank's count, and amplify round-off where g ≈ 0."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from postrl.lm.grpo import GRPOConfig, run_grpo
from postrl.lm.grpo import algorithm as grpo_algorithm
from postrl.lm.grpo.config import GRPOLossConfig
from postrl.lm.grpo.engine import Sampled
from postrl.lm.rollout import Rollout, SamplingConfig
from postrl.lm.sft import SFTConfig, run_sft
from postrl.lm.spine import RunConfig
from postrl.lm.tasks import get_task
from postrl.lm.tasks.base import stable_hash
from postrl.lm.trainer import OptimConfig, TrainConfig
from postrl.lm.vlm import (
    TinyVLMConfig,
    VLMPretrainConfig,
    answer_accuracy,
    build_tiny_vlm,
    build_vlm_tokenizer,
    encode_rows,
    prompt_batch,
    run_vlm_pretrain,
    vlm_score,
)
from postrl.lm.vlm import train as vlm_train
from postrl.lm.vlm.grpo import VLMEngine, run_vlm_grpo
from postrl.lm.vlm.train import VLMSupervised, check_parallel, decode
from postrl.runtime import distributed as dist
from postrl.runtime.errors import UserError

TINY = TinyVLMConfig(vision_hidden_size=32, hidden_size=64, intermediate_size=128, vocab_size=300)
SHAPES = {"n_train": 40, "n_test": 8}
SAMPLE = VLMEngine.sample


def length_reward(completions, **kwargs) -> list[float]:
    """A reward a 3-step model gets: the answer's length (completions are assistant turns)."""
    return [float(len(c[-1]["content"])) for c in completions]


def replayable_sample(self: VLMEngine, split: str, indices: list[int], repeat: int, sampling, key: tuple):
    """`VLMEngine.sample` for the comparison: ``repeat`` responses of random tokens (an EOS after 1 to T − 1 of
    them, or none) from a generator seeded by the prompt's row and the step (restored by a resume), scored
    teacher-forced for log π_old. Evaluation samples as usual."""
    if split != "train":
        return SAMPLE(self, split, indices, repeat, sampling, key)
    examples = [self.examples[split][i] for i in indices]
    tok, T = self.processor.tokenizer, sampling.max_new_tokens
    special = set(tok.all_special_ids) | set(self.banned)
    allowed = torch.tensor([i for i in range(len(tok)) if i not in special])
    responses, masks = [], []
    for e in examples:
        gen = torch.Generator().manual_seed(stable_hash(f"{e.row['where']}:{key[1]}") % 2**62)
        ids = allowed[torch.randint(len(allowed), (repeat, T), generator=gen)]  # (G, T)
        length = torch.randint(1, T + 1, (repeat, 1), generator=gen)  # (G, 1) tokens kept, EOS last
        t = torch.arange(T)
        ids = torch.where(t == length - 1, tok.eos_token_id, ids).masked_fill(t >= length, tok.pad_token_id)
        responses.append(ids)
        masks.append((t < length).long())
    prompt, prompt_mask, images = prompt_batch(examples, tok.pad_token_id)
    response, response_mask = torch.cat(responses), torch.cat(masks)  # (B·G, T)
    ids = torch.cat((prompt.repeat_interleave(repeat, 0), response), 1)
    mask = torch.cat((prompt_mask.repeat_interleave(repeat, 0), response_mask), 1)
    with torch.no_grad(), dist.gathered(self.model):
        log_probs = vlm_score(
            dist.unwrap(self.model), ids, mask, prompt.shape[1],
            {k: v.repeat_interleave(repeat, 0) for k, v in images.items()},
            temperature=sampling.temperature, banned=self.banned,
        )  # fmt: skip
    finished = (response == tok.eos_token_id).any(-1)
    rollout = Rollout(ids, mask, prompt.shape[1], response, response_mask, log_probs, finished)
    rows = [e for e in examples for _ in range(repeat)]
    inputs = {k: v.repeat_interleave(repeat, 0) for k, v in images.items()}
    return Sampled(rollout, [e.row for e in rows], decode(tok, response, rollout.response_lengths), inputs)


def sgd(model: torch.nn.Module, cfg: OptimConfig, total_steps: int) -> tuple:
    """`postrl.lm.trainer.make_optimizer` for the comparison: SGD at the constant ``cfg.lr``."""
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, momentum=0.5)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)


DOUBLES = [(VLMEngine, "sample", replayable_sample), (grpo_algorithm, "make_optimizer", sgd)]
DOUBLES += [(vlm_train, "make_optimizer", sgd)]


def _run(parallel: str) -> RunConfig:
    return RunConfig(
        steps=4, eval_every=2, save_every=2, keep_last=0, log_every=1, device="cpu", threads=1,
        parallel=parallel,
    )  # fmt: skip


OPTIM = OptimConfig(lr=0.1, max_grad_norm=None)  # no clipping: a gradient's scale shows


def sft_config(model: str, parallel: str) -> SFTConfig:
    """Batches of 5 rows in 2 micro-batches: rank 0 takes 3 rows, rank 1 two (uneven shares)."""
    return SFTConfig(
        model=model, data="task:shapes", task=SHAPES, train=TrainConfig(batch_size=5, grad_accum=2,
        max_length=128), optim=OPTIM, run=_run(parallel), eval_size=4,
    )  # fmt: skip


def grpo_config(model: str, parallel: str) -> GRPOConfig:
    """4 prompts × G = 4 per step (2 whole groups a rank), μ = 2 passes × 2 minibatches (every other row: the
    same split at 1 and 2 processes), micro-batches of 3 rows (4 = 3 + 1 a rank, 8 = 3 + 3 + 2 in one),
    token-level loss, β = 0.04, REINFORCE++ whitening over the whole step's batch."""
    grpo = GRPOLossConfig(
        group_size=4, prompts_per_step=4, epochs=2, minibatches=2, grad_accum=3, beta=0.04,
        loss_type="token", advantage="reinforce_pp",
    )  # fmt: skip
    return GRPOConfig(
        model=model, data="task:shapes", task=SHAPES, grpo=grpo, sampling=SamplingConfig(max_new_tokens=4),
        rewards=["task:shapes", "tests.lm.test_vlm_dist:length_reward"], verifier="task:shapes",
        optim=replace(OPTIM, lr=0.01),  # SGD at 0.1 blows the k3 term up by the third step
        run=_run(parallel), eval_size=4, max_prompt_length=64,
    )  # fmt: skip


# stage: (config, trainer, checkpoint file, a metric logged every step)
STAGES = {
    "sft": (sft_config, run_sft, "model", "loss"),
    "grpo": (grpo_config, run_grpo, "policy", "reward_mean"),
    "grpo-frozen": (grpo_config, partial(run_vlm_grpo, freeze_vision=True), "policy", "reward_mean"),
}
# FSDP shards a VLM only with its vision tower frozen (train.check_parallel)
PARALLEL = {"ddp": ("sft", "grpo"), "fsdp": ("grpo-frozen",)}


def straight_and_resumed(stage: str, model: str, out: Path, parallel: str = "ddp") -> None:
    """``out/straight`` (4 steps) and, under torchrun, ``out/resumed``: the same run resumed from its step-2
    checkpoint."""
    config, train, _, _ = STAGES[stage]
    cfg = config(model, parallel)
    train(cfg, out / "straight")
    if dist.world_size() == 1:
        return
    if dist.is_main():
        shutil.copytree(out / "straight", out / "resumed")
        shutil.rmtree(out / "resumed" / "checkpoints" / "step_00000004")
        shutil.rmtree(out / "resumed" / "model")
        (out / "resumed" / "summary.json").unlink()
    dist.barrier()
    train(cfg, out / "resumed", resume=True)


def main(model: str, out: str, parallel: str) -> None:
    """The torchrun side."""
    for owner, name, double in DOUBLES:
        setattr(owner, name, double)
    for stage in PARALLEL[parallel]:
        straight_and_resumed(stage, model, Path(out) / stage, parallel)
    dist.cleanup()


@pytest.fixture(scope="module")
def aligned(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("align")
    cfg = VLMPretrainConfig(
        model=TINY, task=SHAPES, tokenizer_lines=300, train=TrainConfig(batch_size=8),
        run=RunConfig(steps=3, eval_every=0, save_every=0, threads=1),
    )  # fmt: skip
    run_vlm_pretrain(cfg, out)
    return str(out / "model")


@pytest.fixture(scope="module")
def one_process(aligned: str, tmp_path_factory) -> Path:
    """The reference: every stage in this process (``one/STAGE/straight``)."""
    out = tmp_path_factory.mktemp("one")
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        for owner, name, double in DOUBLES:
            patch.setattr(owner, name, double)
        for stage in STAGES:
            straight_and_resumed(stage, aligned, out / stage)
    return out


def _checkpoint(run: Path, step: int, name: str) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / f"step_{step:08d}" / f"{name}.safetensors"))


def _rows(run: Path, key: str) -> list[float]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [row[key] for row in map(json.loads, lines) if key in row]


@pytest.mark.slow  # a torchrun launch (SFT and GRPO, straight and resumed): ~1 min on a loaded 2-core machine
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_processes_match_one(parallel: str, aligned: str, one_process: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForImageTextToText

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[2])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__]
    proc = subprocess.run(
        [*cmd, aligned, str(tmp_path / "two"), parallel], env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    start = AutoModelForImageTextToText.from_pretrained(aligned).state_dict()
    for stage in PARALLEL[parallel]:
        _, _, name, metric = STAGES[stage]
        one, two = one_process / stage / "straight", tmp_path / "two" / stage / "straight"
        for step in (2, 4):
            a, b = _checkpoint(one, step, name), _checkpoint(two, step, name)
            assert a.keys() == b.keys()
            worst = max(float((a[k] - b[k]).abs().max()) for k in a)
            print(f"vlm {stage} {parallel} step {step}: max |2 ranks - 1 process| = {worst:.2e}")
            assert worst < 1e-5, (stage, step, worst)
        assert any(not torch.equal(start[k], b[k]) for k in b)  # it trained
        assert _rows(one, metric) == pytest.approx(_rows(two, metric), rel=1e-4, abs=1e-6)
        assert _rows(one, "heldout_accuracy") == _rows(two, "heldout_accuracy")
        # the resume at 2 processes continues exactly where the straight 2-process run went
        resumed = _checkpoint(tmp_path / "two" / stage / "resumed", 4, name)
        assert all(torch.equal(b[k], resumed[k]) for k in b)
        # rank 0's export loads in one process and holds the last checkpoint's weights
        exported = AutoModelForImageTextToText.from_pretrained(two / "model").state_dict()
        assert all(torch.equal(exported[k], b[k]) for k in b)


# ---- CI-sized checks, in this process ----------------------------------------------------------------------
def test_fsdp_needs_the_vision_tower_frozen() -> None:
    with pytest.raises(UserError, match="run.parallel=fsdp is not supported"):
        check_parallel(RunConfig(parallel="fsdp"), 2, trains_vision=True)
    check_parallel(RunConfig(parallel="fsdp"), 2, trains_vision=False)  # run_vlm_grpo(freeze_vision=True)
    check_parallel(RunConfig(parallel="ddp"), 2, trains_vision=True)
    check_parallel(RunConfig(parallel="fsdp"), 1, trains_vision=True)  # no effect in one process


class ThreadRanks:
    """N ranks as threads of this process, for `postrl.runtime.distributed`'s rank, world_size,
    all_reduce_sum and all_gather_object (each rank waits for the others at a barrier), and for the
    gradient all-reduce DDP would do (`average_gradients`)."""

    def __init__(self, n: int) -> None:
        self.n, self.local, self.barrier, self.slots = n, threading.local(), threading.Barrier(n), [None] * n

    def rank(self) -> int:
        return self.local.rank

    def world_size(self) -> int:
        return self.n

    def all_gather_object(self, obj):
        self.slots[self.rank()] = obj
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        parts = self.all_gather_object(t.detach().clone())
        return sum(parts[1:], parts[0].clone())  # the same order on every rank

    def average_gradients(self, model: torch.nn.Module, max_norm) -> float:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.copy_(self.all_reduce_sum(p.grad) / self.n)
        return dist.grad_norm(model.parameters(), max_norm)

    def run(self, fn) -> list:
        results, errors = [None] * self.n, []

        def target(rank: int) -> None:
            self.local.rank = rank
            try:
                results[rank] = fn(rank)
            except BaseException as err:  # re-raised in the test's thread
                errors.append(err)
                self.barrier.abort()

        threads = [threading.Thread(target=target, args=(r,)) for r in range(self.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results


def test_shares_of_two_ranks_take_one_process_steps(monkeypatch) -> None:
    """`VLMSupervised` steps and evaluation with 2 ranks (threads, each its own copy of the model, the
    gradients averaged as DDP does) equal one process's: 11 rows in batches of 5 in 2 micro-batches, so the
    shares are uneven (3 + 2) and the epoch's last batch leaves rank 1 a row of weight 0."""
    torch.set_num_threads(1)
    task = get_task("shapes", n_train=11, n_test=6)
    model, processor = build_tiny_vlm(build_vlm_tokenizer(task.corpus_lines(200), 300), TINY, seed=0)
    rows = encode_rows(processor, task.sft_rows("train"), "sft", 128)
    evals = encode_rows(processor, task.sft_rows("test"), "sft", 128)
    run = RunConfig(steps=3, threads=1)
    monkeypatch.setattr(vlm_train, "make_optimizer", sgd)

    def train(rank: int) -> tuple[dict, list, dict]:
        def evaluate(m: torch.nn.Module) -> dict[str, float]:
            return answer_accuracy(m, processor, evals, task.reward_fn, max_new_tokens=3)

        algo = VLMSupervised(
            copy.deepcopy(model), processor, rows, evals, TrainConfig(batch_size=5, grad_accum=2), OPTIM, run,
            evaluate=evaluate,
        )  # fmt: skip
        losses = [algo.step(step)["loss"] for step in range(3)]
        return dict(algo.model.state_dict()), losses, algo.evaluate()

    one = train(0)
    ranks = ThreadRanks(2)
    for name in ("rank", "world_size", "all_reduce_sum", "all_gather_object"):
        monkeypatch.setattr(dist, name, getattr(ranks, name))
    monkeypatch.setattr(vlm_train, "clip_grad_norm", ranks.average_gradients)
    for weights, losses, evals in ranks.run(train):
        assert max(float((one[0][k] - weights[k]).abs().max()) for k in weights) < 1e-6
        assert losses == pytest.approx(one[1], rel=1e-6)
        assert evals == pytest.approx(one[2], rel=1e-6)
    assert not torch.equal(one[0]["lm_head.weight"], model.state_dict()["lm_head.weight"])  # it trained


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
