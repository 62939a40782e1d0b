"""Language models: loading any Hugging Face causal LM, the tiny built-in Llama, and scalar heads.

    layout.py    positions and each row's last real token from the attention mask (left/right padding safe)
    loading.py   load_causal_lm, dtypes, source checks and `ModelError`s that say what would work, dropout off
    context.py   a model's context length, `check_context` and `fit_context`
    tiny.py      `TinyLMConfig` and `build_tiny_lm`: the built-in Llama, fixed by a seed
    heads.py     scalar heads: `ScalarHeadModel` (reward model, separate critic), `PolicyWithValueHead`
    lora.py      LoRA adapters through peft (`apply_lora`), the adapter-free reference, merged and adapter exports
    seq_cls.py   a scalar-head model as a one-label *ForSequenceClassification folder (TRL's reward models), both ways

The fused decode-only forwards of GPT-2 and Llama are in `postrl.lm.fast`; the tokenizer in
`postrl.lm.tokenizer`.
"""

from postrl.lm.models.context import CONTEXT_KEYS as CONTEXT_KEYS
from postrl.lm.models.context import check_context as check_context
from postrl.lm.models.context import check_vocab as check_vocab
from postrl.lm.models.context import context_length as context_length
from postrl.lm.models.context import fit_context as fit_context
from postrl.lm.models.heads import HEAD_CONFIG as HEAD_CONFIG
from postrl.lm.models.heads import HEAD_FORMAT as HEAD_FORMAT
from postrl.lm.models.heads import HEAD_WEIGHTS as HEAD_WEIGHTS
from postrl.lm.models.heads import PolicyWithValueHead as PolicyWithValueHead
from postrl.lm.models.heads import ScalarHeadModel as ScalarHeadModel
from postrl.lm.models.heads import hidden_size_of as hidden_size_of
from postrl.lm.models.heads import load_head as load_head
from postrl.lm.models.heads import new_scalar_head as new_scalar_head
from postrl.lm.models.heads import save_head as save_head
from postrl.lm.models.layout import gather_last as gather_last
from postrl.lm.models.layout import last_token_index as last_token_index
from postrl.lm.models.layout import position_ids_from_mask as position_ids_from_mask
from postrl.lm.models.loading import DTYPES as DTYPES
from postrl.lm.models.loading import ModelError as ModelError
from postrl.lm.models.loading import assert_dropout_off as assert_dropout_off
from postrl.lm.models.loading import folder_or_hub_name as folder_or_hub_name
from postrl.lm.models.loading import hub_reachable as hub_reachable
from postrl.lm.models.loading import load_causal_lm as load_causal_lm
from postrl.lm.models.loading import load_error as load_error
from postrl.lm.models.loading import looks_like_path as looks_like_path
from postrl.lm.models.loading import model_source as model_source
from postrl.lm.models.loading import resolve_dtype as resolve_dtype
from postrl.lm.models.loading import set_dropout_off as set_dropout_off
from postrl.lm.models.lora import AdapterFreeReference as AdapterFreeReference
from postrl.lm.models.lora import adapter_free_reference as adapter_free_reference
from postrl.lm.models.lora import adapters_disabled as adapters_disabled
from postrl.lm.models.lora import apply_lora as apply_lora
from postrl.lm.models.lora import export_adapted as export_adapted
from postrl.lm.models.lora import has_lora as has_lora
from postrl.lm.models.lora import merged_state_dict as merged_state_dict
from postrl.lm.models.lora import save_adapter as save_adapter
from postrl.lm.models.lora import save_merged as save_merged
from postrl.lm.models.lora import trainable_share as trainable_share
from postrl.lm.models.tiny import TinyLMConfig as TinyLMConfig
from postrl.lm.models.tiny import build_tiny_lm as build_tiny_lm
