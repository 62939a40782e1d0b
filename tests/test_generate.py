"""`postrl generate --chat / --system` on the tiny model: prompts go through the tokenizer's chat template
as the trainers render conversational data, and a tokenizer without one is refused naming the flag."""

from __future__ import annotations

import pytest

from postrl.cli import main
from postrl.lm.evaluation import complete
from postrl.lm.models import load_causal_lm
from postrl.lm.tokenizer import load_tokenizer
from tests.lm.conftest import tiny_corpus, tiny_lm_dir, tiny_tokenizer, tiny_tokenizer_dir  # noqa: F401

PROMPTS = ["What is 2+3?", "Review: the tea"]


def _generate(capsys, *args: str) -> tuple[int, list[str], str]:
    code = main(["generate", *args, "--max-new-tokens", "4"])
    out = capsys.readouterr()
    return code, out.out.splitlines(), out.err


def _expected(model_dir, rendered: list[str]) -> list[str]:
    """An independent run: the rendered prompts, completed greedily by the same model."""
    model, tokenizer = load_causal_lm(model_dir), load_tokenizer(model_dir)
    return [
        p + t for p, t in zip(rendered, complete(model, tokenizer, rendered, max_new_tokens=4), strict=True)
    ]


@pytest.mark.parametrize("system", [None, "Answer with a number."])
def test_chat_renders_each_prompt_as_a_user_turn(tiny_lm_dir, capsys, system):  # noqa: F811
    tokenizer = load_tokenizer(tiny_lm_dir)
    turns = [{"role": "system", "content": system}] if system else []
    rendered = [
        tokenizer.apply_chat_template(
            [*turns, {"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
        )
        for p in PROMPTS
    ]
    head = "<|system|>Answer with a number.<|user|>" if system else "<|user|>"
    assert rendered[0] == head + "What is 2+3?<|assistant|>"
    flags = ["--chat"] if system is None else ["--system", system]  # --system alone implies --chat
    code, lines, err = _generate(
        capsys, "--model", str(tiny_lm_dir), *flags, *(a for p in PROMPTS for a in ("--prompt", p))
    )
    assert code == 0, err
    assert lines == _expected(tiny_lm_dir, rendered)


def test_without_chat_the_prompt_is_plain_text(tiny_lm_dir, capsys):  # noqa: F811
    code, lines, err = _generate(capsys, "--model", str(tiny_lm_dir), "--prompt", PROMPTS[0])
    assert code == 0, err
    assert lines == _expected(tiny_lm_dir, PROMPTS[:1])


@pytest.mark.parametrize(
    ("flags", "named"), [(["--chat"], "--chat"), (["--system", "Be brief."], "--system")]
)
def test_a_tokenizer_without_a_chat_template_is_refused_naming_the_flag(
    tiny_lm_dir,  # noqa: F811
    tmp_path,
    capsys,
    flags,
    named,
):
    tokenizer = load_tokenizer(tiny_lm_dir)
    tokenizer.chat_template = None
    tokenizer.save_pretrained(str(tmp_path / "plain"))
    args = ["--model", str(tiny_lm_dir), "--tokenizer", str(tmp_path / "plain"), "--prompt", "hi", *flags]
    code, lines, err = _generate(capsys, *args)
    assert code == 2 and lines == []
    assert f"postrl generate {named}: the tokenizer has no chat template" in err and "Traceback" not in err
