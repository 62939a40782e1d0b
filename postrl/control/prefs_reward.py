"""The reward model of learning from segment preferences (Christiano et al. 2017, arXiv:1706.03741, §2.2).

A segment σ = ((o_0, a_0), …, (o_{L−1}, a_{L−1})) is scored by the sum of a learned per-step reward,
ŝ(σ) = Σ_t r̂(o_t, a_t), and P(σ¹ ≻ σ²) = σ(ŝ(σ¹) − ŝ(σ²)) (Bradley–Terry), fitted with
``postrl.core.preference_loss`` against labels 1, 0 or 0.5 (a tie).

Episode ends inside a segment. When the episode *terminates* at step t < L − 1, the steps after it are
padding: their true reward is 0 (the absorbing state of the MDP), and the model scores them with a learned
constant r̂_∅, the reward of the absorbing state (Christiano et al. padded Atari episode ends the same way).
On CartPole (+1 per step) this is where all the information is: a segment with a fall has a lower true
return, and the model learns r̂(alive) > r̂_∅. ``postrl.control.prefs`` then uses r̂ − r̂_∅, so that the
absorbing state is worth exactly the 0 that PPO bootstraps after a termination.

Also here: cutting segments from a rollout and choosing the pairs to label. Every tensor is plain torch; the
ensemble runs its K members as one batched matmul.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import gymnasium as gym
import torch
from torch import nn

from postrl.core import preference_loss

__all__ = [
    "Pairs",
    "RewardEnsemble",
    "RewardModelConfig",
    "Segments",
    "accuracy",
    "cut_segments",
    "extract_segments",
    "labels_due",
    "pick_segments",
    "reward_correlation",
    "select_pairs",
    "synthetic_labels",
    "train_reward_model",
]


@dataclass(frozen=True)
class RewardModelConfig:
    ensemble: int = 3
    """Members K of the reward-model ensemble (their disagreement picks the pairs to label)."""
    hidden: tuple[int, ...] = (64, 64)
    """Hidden layer sizes of each member's MLP on (observation, action)."""
    lr: float = 1e-3
    """AdamW learning rate."""
    weight_decay: float = 1e-4
    """AdamW weight decay (Christiano et al. regularise the reward model with l2)."""
    batch_size: int = 32
    """Labelled pairs per gradient step (each member draws its own)."""
    steps_per_iteration: int = 16
    """Gradient steps on the reward model after each rollout."""
    pretrain_steps: int = 300
    """Gradient steps after the first labels (from the untrained policy), before PPO uses r̂."""
    random_response: float = 0.1
    """ε: the loss models a label as uniformly random with this chance, P = ε/2 + (1 − ε)σ(ŝ¹ − ŝ²)
    (Christiano et al. §2.2.3 use 0.1), so that a wrong label costs at most log(2/ε)."""
    use_actions: bool = True
    """Feed the action to the reward model, r̂(o, a) (Christiano et al.); false: r̂(o), for tasks whose reward
    is a function of the state, where an action input only gives the model room to fit label noise."""

    CHECKS = {  # valid ranges (postrl.runtime.config.validate)
        "ensemble": ">= 1",
        "hidden": ">= 1",
        "lr": "> 0",
        "weight_decay": ">= 0",
        "batch_size": ">= 1",
        "steps_per_iteration": ">= 0",
        "pretrain_steps": ">= 0",
        "random_response": "[0, 1]",
    }


