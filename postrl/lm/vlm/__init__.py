"""Vision-language models: a policy that sees pictures, trained by SFT and GRPO on TRL's vision formats.

    model.py     the built-in tiny LLaVA (CLIP tower, projector, tiny Llama) and its processor; loading any
                 Hugging Face image-text-to-text model (`load_vlm`), `is_vlm` (the trainers' hook)
    data.py      rows with ``images`` → prompt ids with image placeholders, pixel values, completion ids
    rollout.py   `vlm_generate` (the vision encoder once per prompt, then the KV cache) and teacher-forced `vlm_score`
    train.py     supervised training on the spine: `run_vlm_pretrain` (the tiny VLM aligned on captions),
                 `run_vlm_sft` (`postrl sft` when the model is a VLM), greedy held-out accuracy
    grpo.py      `run_vlm_grpo` (`postrl grpo` when the model is a VLM): the text trainer's config, estimators
                 and loss, sampling and scoring with the pictures

The built-in visual task is `postrl.lm.tasks.shapes` (``task:shapes``).
"""

from postrl.lm.vlm.data import VLMExample as VLMExample
from postrl.lm.vlm.data import encode_rows as encode_rows
from postrl.lm.vlm.data import load_vlm_rows as load_vlm_rows
from postrl.lm.vlm.data import prompt_batch as prompt_batch
from postrl.lm.vlm.data import sft_batch as sft_batch
from postrl.lm.vlm.grpo import run_vlm_grpo as run_vlm_grpo
from postrl.lm.vlm.model import IMAGE_TOKEN as IMAGE_TOKEN
from postrl.lm.vlm.model import TinyVLMConfig as TinyVLMConfig
from postrl.lm.vlm.model import build_tiny_vlm as build_tiny_vlm
from postrl.lm.vlm.model import build_vlm_tokenizer as build_vlm_tokenizer
from postrl.lm.vlm.model import image_token_id as image_token_id
from postrl.lm.vlm.model import is_vlm as is_vlm
from postrl.lm.vlm.model import load_vlm as load_vlm
from postrl.lm.vlm.model import save_vlm as save_vlm
from postrl.lm.vlm.rollout import vlm_generate as vlm_generate
from postrl.lm.vlm.rollout import vlm_score as vlm_score
from postrl.lm.vlm.train import VLMPretrainConfig as VLMPretrainConfig
from postrl.lm.vlm.train import answer_accuracy as answer_accuracy
from postrl.lm.vlm.train import run_vlm_pretrain as run_vlm_pretrain
from postrl.lm.vlm.train import run_vlm_sft as run_vlm_sft
