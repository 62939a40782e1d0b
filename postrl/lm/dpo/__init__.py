"""`postrl dpo`: Direct Preference Optimization (and IPO) on preference pairs, with a frozen reference.

    algorithm.py   the optimiser step, `DPO` (the spine's algorithm), `run_dpo`
    config.py      `DPOConfig` and `DPOLossConfig`
    build.py       the pairs, summed response log-probs, the reference's (once, stored with the run),
                   the held-out implicit-reward accuracy and margin (sampled responses: `postrl.lm.evaluation`)
    frontier.py    the gold-reward frontier: held-out gold reward and proxy (RM) score against the KL to the
                   SFT policy, for best-of-n, PPO, DPO and GRPO run folders, and its chart

`run_dpo`, `DPOConfig` and `DPOLossConfig` are importable from here.
"""

from postrl.lm.dpo.algorithm import run_dpo as run_dpo
from postrl.lm.dpo.config import DPOConfig as DPOConfig
from postrl.lm.dpo.config import DPOLossConfig as DPOLossConfig