@dataclass
class Segments:
    """A batch of segments ``[*S, L]`` (leading dims ``*S``), raw (unnormalised) observations."""

    obs: torch.Tensor  # [*S, L, obs_dim]
    actions: torch.Tensor  # [*S, L] (discrete) or [*S, L, act_dim]
    true_rewards: torch.Tensor  # [*S, L] true reward; 0 on the padding after a termination
    alive: torch.Tensor  # [*S, L] bool; False on the padding after a termination

    def __len__(self) -> int:
        return self.alive.shape[0]

    def take(self, idx: torch.Tensor) -> Segments:
        return Segments(*(getattr(self, f.name)[idx] for f in fields(self)))

    @staticmethod
    def cat(parts: list[Segments]) -> Segments:
        return Segments(*(torch.cat([getattr(p, f.name) for p in parts]) for f in fields(Segments)))

    def true_returns(self) -> torch.Tensor:
        return self.true_rewards.sum(-1)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class Pairs:
    """Labelled pairs ``[P]``: ``labels`` 1 (first preferred), 0 (second) or 0.5; ``val`` marks held-out ones."""

    first: Segments
    second: Segments
    labels: torch.Tensor  # [P]
    val: torch.Tensor  # [P] bool

    def __len__(self) -> int:
        return self.labels.shape[0]

    def state_dict(self) -> dict:
        return {
            "first": self.first.state_dict(),
            "second": self.second.state_dict(),
            "labels": self.labels,
            "val": self.val,
        }

    @staticmethod
    def from_state(state: dict) -> Pairs:
        return Pairs(Segments(**state["first"]), Segments(**state["second"]), state["labels"], state["val"])

    @staticmethod
    def from_rows(rows: list[dict]) -> Pairs:
        """Pairs from JSON rows ``{"first", "second", "label"}``, each segment ``{"obs" [L][obs_dim],
        "actions" [L] or [L][act_dim], "true_rewards" [L], "alive" [L]}`` (the preferences file of
        ``postrl label`` on segment pairs); none held out (``val`` false)."""

        def stack(side: str) -> Segments:
            segs = [r[side] for r in rows]
            actions = torch.tensor([s["actions"] for s in segs])
            return Segments(
                torch.tensor([s["obs"] for s in segs], dtype=torch.float32),
                actions if actions.is_floating_point() else actions.long(),
                torch.tensor([s["true_rewards"] for s in segs], dtype=torch.float32),
                torch.tensor([s["alive"] for s in segs], dtype=torch.bool),
            )

        labels = torch.tensor([float(r["label"]) for r in rows], dtype=torch.float32)
        return Pairs(stack("first"), stack("second"), labels, torch.zeros(len(rows), dtype=torch.bool))


