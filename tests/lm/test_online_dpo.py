"""`postrl online-dpo`: the first step's loss against `postrl.core.dpo_loss` on pairs sampled again by hand
and log-probs computed alone, that a tiny run raises the judge's preference for the policy over the
reference, exact resume, and bad input refused with one line before the run folder exists."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from postrl.cli import main
from postrl.core import dpo_loss
from postrl.lm.dpo import DPOLossConfig
from postrl.lm.judges import pairwise_probability
from postrl.lm.models import TinyLMConfig, build_tiny_lm, load_causal_lm
from postrl.lm.online_dpo import OnlineBatchConfig, OnlineDPOConfig, run_online_dpo
from postrl.lm.online_dpo.data import load_prompts
from postrl.lm.online_dpo.pairs import response_ids, step_generator
from postrl.lm.rollout import RolloutEngine, SamplingConfig
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import OptimConfig, batch_order

TASK = {"n_pairs_train": 8, "n_pairs_test": 8, "n_sft_train": 8, "n_sft_test": 8}


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def shorter_judge(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A judge spec: a reward function in TRL's contract that prefers shorter completions (−characters)."""
    path = tmp_path_factory.mktemp("judge") / "short.py"
    path.write_text("def shorter(completions, **kwargs):\n    return [-float(len(c)) for c in completions]\n")
    return f"{path}:shorter"


@pytest.fixture(scope="module")
def ref_dir(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer) -> Path:
    """A second tiny Llama (another seed) as the reference, so that h ≠ 0 from the first step."""
    path = tmp_path_factory.mktemp("online_ref")
    config = TinyLMConfig(
        n_layers=2, hidden_size=32, n_heads=4, intermediate_size=64, max_position_embeddings=128
    )
    ids = {f"{k}_id": getattr(tiny_tokenizer, f"{k}_id") for k in ("pad_token", "eos_token", "bos_token")}
    build_tiny_lm(len(tiny_tokenizer), config, seed=7, **ids).save_pretrained(str(path))
    tiny_tokenizer.save_pretrained(str(path))
    return path


def _cfg(model: Path, judge: str, **kw) -> OnlineDPOConfig:
    base = OnlineDPOConfig(
        model=str(model),
        data="task:reviews",
        task=TASK,
        judge=judge,
        train=OnlineBatchConfig(batch_size=4, max_length=64),
        optim=OptimConfig(lr=1e-3, warmup_steps=0, min_lr_ratio=1.0),
        run=RunConfig(steps=4, eval_every=2, save_every=2, keep_last=0, log_every=1, device="cpu"),
        sampling=SamplingConfig(max_new_tokens=12, temperature=1.0),
        eval_samples=4,
        eval_judge_prompts=8,
        plots=False,
    )
    return replace(base, **kw)


def _alone(model: torch.nn.Module, prompt: list[int], response: list[int]) -> float:
    """Σ log π(response | prompt) from one unpadded forward: the hand computation."""
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([prompt + response])).logits[0].double(), -1)
    return float(sum(logp[len(prompt) - 1 + t, tok] for t, tok in enumerate(response)))


@pytest.mark.parametrize("labels", ["soft", "hard"])
def test_first_step_loss_is_dpo_loss_of_the_sampled_judged_pairs(
    labels: str, tiny_lm_dir: Path, ref_dir: Path, tiny_tokenizer, shorter_judge: str, tmp_path: Path
) -> None:
    """Step 1's logged loss is dpo_loss on the step's pairs sampled again from the starting policy with the
    step's generator, labelled by the judge's σ(s₁ − s₂) (or its hard label), every log-prob computed alone."""
    cfg = _cfg(tiny_lm_dir, shorter_judge, ref_model=str(ref_dir), labels=labels, eval_samples=0)
    cfg = replace(cfg, run=replace(cfg.run, steps=1, eval_every=0), eval_judge_prompts=0, eval_at_start=False)
    run_online_dpo(cfg, tmp_path / "run")
    logged = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert logged["step"] == 1
    prompts, _, _ = load_prompts(cfg, tiny_tokenizer)
    texts = [prompts.rows[i]["prompt"] for i in batch_order(len(prompts.rows), 4, cfg.run.seed, 0)[0]]
    policy, reference = load_causal_lm(tiny_lm_dir), load_causal_lm(ref_dir)
    engine = RolloutEngine(policy, tiny_tokenizer, cfg.sampling)
    rollout = engine.generate([t for t in texts for _ in range(2)], step_generator(torch.device("cpu"), 0, 0))
    ids, words = response_ids(rollout), rollout.texts
    prompt_ids = [tiny_tokenizer(t)["input_ids"] for t in texts]
    logps = {
        name: torch.tensor(
            [[_alone(m, prompt_ids[i], ids[2 * i + k]) for k in (0, 1)] for i in range(len(texts))],
            dtype=torch.float64,
        )
        for name, m in (("policy", policy), ("reference", reference))
    }
    p = [pairwise_probability(-len(words[2 * i]), -len(words[2 * i + 1])) for i in range(len(texts))]
    if labels == "hard":
        p = [1.0 if x > 0.5 else 0.0 if x < 0.5 else 0.5 for x in p]
    pi, ref = logps["policy"], logps["reference"]
    loss, _ = dpo_loss(
        pi[:, 0], pi[:, 1], ref[:, 0], ref[:, 1], 0.1, "sigmoid", torch.tensor(p, dtype=torch.float64)
    )
    assert abs(logged["loss"] - float(loss)) < 1e-5
    assert abs(float(loss) - 0.6931) > 1e-3  # h ≠ 0 and targets ≠ ½: a real check


