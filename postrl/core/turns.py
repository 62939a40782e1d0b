"""Credit per turn for multi-turn episodes: GAE with the turn as the time step, a group-relative per-turn
estimator, and the maps between turns and the tokens of each turn.

An episode of an agent is a sequence of turns k = 0 … n−1: the model writes an action (a span of tokens), the
environment answers with an observation and a reward r_k. Turn quantities are ``[..., K]`` with K the largest
number of turns in the batch and the turns of each episode LEFT-ALIGNED: ``turn_mask[..., k]`` is 1 for
k < n (the episode's turns) and 0 after (padding, whose values are ignored and returned as 0). Token quantities
are ``[..., T]``; ``token_turns[..., t]`` is the turn that token t's action belongs to, −1 on tokens that are
not the model's action (prompt, observation and tool tokens, padding): see :func:`turn_index`.
"""

from __future__ import annotations

import torch

from postrl.core.returns import discounted_returns, gae

__all__ = [
    "turn_gae",
    "turn_group_advantages",
    "turn_index",
    "turn_start_values",
    "turn_sums",
    "turns_to_tokens",
]


def turn_index(action_mask: torch.Tensor) -> torch.Tensor:
    """The turn of each action token: the k-th contiguous run of 1s in ``action_mask`` (along the last
    dimension) is turn k; tokens where the mask is 0 get −1.

    Args:
        action_mask: ``[..., T]`` bool/0-1, 1 on the tokens the policy wrote.

    Returns:
        ``[..., T]`` int64 turn index, −1 off the actions.
    """
    mask = action_mask != 0
    previous = torch.zeros_like(mask)
    previous[..., 1:] = mask[..., :-1]
    starts = mask & ~previous  # first token of each run
    index = torch.cumsum(starts.to(torch.int64), dim=-1) - 1
    return torch.where(mask, index, torch.full_like(index, -1))


