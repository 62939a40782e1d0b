"""Vision-language models: the built-in tiny LLaVA round-trips through the Auto classes; sampling runs the
vision encoder once per prompt, never draws an image placeholder, and records the teacher-forced log-probs."""

from __future__ import annotations

import json
import struct
import zlib

import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

from postrl.lm.data import DataError
from postrl.lm.sft import SFTConfig
from postrl.lm.tasks import get_task
from postrl.lm.trainer import TrainConfig
from postrl.lm.vlm import (
    TinyVLMConfig,
    build_tiny_vlm,
    build_vlm_tokenizer,
    encode_rows,
    image_token_id,
    is_vlm,
    load_vlm,
    load_vlm_rows,
    prompt_batch,
    save_vlm,
    sft_batch,
    vlm_generate,
    vlm_score,
)
from postrl.lm.vlm.rollout import shared_rows
from postrl.lm.vlm.train import sft_data

TINY = TinyVLMConfig(vision_hidden_size=32, hidden_size=64, intermediate_size=128, vocab_size=300)


@pytest.fixture(scope="module")
def task():
    return get_task("shapes", n_train=200, n_test=40)


@pytest.fixture(scope="module")
def vlm(task):
    tokenizer = build_vlm_tokenizer(task.corpus_lines(500), vocab_size=TINY.vocab_size)
    model, processor = build_tiny_vlm(tokenizer, TINY, seed=0)
    return model.eval(), processor


@pytest.fixture(scope="module")
def saved(vlm, tmp_path_factory):
    return save_vlm(*vlm, tmp_path_factory.mktemp("vlm") / "model")


def test_saved_model_loads_with_the_auto_classes(vlm, saved, task) -> None:
    model, processor = vlm
    assert is_vlm(saved) and not is_vlm(saved / "nothing")
    loaded = AutoModelForImageTextToText.from_pretrained(saved)
    auto_processor = AutoProcessor.from_pretrained(saved)
    rows = task.prompt_rows("test")[:3]
    texts = [auto_processor.apply_chat_template(r["prompt"], add_generation_prompt=True) for r in rows]
    assert texts[0].startswith("<|user|><image>") and texts[0].endswith("<|assistant|>")
    inputs = auto_processor(
        text=texts, images=[r["images"][0] for r in rows], return_tensors="pt", padding=True
    )
    n_image = int((inputs["input_ids"] == image_token_id(loaded, auto_processor)).sum(-1)[0])
    assert n_image == (TINY.image_size // TINY.patch_size) ** 2 + 1
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).logits, model(**inputs).logits)
    again, _ = load_vlm(saved)  # postrl's loader: the same weights, dropout off
    assert all(
        torch.equal(a, b)
        for a, b in zip(again.state_dict().values(), model.state_dict().values(), strict=True)
    )


def _prompts(vlm, task, n):
    model, processor = vlm
    examples = encode_rows(processor, task.prompt_rows("test")[:n], "prompts", 256)
    return prompt_batch(examples, processor.tokenizer.pad_token_id)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_log_probs_equal_teacher_forced(vlm, task, temperature) -> None:
    model, processor = vlm
    tok = processor.tokenizer
    ids, mask, images = _prompts(vlm, task, 6)
    banned = [image_token_id(model, processor)]
    gen = torch.Generator().manual_seed(0)
    rollout = vlm_generate(
        model, ids, mask, images, max_new_tokens=6, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        banned=banned, repeat=3, temperature=temperature, generator=gen,
    )  # fmt: skip
    assert rollout.input_ids.shape[0] == 18 and rollout.response_mask.sum() > 18
    pixels = images["pixel_values"].repeat_interleave(3, 0)
    with torch.no_grad():
        forced = vlm_score(
            model, rollout.input_ids, rollout.attention_mask, rollout.prompt_len, {"pixel_values": pixels},
            temperature=temperature, banned=banned,
        )  # fmt: skip
    torch.testing.assert_close(forced, rollout.log_probs, atol=1e-5, rtol=1e-5)
    # a random model puts mass on the placeholder: it is banned, so never sampled
    assert not bool((rollout.response_ids == banned[0]).any())


def test_vision_encoder_runs_once_per_prompt(vlm, task) -> None:
    model, processor = vlm
    tok = processor.tokenizer
    calls = []
    handle = model.model.vision_tower.register_forward_hook(lambda m, i, o: calls.append(i[0].shape[0]))
    try:
        ids, mask, images = _prompts(vlm, task, 4)
        rollout = vlm_generate(
            model, ids, mask, images, max_new_tokens=5, eos_token_id=-1, pad_token_id=tok.pad_token_id,
            repeat=4, generator=torch.Generator().manual_seed(1),
        )  # fmt: skip
    finally:
        handle.remove()
    # eos -1: never stops, so 5 decode steps follow the prefill; one vision pass over the 4 distinct pictures
    assert rollout.response_ids.shape == (16, 5) and calls == [4]


