"""PretrainConfig.corpus_mix: the default is the corpus the base model was made from; a share changes the
corpus; bad shares are one user error before the run folder exists."""

from __future__ import annotations

import dataclasses

import pytest

from postrl.lm import base_model
from postrl.lm.pretrain import PretrainConfig, corpus_and_heldout, run_pretrain
from postrl.lm.tasks import build_corpus, get_task
from postrl.runtime.config import ConfigError, from_dict
from postrl.runtime.errors import UserError


def small(**changes) -> PretrainConfig:
    return dataclasses.replace(base_model.recipe(1), corpus_lines=1000, **changes)


def test_default_mix_is_the_base_models_corpus() -> None:
    cfg = small()
    arith = get_task("arithmetic", **cfg.arithmetic).config
    assert corpus_and_heldout(cfg)[0] == build_corpus(1000, 1, arithmetic=arith)
    assert "corpus_mix" not in base_model.command(base_model.recipe())


def test_mix_sets_the_arithmetic_share() -> None:
    corpus, _ = corpus_and_heldout(small(corpus_mix=(0.6, 0.3, 0.1)))
    assert len(corpus) == 1000 and sum("=" in line for line in corpus) == 600
    corpus, _ = corpus_and_heldout(small(corpus_mix=(1, 0, 0)))
    assert all("=" in line for line in corpus)


def test_bad_mix_is_a_user_error_before_the_run_folder(tmp_path) -> None:
    with pytest.raises(ConfigError, match="corpus_mix"):
        from_dict(PretrainConfig, {"corpus_mix": [-0.1, 0.5, 0.6]})
    for mix in ((0, 0, 0), (0.5, 0.5)):
        with pytest.raises(UserError, match="corpus_mix"):
            run_pretrain(small(corpus_mix=mix), tmp_path / "run")
    assert not (tmp_path / "run").exists()