def synthetic_labels(
    returns_1: torch.Tensor,
    returns_2: torch.Tensor,
    tie_tolerance: float = 0.0,
    flip_prob: float = 0.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The stand-in for the human: ``[B]`` labels 1 if segment 1 has the higher true return, 0 if segment 2,
    0.5 when |R¹ − R²| ≤ ``tie_tolerance``; a non-tie label is flipped with probability ``flip_prob``."""
    labels = (returns_1 > returns_2).to(torch.float32)
    flip = torch.rand(labels.shape, generator=generator) < flip_prob
    labels = torch.where(flip, 1.0 - labels, labels)
    return torch.where((returns_1 - returns_2).abs() <= tie_tolerance, 0.5, labels)


class RewardEnsemble(nn.Module):
    """K MLPs r̂_k(o, a) run as one batched matmul, plus each member's absorbing-state reward r̂_∅,k."""

    def __init__(self, obs_dim: int, action_space: gym.Space, cfg: RewardModelConfig):
        super().__init__()
        self.n_actions = int(action_space.n) if isinstance(action_space, gym.spaces.Discrete) else None
        if self.n_actions is None:
            self.register_buffer("low", torch.as_tensor(action_space.low, dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(action_space.high, dtype=torch.float32))
        self.use_actions = cfg.use_actions
        act_dim = (self.n_actions or int(action_space.shape[0])) if cfg.use_actions else 0
        sizes = (obs_dim + act_dim, *cfg.hidden, 1)
        k = cfg.ensemble
        self.weights = nn.ParameterList(
            nn.Parameter(torch.empty(k, a, b)) for a, b in zip(sizes[:-1], sizes[1:], strict=True)
        )
        self.biases = nn.ParameterList(nn.Parameter(torch.empty(k, b)) for b in sizes[1:])
        for w, b in zip(self.weights, self.biases, strict=True):  # nn.Linear's default init, per member
            bound = 1 / math.sqrt(w.shape[1])
            nn.init.uniform_(w, -bound, bound)
            nn.init.uniform_(b, -bound, bound)
        self.absorbing = nn.Parameter(torch.zeros(k))  # r̂_∅: reward of the state after a termination

    @property
    def k(self) -> int:
        return self.absorbing.shape[0]

    def features(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """``[..., obs_dim + act_dim]``: observation and one-hot (discrete) or clipped (Box) action (just the
        observation without ``use_actions``)."""
        if not self.use_actions:
            return obs
        if self.n_actions is not None:
            act = nn.functional.one_hot(actions.long(), self.n_actions).to(obs.dtype)
        else:
            act = torch.maximum(torch.minimum(actions, self.high), self.low)  # as the env receives it
        return torch.cat([obs, act], dim=-1)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor, member_dim: bool = False) -> torch.Tensor:
        """Per-step r̂_k: ``obs [*B, obs_dim]`` → ``[K, *B]``; with ``member_dim`` obs is ``[K, *B, obs_dim]``
        and member k reads row k (each member trains on its own minibatch)."""
        x = self.features(obs, actions)
        lead = x.shape[1:-1] if member_dim else x.shape[:-1]
        x = x.reshape(self.k if member_dim else 1, -1, x.shape[-1])  # (K or 1, N, in)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            x = torch.baddbmm(b.unsqueeze(1), x.expand(self.k, -1, -1), w)  # (K, N, out)
            if i < last:
                x = torch.relu(x)
        return x.reshape(self.k, *lead)

    def step_rewards(self, seg: Segments, member_dim: bool = False) -> torch.Tensor:
        """``[K, *S, L]`` r̂ on alive steps, r̂_∅ on the padding after a termination."""
        r = self(seg.obs, seg.actions, member_dim=member_dim)
        absorbing = self.absorbing.reshape(self.k, *([1] * (r.dim() - 1)))
        return torch.where(seg.alive, r, absorbing)

    def scores(self, seg: Segments, member_dim: bool = False) -> torch.Tensor:
        """Segment scores ŝ_k(σ) = Σ_t r̂_k: ``[K, *S]``."""
        return self.step_rewards(seg, member_dim).sum(-1)


def extract_segments(
    obs: torch.Tensor,
    actions: torch.Tensor,
    true_rewards: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    length: int,
    n: int,
) -> Segments:
    """Cut up to ``n`` random segments of ``length`` steps from a rollout ``[E, T, ...]`` (time second).

    A segment stays within one episode: after a termination it is padding (``alive`` False, true reward 0,
    the absorbing state); a segment with a time-limit truncation before its last step is not used (what
    follows a truncation is unknown, not worth 0).
    """
    picks = pick_segments(terminated, truncated, length, n)
    return cut_segments(obs, actions, true_rewards, terminated, picks, length)


def pick_segments(terminated: torch.Tensor, truncated: torch.Tensor, length: int, n: int) -> torch.Tensor:
    """``[S, 2]`` (env, start step) of up to ``n`` random segments of ``length`` steps of a rollout ``[E, T]``
    that `extract_segments` may cut (none with a truncation before its last step while the episode runs)."""
    n_envs, n_steps = terminated.shape
    starts = torch.cartesian_prod(torch.arange(n_envs), torch.arange(n_steps - length + 1))  # (M, 2)
    env_i, t_i = starts[:, :1], starts[:, 1:] + torch.arange(length)  # (M, 1), (M, L)
    term = terminated[env_i, t_i]
    alive = (term.long().cumsum(-1) - term.long()) == 0  # no termination strictly before t
    valid = ~(truncated[env_i, t_i] & alive)[:, :-1].any(-1)
    pick = torch.nonzero(valid).squeeze(-1)
    return starts[pick[torch.randperm(len(pick))[:n]]]


def cut_segments(
    obs: torch.Tensor,
    actions: torch.Tensor,
    true_rewards: torch.Tensor,
    terminated: torch.Tensor,
    picks: torch.Tensor,
    length: int,
) -> Segments:
    """The segments ``picks [S, 2]`` (env, start step) of a rollout ``[E, T, ...]``, padded after a
    termination (``alive`` False, true reward 0)."""
    env_i, t_i = picks[:, :1], picks[:, 1:] + torch.arange(length)  # (S, 1), (S, L)
    term = terminated[env_i, t_i]
    alive = (term.long().cumsum(-1) - term.long()) == 0  # no termination strictly before t
    true = torch.where(alive, true_rewards[env_i, t_i], torch.zeros(()))
    return Segments(obs[env_i, t_i], actions[env_i, t_i], true, alive)


def labels_due(frac: float, budget: int, initial: int, until: float, decay: float) -> int:
    """Labels due ``frac`` of the way into the run: ``initial`` at once, then the rest of ``budget`` at a rate
    ∝ τ / (τ + frac) (τ = ``decay``; 0 is a constant rate), all of it by ``until``. Christiano et al. (2017,
    §2.2.4, App. A) request labels all through training at a rate ∝ 2·10⁶ / (T + 2·10⁶)."""
    if until <= 0:
        return budget
    f = min(frac, until)
    share = math.log1p(f / decay) / math.log1p(until / decay) if decay > 0 else f / until  # ∫ rate, to 1
    return min(budget, initial + math.ceil((budget - initial) * share))


@torch.no_grad()
def select_pairs(
    model: RewardEnsemble, pool: Segments, n: int, mode: str, candidates_per_label: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices ``(i, j)`` ``[n]`` of distinct pool segments to label: random, or the ``n`` of
    ``n · candidates_per_label`` random pairs on which the members' P_k(σ_i ≻ σ_j) vary most."""
    m = n * candidates_per_label if mode == "disagreement" else n
    i = torch.randint(len(pool), (m,))
    j = torch.randint(len(pool) - 1, (m,))
    j = j + (j >= i)  # distinct from i
    if mode == "disagreement":
        scores = model.scores(pool)  # (K, S)
        p = torch.sigmoid(scores[:, i] - scores[:, j])  # (K, m)
        top = p.var(0).topk(min(n, m)).indices
        i, j = i[top], j[top]
    return i, j


def train_reward_model(
    model: RewardEnsemble,
    optimizer: torch.optim.Optimizer,
    pairs: Pairs,
    steps: int,
    batch_size: int,
    random_response: float = 0.0,
) -> float | None:
    """``steps`` Adam steps of the Bradley–Terry cross-entropy (``random_response``: ε of
    ``preference_loss``) on the training (not held-out) pairs, each member on its own random minibatch.
    Returns the mean loss, or None when there is nothing to train on."""
    train_idx = torch.nonzero(~pairs.val).squeeze(-1)
    if len(train_idx) == 0 or steps <= 0:
        return None
    total = 0.0
    for _ in range(steps):
        idx = train_idx[torch.randint(len(train_idx), (model.k, batch_size))]  # (K, B)
        s1 = model.scores(pairs.first.take(idx), member_dim=True)  # (K, B)
        s2 = model.scores(pairs.second.take(idx), member_dim=True)
        loss = preference_loss(s1, s2, pairs.labels[idx], random_response=random_response)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total += float(loss.detach())
    return total / steps


@torch.no_grad()
def accuracy(model: RewardEnsemble, pairs: Pairs, labels: torch.Tensor) -> float:
    """Fraction of the non-tie ``labels`` ``[P]`` that the ensemble-mean score agrees with (NaN if none)."""
    keep = labels != 0.5
    if not keep.any():
        return float("nan")
    diff = (model.scores(pairs.first) - model.scores(pairs.second)).mean(0)
    return float(((diff > 0) == (labels > 0.5))[keep].float().mean())


@torch.no_grad()
def reward_correlation(model: RewardEnsemble, seg: Segments) -> float:
    """Pearson correlation of the ensemble-mean r̂ and the true reward over every step of ``seg``
    (padding included: true 0 against r̂_∅). NaN when either is constant."""
    learned = model.step_rewards(seg).mean(0).flatten().double()
    true = seg.true_rewards.flatten().double()
    if len(true) < 2 or true.std() == 0 or learned.std() == 0:
        return float("nan")
    return float(torch.corrcoef(torch.stack([learned, true]))[0, 1])
