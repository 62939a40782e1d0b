"""`postrl ppo`: PPO-based RLHF with an actor, a critic, a frozen reward model and a frozen reference.

    algorithm.py   the PPO loss, `PPOObjective` (its part of `postrl.lm.onpolicy`), `PPO`, `run_ppo`
    advantages.py  phase 2 and 3 of a step: scores, KL-shaped rewards, values and GAE → `RolloutBatch`
    config.py      `PPOConfig` and its parts (`PPOLossConfig`, `PtxConfig`), `check_ppo_config`
    build.py       the four roles, prompts and ptx data, the reward scorer, export, plots
    episodes.py    env.id: episodes for prompts, the critic at each turn's start, GAE over turns

`run_ppo`, `PPOConfig` and its parts (and the loss helpers tests use) are importable from here.
"""

from postrl.lm.ppo.advantages import GAEConfig as GAEConfig
from postrl.lm.ppo.advantages import KLConfig as KLConfig
from postrl.lm.ppo.advantages import RewardConfig as RewardConfig
from postrl.lm.ppo.algorithm import backward_ppo_minibatch as backward_ppo_minibatch
from postrl.lm.ppo.algorithm import optimise_ppo as optimise_ppo
from postrl.lm.ppo.algorithm import policy_forward as policy_forward
from postrl.lm.ppo.algorithm import ppo_loss as ppo_loss
from postrl.lm.ppo.algorithm import run_ppo as run_ppo
from postrl.lm.ppo.config import PPOConfig as PPOConfig
from postrl.lm.ppo.config import PPOLossConfig as PPOLossConfig
from postrl.lm.ppo.config import PtxConfig as PtxConfig
from postrl.lm.ppo.config import check_ppo_config as check_ppo_config
