"""benchmarks/grpo_coupled.py: under `coupled_draws`, Hugging Face ``generate`` (TRL's sampler) draws the
completions that postrl's `generate` draws with the same seed, so the coupled runs share their samples."""

import importlib.util
from pathlib import Path

import torch
from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel

from postrl.lm.rollout import generate, left_pad

ROOT = Path(__file__).resolve().parents[1]
PAD, EOS = 0, 1


def load_coupled_module():
    spec = importlib.util.spec_from_file_location("grpo_coupled", ROOT / "benchmarks" / "grpo_coupled.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=24, n_embd=32, n_layer=1, n_head=2, n_positions=64, pad_token_id=PAD, eos_token_id=EOS,
        bos_token_id=EOS, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    return GPT2LMHeadModel(cfg).eval()


def hf_sample(
    model: GPT2LMHeadModel, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int
) -> torch.Tensor:
    """TRL's sampling call (do_sample, top_k 0, top_p 1); the new tokens, pad after EOS."""
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=True, pad_token_id=PAD, eos_token_id=[EOS], temperature=1.0,
        top_p=1.0, top_k=0,
    )  # fmt: skip
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    return out[:, ids.shape[1] :]


def test_coupled_draws_make_hf_generate_sample_postrl_s_completions():
    coupled = load_coupled_module()
    model = tiny_gpt2()
    # GRPO's layout: two prompts of one length, each repeated G = 8 times in a row
    ids, mask = left_pad([[5, 6, 7, 8]] * 8 + [[9, 3, 4, 2]] * 8, PAD)
    for seed in (0, 1, 2):
        ours = generate(
            model, ids, mask, max_new_tokens=12, eos_token_id=EOS, pad_token_id=PAD,
            generator=torch.Generator().manual_seed(seed),
        )  # fmt: skip
        with coupled.coupled_draws(seed):
            theirs = hf_sample(model, ids, mask, 12)
        assert torch.equal(theirs, ours.response_ids[:, : theirs.shape[1]])
        assert len({tuple(r) for r in theirs.tolist()}) > 4  # the draws are random, not a fixed argmax
    # outside the block HF's own multinomial is back: another stream of random numbers
    torch.manual_seed(0)
    assert not torch.equal(hf_sample(model, ids, mask, 12), theirs)


def test_paired_difference_and_the_coupled_steps():
    coupled = load_coupled_module()
    diff, se = coupled._paired([0.5, 0.3, 0.4], [0.4, 0.3, 0.2])
    assert abs(diff - 0.1) < 1e-12 and abs(se - 0.1 / 3**0.5) < 1e-12  # differences 0.1, 0, 0.2: sd 0.1
    assert coupled._coupled_steps([0.5, 0.25, 0.7], [0.5, 0.25, 0.6]) == 2
