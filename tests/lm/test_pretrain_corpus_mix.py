"""PretrainConfig.corpus_mix, .equations and .carries: the recipe is the corpus the base model was made from; a
share changes the corpus; "rounds" writes every train problem once per round with a random sign before the
result; carries=false leaves out the sums that carry; bad values are one user error before the run folder
exists."""

from __future__ import annotations

import dataclasses
import re

import pytest

from postrl.lm import base_model
from postrl.lm.pretrain import PretrainConfig, corpus_and_heldout, run_pretrain
from postrl.lm.tasks import build_corpus, get_task
from postrl.lm.tasks.corpus import RESULT_SIGNS, equation_lines, units_carry
from postrl.runtime.config import ConfigError, from_dict
from postrl.runtime.errors import UserError


def small(**changes) -> PretrainConfig:
    return dataclasses.replace(base_model.recipe(1), corpus_lines=1000, **changes)


def test_default_mix_is_the_base_models_corpus() -> None:
    cfg = small()
    arith = get_task("arithmetic", **cfg.arithmetic).config
    expected = build_corpus(1000, 1, arithmetic=arith, equations="rounds", carries=False)
    assert corpus_and_heldout(cfg)[0] == expected
    assert "corpus_mix" not in base_model.command(base_model.recipe())


def test_mix_sets_the_arithmetic_share() -> None:
    corpus, _ = corpus_and_heldout(small(corpus_mix=(0.6, 0.3, 0.1)))
    assert len(corpus) == 1000 and sum(bool(EQUATION.fullmatch(line)) for line in corpus) == 600
    corpus, _ = corpus_and_heldout(small(corpus_mix=(1, 0, 0)))
    assert all(EQUATION.fullmatch(line) for line in corpus)


def test_without_carries_the_corpus_holds_every_sum_that_does_not_carry() -> None:
    """The base model's recipe: 47+38 (7 + 8 carries) is left for SFT and RL, 41+38 is in the corpus."""
    task = get_task("arithmetic", digits=2, ops="+", n_train=400)
    lines = equation_lines(task, 1000, seed=2, equations="rounds", carries=False)
    problems = {(int(m["a"]), int(m["b"])) for m in map(EQUATION.fullmatch, lines)}
    plain = {(a, b) for a, _, b in task.problems("train") if a % 10 + b % 10 < 10}
    assert problems == plain and 0 < len(plain) < 400
    assert not any(units_carry(a, "+", b) for a, b in problems)
    assert units_carry(47, "+", 38) and not units_carry(41, "+", 38) and not units_carry(47, "-", 38)
    assert "carries=false" in base_model.command(base_model.recipe())
    drawn = equation_lines(task, 500, seed=2, carries=False)  # draws too
    assert all(a % 10 + b % 10 < 10 for a, b in (map(int, re.split(r"[+=]", x)[:2]) for x in drawn))


def test_bad_mix_is_a_user_error_before_the_run_folder(tmp_path) -> None:
    with pytest.raises(ConfigError, match="corpus_mix"):
        from_dict(PretrainConfig, {"corpus_mix": [-0.1, 0.5, 0.6]})
    for mix in ((0, 0, 0), (0.5, 0.5)):
        with pytest.raises(UserError, match="corpus_mix"):
            run_pretrain(small(corpus_mix=mix), tmp_path / "run")
    assert not (tmp_path / "run").exists()


EQUATION = re.compile(r"(?P<a>\d+)\+(?P<b>\d+)(?P<sign>[=:;]) (?P<sum>\d+)")


def test_rounds_write_every_train_problem_once_per_round_with_every_sign() -> None:
    task = get_task("arithmetic", digits=2, ops="+", n_train=300)
    lines = equation_lines(task, 750, seed=3, equations="rounds")
    matches = [EQUATION.fullmatch(line) for line in lines]
    assert len(lines) == 750 and all(matches)
    assert all(int(m["a"]) + int(m["b"]) == int(m["sum"]) for m in matches)
    problems = [(int(m["a"]), "+", int(m["b"])) for m in matches]
    train = sorted(task.problems("train"))
    # two whole rounds, each every train problem once in its own order, then half a round without repeats
    first, second = problems[:300], problems[300:600]
    assert sorted(first) == train == sorted(second) and first != second
    assert len(set(problems[600:])) == 150
    signs = [m["sign"] for m in matches]
    assert all(signs.count(sign) > 200 for sign in RESULT_SIGNS)
    assert lines == equation_lines(task, 750, seed=3, equations="rounds")
    assert lines != equation_lines(task, 750, seed=4, equations="rounds")
    drawn = equation_lines(task, 750, seed=3)  # the default, "draws": repeats, "=" right before the result
    assert all(re.fullmatch(r"\d+\+\d+=\d+", line) for line in drawn) and len(set(drawn)) < 300


def test_rounds_is_a_pretrain_option_that_keeps_held_out_problems_out() -> None:
    cfg = small(carries=True)
    corpus, _ = corpus_and_heldout(cfg)
    equations = [m for m in map(EQUATION.fullmatch, corpus) if m]
    assert len(equations) == 400 and corpus != corpus_and_heldout(small(equations="draws"))[0]
    held_out = {(a, b) for a, _, b in get_task("arithmetic", **cfg.arithmetic).problems("test")}
    assert not any((int(m["a"]), int(m["b"])) in held_out for m in equations)
    assert "equations=rounds" in base_model.command(cfg)


def test_bad_equations_is_a_user_error_before_the_run_folder(tmp_path) -> None:
    with pytest.raises(ConfigError, match="equations"):
        from_dict(PretrainConfig, {"equations": "shuffled"})
    with pytest.raises(ConfigError, match="'equations': 'shuffled' is not one of 'draws', 'rounds'"):
        run_pretrain(small(equations="shuffled"), tmp_path / "run")  # built in Python: validate() checks it
    with pytest.raises(ValueError, match="equations must be one of draws, rounds"):
        equation_lines(get_task("arithmetic"), 3, equations="shuffled")
    assert not (tmp_path / "run").exists()
