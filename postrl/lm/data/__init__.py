"""Data for the LM trainers: reading and validating rows, then rendering and tokenising them.

    sources.py   JSONL / JSON / Parquet files, built-in tasks, ``datasets`` names, rows in memory (a list of
                 dicts, a ``datasets.Dataset``: `register_records`) → validated rows of a kind (sft, prefs,
                 prompts) in TRL's formats (implicit preference prompts made explicit: `explicit_prompt`),
                 each a `Row` (a dict that remembers its file:line); `DataError`; `write_jsonl`
    checks.py    checks across a source's rows: one format (text or conversational), no preference pair with
                 the same answer twice, empty rows refused or skipped
    tokens.py    rows → tokens: chat rendering, length limits, `encode_prompts`, SFT examples, packing,
                 padding and the rollout layout

Every name the trainers use is importable from `postrl.lm.data`.
"""

from postrl.lm.data.sources import EMPTY_POLICIES as EMPTY_POLICIES
from postrl.lm.data.sources import MEMORY_PREFIX as MEMORY_PREFIX
from postrl.lm.data.sources import TEXT_FIELDS as TEXT_FIELDS
from postrl.lm.data.sources import DataError as DataError
from postrl.lm.data.sources import Row as Row
from postrl.lm.data.sources import explicit_prompt as explicit_prompt
from postrl.lm.data.sources import load_rows as load_rows
from postrl.lm.data.sources import load_train_heldout as load_train_heldout
from postrl.lm.data.sources import read_records as read_records
from postrl.lm.data.sources import register_records as register_records
from postrl.lm.data.sources import release_records as release_records
from postrl.lm.data.sources import unpair as unpair
from postrl.lm.data.sources import validate_record as validate_record
from postrl.lm.data.sources import write_jsonl as write_jsonl
from postrl.lm.data.tokens import IGNORE_INDEX as IGNORE_INDEX
from postrl.lm.data.tokens import OVERLONG_POLICIES as OVERLONG_POLICIES
from postrl.lm.data.tokens import apply_length_limit as apply_length_limit
from postrl.lm.data.tokens import collate_preferences as collate_preferences
from postrl.lm.data.tokens import encode as encode
from postrl.lm.data.tokens import encode_completions as encode_completions
from postrl.lm.data.tokens import encode_prompts as encode_prompts
from postrl.lm.data.tokens import join_prompt_response as join_prompt_response
from postrl.lm.data.tokens import pack_examples as pack_examples
from postrl.lm.data.tokens import pad as pad
from postrl.lm.data.tokens import render_rows as render_rows
from postrl.lm.data.tokens import special_prefix as special_prefix
from postrl.lm.data.tokens import tokenize_preferences as tokenize_preferences
from postrl.lm.data.tokens import tokenize_prompts as tokenize_prompts
from postrl.lm.data.tokens import tokenize_sft as tokenize_sft
