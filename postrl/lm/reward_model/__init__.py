"""`postrl rm`: a reward model learned from preference pairs (Bradley–Terry), the second stage of RLHF.

    algorithm.py   `RMConfig`, the training step and `RewardModelling` (the spine's algorithm), `run_rm`
    pairs.py       preference pairs: rows, tokens, batches, each response's score, the two losses
    evaluation.py  held-out accuracy, margin, ECE, gold agreement; score statistics on SFT samples
                   (``reward_norm.json``) and the export

`run_rm`, `RMConfig`, `NormConfig` and `read_reward_norm` are importable from here.
"""

from postrl.lm.reward_model.algorithm import RMConfig as RMConfig
from postrl.lm.reward_model.algorithm import rm_train_step as rm_train_step
from postrl.lm.reward_model.algorithm import run_rm as run_rm
from postrl.lm.reward_model.evaluation import NORM_FILE as NORM_FILE
from postrl.lm.reward_model.evaluation import NormConfig as NormConfig
from postrl.lm.reward_model.evaluation import expected_calibration_error as expected_calibration_error
from postrl.lm.reward_model.evaluation import read_reward_norm as read_reward_norm
from postrl.lm.reward_model.pairs import tokenize_pairs as tokenize_pairs