def test_greedy_depends_on_the_picture(vlm, task) -> None:
    # the same question with two pictures: different logits (the picture reaches the language model)
    model, processor = vlm
    rows = [r for r in task.prompt_rows("test") if r["kind"] == "count"][:2]
    examples = encode_rows(processor, rows, "prompts", 256)
    assert examples[0].prompt_ids == examples[1].prompt_ids
    ids, mask, images = prompt_batch(examples, processor.tokenizer.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, **images).logits[:, -1]
    assert not torch.allclose(logits[0], logits[1])


def test_shared_prompt_scoring_equals_the_plain_forward(vlm, task) -> None:
    # 4 prompts × 3 answers; two prompts have the same text with different pictures (not one prompt)
    model, processor = vlm
    tok = processor.tokenizer
    count = [r for r in task.prompt_rows("test") if r["kind"] == "count"][:2]
    other = [r for r in task.prompt_rows("test") if r["kind"] != "count"][:2]
    examples = encode_rows(processor, count + other, "prompts", 256)
    ids, mask, images = prompt_batch(examples, tok.pad_token_id)
    pixels = images["pixel_values"]
    banned = [image_token_id(model, processor)]
    rollout = vlm_generate(
        model, ids, mask, {"pixel_values": pixels}, max_new_tokens=5, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, banned=banned, repeat=3, generator=torch.Generator().manual_seed(2),
    )  # fmt: skip
    rows = {"pixel_values": pixels.repeat_interleave(3, 0)}
    args = (rollout.input_ids, rollout.attention_mask, rollout.prompt_len)
    groups = shared_rows(*args, rows)
    assert groups is not None and sorted(groups[0].tolist()) == [0, 3, 6, 9]
    assert torch.equal(groups[1], groups[1][::3].repeat_interleave(3))
    # rolled: rows 0, 3, 6, 9 get the previous row's picture; row 3 then asks row 1's question (the same
    # count text) about row 1's picture: one prompt with rows 1, 2; the other three stand alone
    moved = shared_rows(*args, {"pixel_values": rows["pixel_values"].roll(1, 0)})
    assert len(set(moved[1].tolist())) == 7 and moved[1][3] == moved[1][1] != moved[1][0]
    weights = torch.randn(rollout.response_mask.shape, generator=torch.Generator().manual_seed(3))
    params = [p for p in model.parameters() if p.requires_grad]
    calls: list[int] = []
    handle = model.model.vision_tower.register_forward_hook(lambda m, i, o: calls.append(i[0].shape[0]))
    try:
        results = []
        for share in (False, True):
            calls.clear()
            log_probs = vlm_score(model, *args, rows, banned=banned, share=share)
            grads = torch.autograd.grad((log_probs * weights).sum(), params, allow_unused=True)
            grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]
            results.append((log_probs, grads, list(calls)))
    finally:
        handle.remove()
    (plain, plain_grads, plain_calls), (shared, shared_grads, shared_calls) = results
    assert plain_calls == [12] and shared_calls == [4]  # the vision encoder once per distinct prompt
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared, rollout.log_probs, atol=1e-5, rtol=1e-5)
    for a, b in zip(shared_grads, plain_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert any(float(g.abs().sum()) > 0 for g in shared_grads[:10])  # the vision tower gets its gradient too


def test_sft_batch_keeps_placeholders_out_of_the_completion(vlm, task) -> None:
    model, processor = vlm
    examples = encode_rows(processor, task.sft_rows("train")[:5], "sft", 256)
    batch = sft_batch(examples, processor.tokenizer.pad_token_id)
    P = batch["prompt_len"]
    image = image_token_id(model, processor)
    assert bool((batch["input_ids"][:, :P] == image).any()) and not bool(
        (batch["input_ids"][:, P:] == image).any()
    )
    assert batch["attention_mask"][:, P:].sum(-1).tolist() == [len(e.completion_ids) for e in examples]
    bad = {**task.sft_rows("train")[0], "completion": "<image>"}
    with pytest.raises(DataError, match="image token"):
        encode_rows(processor, [bad], "sft", 256)


def test_rows_longer_than_the_limit_are_dropped_or_refused_never_truncated(vlm, task) -> None:
    _, processor = vlm
    rows = task.sft_rows("train")[:6]
    lengths = [len(e.prompt_ids) + len(e.completion_ids) for e in encode_rows(processor, rows, "sft", 10**4)]
    limit = sorted(lengths)[2]  # the three shortest rows fit (ties keep more)
    kept = encode_rows(processor, rows, "sft", limit, overlong="drop")
    assert len(kept) == sum(n <= limit for n in lengths) >= 3
    assert [len(e.prompt_ids) + len(e.completion_ids) for e in kept] == [n for n in lengths if n <= limit]
    with pytest.raises(DataError, match=f"exceed the length limit {limit}"):
        encode_rows(processor, rows, "sft", limit)
    with pytest.raises(DataError, match="overlong=truncate .* would cut a picture's placeholders"):
        encode_rows(processor, rows, "sft", limit, overlong="truncate")
    with pytest.raises(DataError, match="all 6 rows exceed the length limit 3"):
        encode_rows(processor, rows, "sft", 3, overlong="drop")


def test_sft_rows_are_held_to_the_models_positions(vlm, task) -> None:
    _, processor = vlm
    cfg = SFTConfig(model="vlm", data="task:shapes", task={"n_train": 200, "n_test": 40},
                    train=TrainConfig(max_length=10**4))  # fmt: skip
    every, _, _ = sft_data(cfg, processor, {"max_position_embeddings": 10**4})
    lengths = [len(e.prompt_ids) + len(e.completion_ids) for e in every]
    positions = sorted(lengths)[len(lengths) // 2]  # about half the rows fit
    train, _, _ = sft_data(cfg, processor, {"max_position_embeddings": positions})
    assert [len(e.prompt_ids) + len(e.completion_ids) for e in train] == [
        n for n in lengths if n <= positions
    ]
    assert len(train) < len(every)


def test_trl_jsonl_with_image_paths(vlm, task, tmp_path) -> None:
    _, processor = vlm
    path = task.export(tmp_path, "sft", "test", limit=4)
    rows = load_vlm_rows(str(path))
    from_file = encode_rows(processor, rows, "sft", 256)
    in_memory = encode_rows(processor, task.sft_rows("test")[:4], "sft", 256)
    assert [e.prompt_ids for e in from_file] == [e.prompt_ids for e in in_memory]
    assert torch.equal(from_file[0].pixel_values, in_memory[0].pixel_values)
    record = json.loads(path.read_text().splitlines()[0])
    (tmp_path / "bad.jsonl").write_text(json.dumps({**record, "images": ["missing.png"]}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:1: field 'images': no such file"):
        encode_rows(processor, load_vlm_rows(str(tmp_path / "bad.jsonl")), "sft", 256)
    (tmp_path / "none.jsonl").write_text(json.dumps({"prompt": "hi", "completion": "3"}) + "\n")
    with pytest.raises(DataError, match=r"none.jsonl:1: no 'images'"):
        encode_rows(processor, load_vlm_rows(str(tmp_path / "none.jsonl")), "sft", 256)


def _png_claiming(path, width: int, height: int) -> None:
    """A 1×1 PNG whose header (IHDR, CRC fixed) claims ``width`` × ``height`` pixels."""
    Image.new("RGB", (1, 1)).save(path)
    data = bytearray(path.read_bytes())
    start = data.index(b"IHDR")  # length (4) | type (4) | width, height (4 + 4) | ... | crc (4)
    data[start + 4 : start + 12] = struct.pack(">II", width, height)
    data[start + 17 : start + 21] = struct.pack(">I", zlib.crc32(bytes(data[start : start + 17])))
    path.write_bytes(bytes(data))


def test_bad_pictures_and_placeholders_name_the_row_and_field(vlm, task, tmp_path) -> None:
    """Issue #41 item 5: each was a traceback (transformers' ValueError, Pillow's DecompressionBombError)."""
    _, processor = vlm
    path = task.export(tmp_path, "sft", "test", limit=2)
    record = json.loads(path.read_text().splitlines()[0])
    one = record["images"][:1]
    rows = {
        "two_slots.jsonl": {"prompt": "<image><image>How many dots?", "completion": "3", "images": one},
        "bomb.jsonl": {**record, "images": ["bomb.png"]},
    }
    _png_claiming(tmp_path / "bomb.png", 20000, 20000)
    for name, row in rows.items():
        (tmp_path / name).write_text(json.dumps(record) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(
        DataError, match=r"two_slots.jsonl:2: field 'prompt': 2 <image> placeholders for 1 pic"
    ):
        encode_rows(processor, load_vlm_rows(str(tmp_path / "two_slots.jsonl")), "sft", 256)
    with pytest.raises(DataError, match=r"bomb.jsonl:2: field 'images': the picture is larger than Pillow's"):
        encode_rows(processor, load_vlm_rows(str(tmp_path / "bomb.jsonl")), "sft", 256)
    kept = {"prompt": "<image>How many dots?", "completion": "3", "images": one}
    (tmp_path / "one_slot.jsonl").write_text(json.dumps(kept) + "\n")
    example = encode_rows(processor, load_vlm_rows(str(tmp_path / "one_slot.jsonl")), "sft", 256)[0]
    image = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    assert example.prompt_ids.count(image) == (TINY.image_size // TINY.patch_size) ** 2 + 1
