"""Issue #41 item 15: every image-text-to-text architecture transformers builds offline gets all its processor
outputs (LLaVA-Next's ``image_sizes``, Mllama's ``aspect_ratio_ids``, ``aspect_ratio_mask`` and per-token
``cross_attention_mask``, Gemma 3's and PaliGemma's ``token_type_ids``, Idefics3's ``pixel_attention_mask``):
postrl's teacher-forced log-probs equal a plain forward on the processor's own outputs for prompt and
completion, sampled log-probs equal the teacher-forced ones, and `postrl sft` and `postrl grpo` run a step.

Each model is a tiny random-init one built from its transformers config class, with a processor made
locally (the postrl BPE tokenizer with the architecture's special tokens, a PIL image processor)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers as tf

from postrl.lm.grpo import GRPOConfig, run_grpo
from postrl.lm.grpo.config import GRPOLossConfig
from postrl.lm.rollout import SamplingConfig
from postrl.lm.sft import SFTConfig, run_sft
from postrl.lm.spine import RunConfig
from postrl.lm.tasks import get_task
from postrl.lm.trainer import OptimConfig, TrainConfig
from postrl.lm.vlm import encode_rows, prompt_batch, sft_batch, vlm_generate, vlm_score
from postrl.lm.vlm.model import VLM_CHAT_TEMPLATE, build_vlm_tokenizer

SHAPES = {"n_train": 16, "n_test": 8}
NORM = {"image_mean": [0.5] * 3, "image_std": [0.5] * 3}
GEMMA3_TOKENS = {
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
    "image_token": "<image_soft_token>",
}
IDEFICS3_TOKENS = ["<fake_token_around_image>", "<global-img>", "<end_of_utterance>"] + [
    f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)
]


def _tokenizer(extra=()):
    tok = build_vlm_tokenizer(get_task("shapes", **SHAPES).corpus_lines(200), vocab_size=300)
    if extra:
        tok.add_tokens(list(extra), special_tokens=True)
    return tok


def _llama(tok) -> dict:
    return dict(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=512, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
    )  # fmt: skip


def _gemma(tok) -> dict:
    return _llama(tok) | {"head_dim": 8, "initializer_range": 0.2}  # sharp attention: masks show


def llava_next():
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

    tok, grid = _tokenizer(), [[16, 32], [32, 16]]
    images = LlavaNextImageProcessorPil(
        size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16}, image_grid_pinpoints=grid, **NORM
    )
    processor = tf.LlavaNextProcessor(
        image_processor=images, tokenizer=tok, patch_size=8, vision_feature_select_strategy="default",
        num_additional_image_tokens=1, chat_template=VLM_CHAT_TEMPLATE,
    )  # fmt: skip
    vision = tf.CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        image_size=16,
        patch_size=8,
    )
    config = tf.LlavaNextConfig(
        vision_config=vision, text_config=tf.LlamaConfig(**_llama(tok)), image_grid_pinpoints=grid,
        image_token_id=tok.convert_tokens_to_ids("<image>"), vision_feature_select_strategy="default",
    )  # fmt: skip
    return tf.LlavaNextForConditionalGeneration(config), processor


def mllama():
    from transformers.models.mllama.image_processing_pil_mllama import MllamaImageProcessorPil

    tok = _tokenizer(["<|image|>", "<|python_tag|>"])
    images = MllamaImageProcessorPil(size={"height": 16, "width": 16}, max_image_tiles=2, **NORM)
    template = VLM_CHAT_TEMPLATE.replace("<image>", "<|image|>")
    processor = tf.MllamaProcessor(image_processor=images, tokenizer=tok, chat_template=template)
    vision = tf.MllamaVisionConfig(
        hidden_size=32, num_hidden_layers=2, num_global_layers=1, attention_heads=4, intermediate_size=64,
        vision_output_dim=64, image_size=16, patch_size=8, max_num_tiles=2, intermediate_layers_indices=[0],
        supported_aspect_ratios=[[1, 1], [1, 2], [2, 1]],
    )  # fmt: skip
    text = tf.MllamaTextConfig(**_llama(tok), cross_attention_layers=[1])
    config = tf.MllamaConfig(
        vision_config=vision, text_config=text, image_token_index=processor.image_token_id
    )
    return tf.MllamaForConditionalGeneration(config), processor


def gemma3():
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    tok = _tokenizer(GEMMA3_TOKENS.values())
    for name, token in GEMMA3_TOKENS.items():  # what a saved tokenizer_config's extra_special_tokens gives
        setattr(tok, name, token)
        setattr(tok, f"{name}_id", tok.convert_tokens_to_ids(token))
    images = Gemma3ImageProcessorPil(size={"height": 16, "width": 16}, **NORM)
    template = VLM_CHAT_TEMPLATE.replace("<image>", GEMMA3_TOKENS["boi_token"])
    processor = tf.Gemma3Processor(
        image_processor=images, tokenizer=tok, image_seq_length=16, chat_template=template
    )
    vision = tf.SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        image_size=16,
        patch_size=4,
    )
    text = tf.Gemma3TextConfig(**_gemma(tok), sliding_window=16)
    ids = {f"{k.split('_')[0]}_token_index": tok.convert_tokens_to_ids(v) for k, v in GEMMA3_TOKENS.items()}
    config = tf.Gemma3Config(vision_config=vision, text_config=text, mm_tokens_per_image=16, **ids)
    return tf.Gemma3ForConditionalGeneration(config), processor


def paligemma():
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    tok = _tokenizer()
    images = SiglipImageProcessorPil(size={"height": 16, "width": 16}, **NORM)
    images.image_seq_length = 16
    processor = tf.PaliGemmaProcessor(image_processor=images, tokenizer=tok, chat_template=VLM_CHAT_TEMPLATE)
    vision = tf.SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, image_size=16,
        patch_size=4, projection_dim=32,
    )  # fmt: skip
    config = tf.PaliGemmaConfig(
        vision_config=vision, text_config=tf.GemmaConfig(**_gemma(tok)), projection_dim=32,
        image_token_index=tok.convert_tokens_to_ids("<image>"),
    )  # fmt: skip
    return tf.PaliGemmaForConditionalGeneration(config), processor


def idefics3():
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tok = _tokenizer(IDEFICS3_TOKENS)
    images = Idefics3ImageProcessorPil(size={"longest_edge": 32}, max_image_size={"longest_edge": 16}, **NORM)
    processor = tf.Idefics3Processor(
        image_processor=images, tokenizer=tok, image_seq_len=4, chat_template=VLM_CHAT_TEMPLATE
    )
    vision = tf.Idefics3VisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        image_size=16,
        patch_size=4,
    )
    config = tf.Idefics3Config(
        vision_config=vision, text_config=tf.LlamaConfig(**_llama(tok)), scale_factor=2,
        image_token_id=tok.convert_tokens_to_ids("<image>"),
    )  # fmt: skip
    return tf.Idefics3ForConditionalGeneration(config), processor


ARCHS = {f.__name__: f for f in (llava_next, mllama, gemma3, paligemma, idefics3)}


def build(arch: str):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, processor = ARCHS[arch]()
    return model.eval(), processor


def save(arch: str, folder: Path) -> Path:
    """The model and processor as a user's folder (``save_pretrained``; Gemma 3's named tokens written to
    its tokenizer_config as a hub checkpoint has them)."""
    model, processor = build(arch)
    model.save_pretrained(str(folder))
    processor.save_pretrained(str(folder))
    if arch == "gemma3":
        config = json.loads((folder / "tokenizer_config.json").read_text())
        config["extra_special_tokens"] = GEMMA3_TOKENS
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def reference_log_probs(model, processor, prompt_text: str, images, completion: str, P: int) -> torch.Tensor:
    """log p of the completion tokens from the model's plain forward on the processor's outputs for prompt
    and completion (PaliGemma's completion as its ``suffix``), without postrl's batching or positions."""
    tok = processor.tokenizer
    if isinstance(processor, tf.PaliGemmaProcessor):
        inputs = processor(text=[prompt_text], images=images, suffix=[completion], return_tensors="pt")
    else:
        inputs = processor(
            text=[prompt_text + completion + tok.eos_token], images=images, return_tensors="pt"
        )
    inputs.pop("labels", None)
    with torch.no_grad():
        log_p = torch.log_softmax(model(**inputs).logits[0, P - 1 : -1].float(), -1)
    return inputs["input_ids"][0], log_p.gather(-1, inputs["input_ids"][0, P:, None])[:, 0]


@pytest.mark.parametrize("arch", list(ARCHS))
def test_teacher_forced_log_probs_are_the_models_own(arch: str) -> None:
    model, processor = build(arch)
    rows = get_task("shapes", **SHAPES).sft_rows("test")[:3]
    examples = encode_rows(processor, rows, "sft", 512)
    batch = sft_batch(examples, processor.tokenizer.pad_token_id)
    P = batch["prompt_len"]
    with torch.no_grad():
        ours = vlm_score(model, batch["input_ids"], batch["attention_mask"], P, batch["images"])
    for i, (row, e) in enumerate(zip(rows, examples, strict=True)):
        text = processor.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        completion = row["completion"][-1]["content"]
        ids, expected = reference_log_probs(
            model, processor, text, row["images"], completion, len(e.prompt_ids)
        )
        assert ids.tolist() == e.prompt_ids + e.completion_ids  # the same tokens, so the same question
        torch.testing.assert_close(ours[i, : len(e.completion_ids)], expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_sampled_log_probs_equal_teacher_forced(arch: str) -> None:
    model, processor = build(arch)
    tok = processor.tokenizer
    examples = encode_rows(processor, get_task("shapes", **SHAPES).prompt_rows("test")[:3], "prompts", 512)
    ids, mask, images = prompt_batch(examples, tok.pad_token_id)
    rollout = vlm_generate(
        model, ids, mask, images, max_new_tokens=6, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        repeat=2, temperature=0.8, generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    rows = {k: v.repeat_interleave(2, 0) for k, v in images.items()}
    args = (rollout.input_ids, rollout.attention_mask, rollout.prompt_len, rows)
    with torch.no_grad():
        shared = vlm_score(model, *args, temperature=0.8)  # each prompt once, its rows on its cache
        plain = vlm_score(model, *args, temperature=0.8, share=False)
    torch.testing.assert_close(shared, rollout.log_probs, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(plain, rollout.log_probs, atol=2e-5, rtol=1e-5)


def _run(steps: int) -> RunConfig:
    return RunConfig(steps=steps, eval_every=0, save_every=0, log_every=1, threads=1)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_sft_and_grpo_take_a_step(arch: str, tmp_path: Path) -> None:
    folder = save(arch, tmp_path / "model")
    optim = OptimConfig(lr=1e-3, warmup_steps=0)
    sft = SFTConfig(
        model=str(folder), data="task:shapes", task=SHAPES, train=TrainConfig(batch_size=2, max_length=256),
        optim=optim, run=_run(1), eval_size=2,
    )  # fmt: skip
    summary = run_sft(sft, tmp_path / "sft")
    assert summary["steps"] == 1 and summary["heldout_loss"] > 0
    grpo = GRPOConfig(
        model=str(tmp_path / "sft" / "model"), data="task:shapes", task=SHAPES, optim=optim, run=_run(1),
        grpo=GRPOLossConfig(group_size=2, prompts_per_step=2, beta=0.04), eval_size=2, max_prompt_length=256,
        sampling=SamplingConfig(max_new_tokens=3),
    )  # fmt: skip
    summary = run_grpo(grpo, tmp_path / "grpo")
    assert summary["steps"] == 1 and summary["reward_mean"] is not None
