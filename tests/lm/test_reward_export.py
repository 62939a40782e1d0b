"""Reward models and critics in the ecosystem's format (issue #41 item 13): an exported `ScalarHeadModel` is a
one-label ``*ForSequenceClassification`` folder that ``AutoModelForSequenceClassification`` loads with its
trained head (no missing key) and that scores as postrl does, with left or right padding; such a folder written
by someone else (TRL's ``RewardTrainer`` saves exactly this) reads back as a reward model; postrl's older format
(backbone + ``value_head.safetensors``) still reads, and a critic's head bias is kept exactly."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification, LlamaConfig, LlamaForSequenceClassification

from postrl.lm.models import HEAD_WEIGHTS, ScalarHeadModel, save_head
from postrl.lm.ppo import run_ppo
from postrl.lm.ppo.advantages import RewardConfig
from postrl.lm.reward_model.evaluation import NORM_FILE, export_reward_model, read_reward_norm
from postrl.runtime.errors import UserError
from tests.lm.test_ppo import _cfg

TEXTS = ["Review: the tea was warm and very fresh .", "Review: ok .", "Review: the soup at the cafe was cold"]


def _batch(tokenizer, side: str) -> dict[str, torch.Tensor]:
    batch = tokenizer(TEXTS, padding=True, padding_side=side, return_tensors="pt")
    assert (batch["attention_mask"] == 0).any()  # the rows differ in length: there is padding to get right
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


def _postrl_scores(model: ScalarHeadModel, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model.eval().score(batch["input_ids"], batch["attention_mask"])


def _hf_scores(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():  # as a TRL or transformers user calls it: ids and mask, nothing of postrl's
        return model.eval()(**batch).logits.squeeze(-1)


def test_an_exported_reward_model_loads_in_auto_sequence_classification_with_the_same_scores(
    tiny_lm, tiny_tokenizer, tmp_path: Path
) -> None:
    rm = ScalarHeadModel.from_causal_lm(copy.deepcopy(tiny_lm), seed=3)
    norm = {"mean": 0.25, "std": 2.0, "n": 8}
    export_reward_model(rm, tiny_tokenizer, tmp_path / "rm", norm)
    hf, info = AutoModelForSequenceClassification.from_pretrained(
        str(tmp_path / "rm"), output_loading_info=True
    )
    assert type(hf).__name__ == "LlamaForSequenceClassification" and hf.config.num_labels == 1
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert read_reward_norm(tmp_path / "rm") == norm  # postrl's normalisation stays beside it
    again = ScalarHeadModel.from_pretrained(tmp_path / "rm")
    for side in ("left", "right"):
        batch = _batch(tiny_tokenizer, side)
        expected = _postrl_scores(rm, batch)
        torch.testing.assert_close(_hf_scores(hf, batch), expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(_postrl_scores(again, batch), expected, rtol=0, atol=1e-5)


def test_a_sequence_classifier_saved_by_another_library_reads_as_a_reward_model(
    tiny_tokenizer, tmp_path: Path
) -> None:
    config = LlamaConfig(
        vocab_size=len(tiny_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=128, num_labels=1, pad_token_id=tiny_tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    trl_rm = LlamaForSequenceClassification(config)
    trl_rm.save_pretrained(str(tmp_path / "trl_rm"))  # what TRL's RewardTrainer writes
    tiny_tokenizer.save_pretrained(str(tmp_path / "trl_rm"))
    rm = ScalarHeadModel.from_pretrained(tmp_path / "trl_rm", what="reward_model")
    for side in ("left", "right"):
        batch = _batch(tiny_tokenizer, side)
        torch.testing.assert_close(_postrl_scores(rm, batch), _hf_scores(trl_rm, batch), rtol=0, atol=1e-5)


def test_a_critics_bias_is_kept_exactly_and_the_older_format_still_reads(
    tiny_lm, tiny_tokenizer, tmp_path: Path
) -> None:
    critic = ScalarHeadModel.from_causal_lm(copy.deepcopy(tiny_lm), seed=5)
    with torch.no_grad():
        critic.head.bias.fill_(0.75)  # a value head's bias moves in training
    critic.save_pretrained(tmp_path / "critic", kind="value", pad_token_id=tiny_tokenizer.pad_token_id)
    assert json.loads((tmp_path / "critic" / "value_head.json").read_text())["kind"] == "value"
    hf = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "critic"))
    batch = _batch(tiny_tokenizer, "right")
    expected = _postrl_scores(critic, batch)
    torch.testing.assert_close(
        _postrl_scores(ScalarHeadModel.from_pretrained(tmp_path / "critic"), batch), expected
    )
    torch.testing.assert_close(_hf_scores(hf, batch), expected - 0.75, rtol=0, atol=1e-5)  # all but the bias
    # postrl's older format: the backbone as a plain model, the head in its own files
    critic.backbone.save_pretrained(str(tmp_path / "old"))
    save_head(critic.head, tmp_path / "old", "value")
    assert (tmp_path / "old" / HEAD_WEIGHTS).is_file() and not (tmp_path / "old" / NORM_FILE).exists()
    torch.testing.assert_close(
        _postrl_scores(ScalarHeadModel.from_pretrained(tmp_path / "old"), batch), expected
    )


def test_a_sequence_classifier_with_several_labels_is_not_a_reward_model(
    tiny_tokenizer, tmp_path: Path
) -> None:
    config = LlamaConfig(
        vocab_size=len(tiny_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, max_position_embeddings=128, num_labels=3,
    )  # fmt: skip
    LlamaForSequenceClassification(config).save_pretrained(str(tmp_path / "clf"))
    with pytest.raises(UserError, match=r"reward_model '.*clf': .*3 score outputs.*num_labels=1"):
        ScalarHeadModel.from_pretrained(tmp_path / "clf", what="reward_model")


def test_ppo_takes_another_librarys_reward_model_and_exports_its_critic_in_that_format(
    tiny_lm_dir: Path, tiny_tokenizer, tmp_path: Path
) -> None:
    config = LlamaConfig(
        vocab_size=len(tiny_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, max_position_embeddings=128, num_labels=1, pad_token_id=tiny_tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForSequenceClassification(config).save_pretrained(str(tmp_path / "trl_rm"))
    tiny_tokenizer.save_pretrained(str(tmp_path / "trl_rm"))
    cfg = _cfg(
        tiny_lm_dir, tmp_path / "trl_rm", reward=RewardConfig(normalize="batch")
    )  # no reward_norm.json
    run_ppo(cfg, tmp_path / "run")  # critic = reward_model: the critic starts from TRL's model
    critic, info = AutoModelForSequenceClassification.from_pretrained(
        str(tmp_path / "run" / "critic"), output_loading_info=True
    )
    assert not info["missing_keys"] and critic.config.pad_token_id == tiny_tokenizer.pad_token_id
    batch = _batch(tiny_tokenizer, "right")
    values = _postrl_scores(ScalarHeadModel.from_pretrained(tmp_path / "run" / "critic"), batch)
    bias = float(ScalarHeadModel.from_pretrained(tmp_path / "run" / "critic").head.bias)
    torch.testing.assert_close(_hf_scores(critic, batch), values - bias, rtol=0, atol=1e-5)