def test_online_dpo_raises_the_judges_preference(
    tiny_lm_dir: Path, shorter_judge: str, tmp_path: Path
) -> None:
    """From a random tiny Llama, 24 steps: the judge (shorter is better) prefers the policy's held-out samples
    to the reference's (½ at the start), and the policy's samples got shorter."""
    cfg = _cfg(
        tiny_lm_dir, shorter_judge, train=OnlineBatchConfig(batch_size=8, max_length=64),
        dpo=DPOLossConfig(beta=0.1), optim=OptimConfig(lr=1e-2, warmup_steps=0, min_lr_ratio=1.0),
        run=RunConfig(steps=24, eval_every=0, save_every=0, log_every=1, device="cpu"), eval_judge_prompts=32,
    )  # fmt: skip
    summary = run_online_dpo(cfg, tmp_path / "run")
    assert summary["heldout_judge_win_rate_start"] == pytest.approx(0.5, abs=1e-9)  # π = π_ref, same seed
    assert summary["heldout_judge_win_rate"] > 0.75
    assert summary["heldout_length"] < summary["heldout_length_start"]
    assert summary["pairs_labelled"] == 192


def test_resume_is_exact(tiny_lm_dir: Path, shorter_judge: str, tmp_path: Path) -> None:
    cfg = _cfg(tiny_lm_dir, shorter_judge)
    summary = run_online_dpo(cfg, tmp_path / "a")
    assert summary["steps"] == 4 and "heldout_kl" in summary and "heldout_judge_win_rate" in summary
    straight = load_causal_lm(tmp_path / "a" / "model")
    run_online_dpo(cfg, tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "checkpoints" / "step_00000004")
    shutil.rmtree(tmp_path / "b" / "model")
    (tmp_path / "b" / "summary.json").unlink()
    run_online_dpo(cfg, tmp_path / "b", resume=True)
    resumed = load_causal_lm(tmp_path / "b" / "model")
    for (name, p), q in zip(straight.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(p, q), name

    def strip(run: str) -> list[dict]:
        text = (tmp_path / run / "metrics.jsonl").read_text()
        return [{k: v for k, v in json.loads(x).items() if "time" not in k} for x in text.splitlines()]

    assert strip("a") == strip("b")


@pytest.mark.parametrize(
    "override, named",
    [
        ("sampling.greedy=true", "sampling.greedy"),
        ("judge=rm:/nonexistent/rm", "/nonexistent/rm"),
        ("judge=lm:/nonexistent/lm", "/nonexistent/lm"),
        ("judge=openai:http://127.0.0.1:9/v1", "cannot be reached"),
        ("train.max_length=12", "leaves no room for a prompt"),
        ("beta=0.2", "'dpo.beta'"),
        ("labels=maybe", "labels"),
    ],
)
def test_bad_input_is_one_line_and_touches_nothing(
    override: str, named: str, tiny_lm_dir: Path, tmp_path: Path, capsys
) -> None:
    if "openai" in override:
        pytest.importorskip("openai")
    out = tmp_path / "run"
    argv = ["online-dpo", "--model", str(tiny_lm_dir), "--judge", "task:reviews", "--out", str(out)]
    code = main([*argv, "run.device=cpu", "sampling.max_new_tokens=12", override])
    # transformers' own "Loading weights" bar is printed by a model load that succeeded before the error
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip() and "Loading weights" not in x]
    assert code == 2 and len(err) == 1 and err[0].startswith("postrl: error:") and named in err[0], err
    assert not out.exists()
