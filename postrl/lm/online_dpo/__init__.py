"""`postrl online-dpo`: online DPO (Guo et al. 2024, "Direct Language Model Alignment from Online AI
Feedback"): each step samples two responses per prompt from the current policy, a judge labels the pair, and
the DPO loss against the frozen reference is taken on it.

    config.py      `OnlineDPOConfig` (and `OnlineBatchConfig`: prompts per step)
    pairs.py       sampling the two responses, the judge's labels, the pairs in DPO's layout, the win rate
                   against the reference
    algorithm.py   `OnlineDPO` (the spine's algorithm), its recipe, `run_online_dpo`

`run_online_dpo` and `OnlineDPOConfig` are importable from here.
"""

from postrl.lm.online_dpo.algorithm import run_online_dpo as run_online_dpo
from postrl.lm.online_dpo.config import OnlineBatchConfig as OnlineBatchConfig
from postrl.lm.online_dpo.config import OnlineDPOConfig as OnlineDPOConfig
