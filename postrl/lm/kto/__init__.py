"""`postrl kto`: Kahneman–Tversky optimisation on unpaired desirable / undesirable responses, with a frozen
reference.

    algorithm.py   the optimiser step, `KTO` (the spine's algorithm), `run_kto`
    config.py      `KTOConfig` and `KTOLossConfig`
    data.py        unpaired rows (preference pairs unpaired), tokens, the mismatched pairs of z0, batches
    build.py       summed completion log-probs, the reference's (once, stored with the run), z0, held-out metrics

`run_kto`, `KTOConfig` and `KTOLossConfig` are importable from here.
"""

from postrl.lm.kto.algorithm import run_kto as run_kto
from postrl.lm.kto.config import KTOConfig as KTOConfig
from postrl.lm.kto.config import KTOLossConfig as KTOLossConfig