def turn_start_values(
    values: torch.Tensor, token_turns: torch.Tensor, n_turns: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The critic at the turn boundaries: V(s_k) is the token value at the first action token of turn k (a
    token's value is that of the state before the token is written, so the first token's value is the value of
    everything seen before turn k: prompt, earlier turns and the last observation).

    Args:
        values: ``[..., T]`` token values V(s_t).
        token_turns: ``[..., T]`` int turn index per token, −1 off the actions (:func:`turn_index`).
        n_turns: K, the width of the result (at least the largest turn index + 1).

    Returns:
        ``(turn_values, turn_mask)``, both ``[..., K]``: V(s_k) (0 where the episode has no turn k) and a bool
        mask of the turns present.
    """
    turns = torch.arange(n_turns, device=token_turns.device)
    hit = token_turns.unsqueeze(-2) == turns.unsqueeze(-1)  # [..., K, T]
    first = hit.to(torch.int64).argmax(dim=-1)  # [..., K] first token of turn k (0 when absent)
    present = hit.any(dim=-1)
    gathered = torch.gather(values, -1, first)
    return torch.where(present, gathered, torch.zeros_like(gathered)), present


def turns_to_tokens(turn_values: torch.Tensor, token_turns: torch.Tensor) -> torch.Tensor:
    """Spread one number per turn over the tokens of that turn: out_t = x_{turn(t)} on action tokens, 0 on the
    others (so a per-turn advantage weighs every token of the action it credits, and nothing else).

    Args:
        turn_values: ``[..., K]`` per-turn values (e.g. advantages from :func:`turn_gae`).
        token_turns: ``[..., T]`` int turn index per token, −1 off the actions.

    Returns:
        ``[..., T]`` in the dtype of ``turn_values``.
    """
    index = token_turns.clamp(min=0).to(torch.int64)
    gathered = torch.gather(turn_values, -1, index)
    return torch.where(token_turns >= 0, gathered, torch.zeros_like(gathered))


def turn_sums(token_values: torch.Tensor, token_turns: torch.Tensor, n_turns: int) -> torch.Tensor:
    """Sum a per-token quantity over the tokens of each turn: out_k = Σ_{t: turn(t) = k} x_t (tokens off the
    actions, turn −1, add nothing). The adjoint of :func:`turns_to_tokens`; e.g. a per-token KL penalty
    −β(log π − log π_ref) summed into the reward of the turn whose action it belongs to.

    Args:
        token_values: ``[..., T]`` per-token values.
        token_turns: ``[..., T]`` int turn index per token, −1 off the actions (:func:`turn_index`).
        n_turns: K, the width of the result (at least the largest turn index + 1).

    Returns:
        ``[..., K]`` in the dtype of ``token_values`` (0 for a turn with no tokens).
    """
    on = token_turns >= 0
    index = torch.where(on, token_turns, torch.full_like(token_turns, n_turns)).to(torch.int64)
    x = torch.where(on, token_values, torch.zeros_like(token_values))
    # one extra slot (n_turns) collects the tokens off the actions, and is dropped
    out = torch.zeros((*token_values.shape[:-1], n_turns + 1), dtype=token_values.dtype, device=x.device)
    return out.scatter_add(-1, index, x)[..., :n_turns]


def turn_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    turn_mask: torch.Tensor,
    gamma: float,
    lam: float,
    terminated: torch.Tensor | None = None,
    last_values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over turns (Schulman et al. 2015, arXiv:1506.02438, eq. 16, with the turn as the time step):

        δ_k = r_k + γ V(s_{k+1}) − V(s_k)        (V(s_n) = 0 when the episode terminated, the bootstrap
                                                    ``last_values`` when it was truncated by a budget)
        A_k = δ_k + γ λ A_{k+1},   A_n = 0;      returns_k = A_k + V(s_k)

    This is :func:`postrl.core.gae` on the turn axis, with each episode's last turn as its end. λ = 1 gives
    A_k = G_k − V(s_k) with G_k = Σ_{j≥k} γ^{j−k} r_j (+ γ^{n−k} bootstrap): an unbiased policy-gradient weight
    for ANY critic, since V(s_k) depends on the history before the action of turn k only. λ < 1 trades that
    for lower variance: unbiased only when V is the true V^π (Schulman et al. 2015, Prop. 1).

    Args:
        rewards: ``[..., K]`` reward of each turn r_k (a per-turn score, or 0 except at the last turn).
        values: ``[..., K]`` V(s_k), the critic at the start of each turn (:func:`turn_start_values`).
        turn_mask: ``[..., K]`` bool/0-1, 1 on each episode's turns (left-aligned, at least one per episode).
        gamma: discount γ between turns.
        lam: λ ∈ [0, 1].
        terminated: ``[...]`` bool, whether each episode ended in a terminal state (None: all did); an episode
            cut by its turn or token budget is not terminated and bootstraps from ``last_values``.
        last_values: ``[...]`` V of the state after the last turn, used where not terminated (None: 0).

    Returns:
        ``(advantages, returns)``, both ``[..., K]``, detached, 0 on padding turns.
    """
    mask = turn_mask != 0
    zeros = torch.zeros_like(rewards)
    r = torch.where(mask, rewards, zeros)
    v = torch.where(mask, values.to(rewards.dtype), zeros)
    n = mask.sum(dim=-1, keepdim=True)  # [..., 1]
    is_last = torch.arange(rewards.shape[-1], device=rewards.device) == (n - 1)  # [..., K]
    boot = zeros[..., 0] if last_values is None else last_values.to(rewards.dtype)
    next_v = torch.cat([v[..., 1:], zeros[..., :1]], dim=-1)
    next_v = torch.where(is_last, boot.unsqueeze(-1).expand_as(v), next_v)
    ended = torch.ones_like(mask[..., 0]) if terminated is None else terminated != 0
    term = is_last & ended.unsqueeze(-1)
    advantages, returns = gae(r, v, next_v, term, is_last | ~mask, gamma, lam)
    return torch.where(mask, advantages, zeros), torch.where(mask, returns, zeros)


def turn_group_advantages(
    rewards: torch.Tensor,
    turn_mask: torch.Tensor,
    group_size: int,
    gamma: float = 1.0,
    eps: float = 1e-4,
    scale: bool = True,
    leave_one_out: bool = False,
) -> torch.Tensor:
    """Group-relative credit per turn: each turn is credited with the return from that turn on, baselined
    within the group of episodes of the same prompt at the same turn index.

        G_{i,k} = Σ_{j≥k} γ^{j−k} r_{i,j}                       (return-to-go of episode i from turn k)
        P_k     = {episodes of the group that have a turn k},  c_k = |P_k|
        A_{i,k} = (G_{i,k} − mean_{P_k} G_{·,k}) / (std_{P_k} G_{·,k} + eps)          (scale=True)
        A_{i,k} =  G_{i,k} − mean_{P_k} G_{·,k}                                        (scale=False)
        A_{i,k} =  G_{i,k} − mean_{P_k∖{i}} G_{·,k}                      (leave_one_out=True, scale=False)

    std is Bessel-corrected as ``torch.std``; a turn k whose present returns are all equal (c_k = 1 included)
    gives exactly 0, as :func:`postrl.core.group_advantages`, to which this reduces for one-turn episodes.
    With ``leave_one_out`` an episode alone at turn k (c_k = 1) has no one to leave out: its baseline is 0
    (A = G, not scaled), which keeps the estimator unbiased where a 0 would drop the turn from the gradient.

    When is it unbiased: the leave-one-out baseline of turn k is a function of the OTHER episodes only, which
    are sampled independently of episode i, so E[∇log π(a_{i,k}|h_{i,k}) · b] = 0 and ``leave_one_out=True,
    scale=False`` is an unbiased estimate of the gradient of the γ-discounted return (whatever the baseline
    ignores about the state h_{i,k}: it costs variance, not bias). Including episode i in its own mean scales
    the unbiased estimate by (c_k − 1)/c_k, a per-turn weight that varies with how many episodes reached turn
    k; dividing by the group std (GRPO's scaling) makes it biased, as in GRPO. Trajectory credit (every turn
    credited with the whole episode's reward) is unbiased too but also credits turn k with rewards of earlier
    turns, which its action cannot change: more variance, which this estimator removes.

    Args:
        rewards: ``[n·G, K]`` per-turn rewards, the G episodes of each prompt contiguous.
        turn_mask: ``[n·G, K]`` bool/0-1, 1 on each episode's turns (left-aligned).
        group_size: G.
        gamma: discount γ between turns.
        eps: added to the std.
        scale: divide by the group std at each turn.
        leave_one_out: baseline each episode with the mean of the other present episodes (c_k − 1 of them;
            0 when there are none).

    Returns:
        ``[n·G, K]`` detached advantages, 0 on padding turns.

    Raises:
        ValueError: if the number of episodes is not a multiple of ``group_size``.
    """
    if group_size < 1 or rewards.shape[0] % group_size != 0:
        raise ValueError(
            f"turn_group_advantages: {rewards.shape[0]} episodes cannot be split into groups of {group_size}"
        )
    with torch.no_grad():
        mask = turn_mask != 0
        r = torch.where(mask, rewards, torch.zeros_like(rewards))
        returns = discounted_returns(r, torch.zeros_like(mask), gamma)
        groups = returns.reshape(-1, group_size, returns.shape[-1])  # (n, G, K)
        present = mask.reshape(groups.shape)
        zero = torch.zeros_like(groups)
        count = present.sum(dim=1, keepdim=True).to(groups.dtype)  # (n, 1, K)
        total = torch.where(present, groups, zero).sum(dim=1, keepdim=True)
        mean = total / count.clamp(min=1)
        if leave_one_out:
            centered = groups - (total - groups) / (count - 1).clamp(min=1)
        else:
            centered = groups - mean
        if scale:
            squares = torch.where(present, (groups - mean) ** 2, zero).sum(dim=1, keepdim=True)
            std = (squares / (count - 1).clamp(min=1)).sqrt() + eps
            centered = centered / torch.where(count > 1, std, torch.ones_like(std))
        high = torch.where(present, groups, torch.full_like(groups, -torch.inf)).amax(dim=1, keepdim=True)
        low = torch.where(present, groups, torch.full_like(groups, torch.inf)).amin(dim=1, keepdim=True)
        credited = present & (high != low)  # a constant turn gets exactly 0
        if leave_one_out:
            credited = credited | (present & (count == 1))  # a lone episode: baseline 0, A = G
        advantages = torch.where(credited, centered, zero)
    return advantages.reshape(rewards.shape)
