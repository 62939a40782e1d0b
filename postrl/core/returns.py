"""Returns and advantages: discounted returns, TD errors and GAE.

Time is the LAST dimension: rewards ``[..., T]`` (e.g. ``[envs, steps]`` or ``[batch, tokens]``). Masks
(``dones``, ``terminated``, ``episode_end``) may be bool or float 0/1; they are cast to the rewards' dtype.
``terminated`` (the MDP ended: no bootstrap) and ``episode_end`` (terminated *or* truncated: the trajectory
stops here, so the λ-sum must not cross into the next episode) are kept apart, as in TorchRL.
"""

from __future__ import annotations

import torch

__all__ = ["discounted_returns", "td_errors", "gae"]


def discounted_returns(
    rewards: torch.Tensor,
    dones: torch.Tensor,
    gamma: float,
    last_value: torch.Tensor | None = None,
) -> torch.Tensor:
    """Discounted reward-to-go by the backward recursion

        G_t = r_t + γ (1 − d_t) G_{t+1},    G_T = last_value (0 if None).

    Source: Sutton & Barto (2018), eq. 3.9; REINFORCE (Williams 1992) uses G_t as the weight of ∇log π.

    Args:
        rewards: ``[..., T]`` rewards r_t.
        dones: ``[..., T]`` bool/float, 1 where step t ended its episode (G does not carry across it).
        gamma: discount γ ∈ [0, 1].
        last_value: ``[...]`` (no time dimension) bootstrap value for the state after the last step, e.g.
            V(s_T) for a rollout cut mid-episode; ignored where ``dones[..., -1]`` is 1.

    Returns:
        ``[..., T]`` returns G_t, same dtype as ``rewards``.
    """
    not_done = 1.0 - dones.to(rewards.dtype)
    g = torch.zeros_like(rewards[..., 0]) if last_value is None else last_value.to(rewards.dtype)
    out = []
    for t in reversed(range(rewards.shape[-1])):
        g = rewards[..., t] + gamma * not_done[..., t] * g
        out.append(g)
    return torch.stack(out[::-1], dim=-1)


def td_errors(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    gamma: float,
) -> torch.Tensor:
    """One-step TD errors

        δ_t = r_t + γ (1 − term_t) V(s_{t+1}) − V(s_t).

    Source: Sutton (1988); Schulman et al. 2015, "High-Dimensional Continuous Control Using GAE", eq. 9.

    Args:
        rewards: ``[..., T]`` rewards r_t.
        values: ``[..., T]`` V(s_t).
        next_values: ``[..., T]`` V(s_{t+1}), the value of the state after step t (for a truncated step: the
            value of the final observation, so truncation still bootstraps).
        terminated: ``[..., T]`` bool/float, 1 where step t reached a terminal state (no bootstrap).
        gamma: discount γ.

    Returns:
        ``[..., T]`` δ_t.
    """
    not_term = 1.0 - terminated.to(rewards.dtype)
    return rewards + gamma * not_term * next_values - values


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    episode_end: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2015, arXiv:1506.02438, eq. 16) as one recurrence:

        δ_t = r_t + γ (1 − term_t) V(s_{t+1}) − V(s_t)
        A_t = δ_t + γ λ (1 − end_t) A_{t+1},    A_T = 0
        returns_t = A_t + V(s_t)                 (the TD(λ) target for the critic)

    A truncated step (end_t = 1, term_t = 0) bootstraps from ``next_values[t]`` but stops the λ-sum; a
    terminated step does neither. ``terminated`` is OR-ed into ``episode_end`` (a terminal step always ends the
    episode), so passing ``episode_end = truncated`` alone is also correct.

    Advantages and returns are regression/weighting *targets*: they are computed under ``torch.no_grad`` and
    returned detached, so no gradient flows into ``values`` through them.

    Args:
        rewards: ``[..., T]`` rewards r_t.
        values: ``[..., T]`` V(s_t).
        next_values: ``[..., T]`` V(s_{t+1}) (value of the final observation on a truncated step).
        terminated: ``[..., T]`` bool/float, 1 where s_{t+1} is terminal.
        episode_end: ``[..., T]`` bool/float, 1 where the episode ended at step t (terminated or truncated).
        gamma: discount γ.
        lam: GAE λ ∈ [0, 1] (λ = 0: one-step TD; λ = 1: Monte Carlo return minus V).

    Returns:
        ``(advantages, returns)``, both ``[..., T]``, detached, dtype of ``rewards``.
    """
    with torch.no_grad():
        deltas = td_errors(rewards, values, next_values, terminated, gamma)
        ended = (episode_end != 0) | (terminated != 0)
        carry = gamma * lam * (1.0 - ended.to(deltas.dtype))
        adv_next = torch.zeros_like(deltas[..., 0])
        out = []
        deltas_t, carry_t = deltas.unbind(-1), carry.unbind(-1)  # the views once, not two selects per step
        for t in reversed(range(deltas.shape[-1])):
            # not addcmul: its fused rounding shifts every result
            adv_next = deltas_t[t] + carry_t[t] * adv_next
            out.append(adv_next)
        advantages = torch.stack(out[::-1], dim=-1)
        returns = advantages + values
    return advantages.detach(), returns.detach()
