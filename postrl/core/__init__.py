"""postrl.core: the math of the notes as pure functions on torch tensors.

No I/O, no models, no global state; time on the last dimension (``[..., T]``); inputs never modified.
See DESIGN.md, "The core API" and "Core additions" (waves 2 and 3).
"""

from postrl.core.distributions import diag_gaussian_entropy, diag_gaussian_log_prob
from postrl.core.dpo import DPO_LOSS_TYPES, dpo_loss
from postrl.core.estimators import overlong_penalty, reinforce_pp_advantages, rloo_advantages
from postrl.core.grpo import GRPO_LOSS_TYPES, IMPORTANCE_LEVELS, group_advantages, grpo_loss
from postrl.core.importance import IS_LEVELS, behaviour_mismatch, masked_is_weights, truncated_is_weights
from postrl.core.kl import (
    KL_KINDS,
    AdaptiveKLController,
    FixedKLController,
    kl_estimate,
    kl_shaped_rewards,
)
from postrl.core.kto import kto_loss
from postrl.core.policy_gradient import (
    clipped_surrogate,
    entropy_from_logits,
    ppo_clip_loss,
    reinforce_loss,
    value_loss,
)
from postrl.core.preferences import pairwise_loss, preference_loss
from postrl.core.returns import discounted_returns, gae, td_errors
from postrl.core.stats import masked_mean, masked_sum, masked_whiten
from postrl.core.trpo import (
    backtracking_line_search,
    conjugate_gradient,
    flat_grad,
    flat_params,
    set_flat_params,
)
from postrl.core.turns import (
    turn_gae,
    turn_group_advantages,
    turn_index,
    turn_start_values,
    turn_sums,
    turns_to_tokens,
)

__all__ = [
    "DPO_LOSS_TYPES",
    "GRPO_LOSS_TYPES",
    "IMPORTANCE_LEVELS",
    "IS_LEVELS",
    "KL_KINDS",
    "AdaptiveKLController",
    "FixedKLController",
    "backtracking_line_search",
    "behaviour_mismatch",
    "clipped_surrogate",
    "conjugate_gradient",
    "diag_gaussian_entropy",
    "diag_gaussian_log_prob",
    "discounted_returns",
    "dpo_loss",
    "entropy_from_logits",
    "flat_grad",
    "flat_params",
    "gae",
    "group_advantages",
    "grpo_loss",
    "kl_estimate",
    "kl_shaped_rewards",
    "kto_loss",
    "masked_is_weights",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
    "overlong_penalty",
    "pairwise_loss",
    "preference_loss",
    "ppo_clip_loss",
    "reinforce_loss",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "set_flat_params",
    "td_errors",
    "truncated_is_weights",
    "turn_gae",
    "turn_group_advantages",
    "turn_index",
    "turn_start_values",
    "turn_sums",
    "turns_to_tokens",
    "value_loss",
]
