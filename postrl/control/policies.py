"""MLP actors and critics for Gymnasium spaces.

- Discrete actions: a categorical policy over logits.
- Box actions: a diagonal Gaussian with a state-independent log σ (a learned vector, as in TRPO/PPO's
  MuJoCo experiments). Actions are sampled unclipped and their log-probs are those of the unclipped sample;
  ``VecEnv`` clips them to the bounds only when sending them to the environment.
- Box actions with ``policy.use_sde``: generalized state-dependent exploration (gSDE, Raffin et al. 2021,
  "Smooth Exploration for Robotic Reinforcement Learning", arXiv:2005.05719), the exploration of
  rl-baselines3-zoo's Pendulum presets. With f(s) the actor's last hidden layer (detached, as SB3's default
  ``learn_features=False``) and a learned matrix log σ ``[F, A]``, each env e holds exploration weights
  ε_e ~ N(0, σ²) ``[F, A]``, drawn at the start of every rollout and every ``sde_sample_freq`` steps of it;
  the action is a = μ(s) + f(s)·ε_e, so the noise is a smooth function of the state between draws. Its
  log-prob is that of the Gaussian N(μ(s), diag((f(s)²)·σ² + 1e-6)) (the 1e-6 as SB3, so that a zero
  feature vector keeps a finite density); the deterministic action is μ(s).

Weights use orthogonal initialisation (Saxe et al. 2014) with gain √2 for hidden layers, 0.01 for the policy
output and 1 for the value output, as in OpenAI baselines / Stable-Baselines3 ("Implementation Matters",
Engstrom et al. 2020). All the distribution math (log-density, entropy) comes from ``postrl.core``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import gymnasium as gym
import torch
from torch import nn
from torch.nn import functional as F

from postrl.core import diag_gaussian_entropy, diag_gaussian_log_prob, entropy_from_logits
from postrl.runtime.config import ConfigError

__all__ = [
    "MLP",
    "CategoricalActor",
    "Critic",
    "GSDEActor",
    "GaussianActor",
    "PolicyConfig",
    "make_actor",
    "mlp",
]

_ACTIVATIONS = {"tanh": torch.tanh, "relu": torch.relu, "elu": F.elu}


@dataclass(frozen=True)
class PolicyConfig:
    hidden: tuple[int, ...] = (64, 64)
    """Hidden layer sizes of the actor and of the critic MLPs (separate networks)."""
    activation: Literal["tanh", "relu", "elu"] = "tanh"
    """Hidden activation: tanh, relu or elu."""
    log_std_init: float = 0.0
    """Initial log σ of the Gaussian policy (Box action spaces)."""
    ortho_init: bool = True
    """Orthogonal initialisation (gains √2 hidden, 0.01 policy head, 1 value head); False keeps torch's."""
    use_sde: bool = False
    """Box actions: generalized state-dependent exploration (gSDE, Raffin et al. 2021) instead of the
    state-independent Gaussian: noise f(s)·ε with f the actor's last hidden layer and ε ~ N(0, σ²) a
    [features, actions] matrix per env, σ a learned matrix (log_std_init sets its start). PPO runs it on the
    autograd path; A2C and TRPO too; REINFORCE refuses it."""
    sde_sample_freq: int = -1
    """With use_sde: draw new exploration weights every this many steps of a rollout as well as at its start;
    -1 or 0: only at the start of each rollout (SB3's convention)."""

    CHECKS = {"hidden": ">= 1", "sde_sample_freq": ">= -1"}  # valid ranges


class MLP(nn.Module):
    """Linear layers with an activation between them: ``[N, in_dim] → [N, out_dim]``.

    ``forward`` calls the functional ops directly instead of an ``nn.Sequential``: for networks this small
    the per-module call overhead is most of the cost of a step.
    """

    def __init__(self, sizes: tuple[int, ...], activation: str, out_gain: float, ortho: bool):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose one of {sorted(_ACTIVATIONS)}")
        self.activation, self.activation_name = _ACTIVATIONS[activation], activation
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True))
        if ortho:
            for i, layer in enumerate(self.layers):
                nn.init.orthogonal_(layer.weight, out_gain if i == len(self.layers) - 1 else math.sqrt(2))
                nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        *hidden, last = self.layers
        for layer in hidden:
            x = self.activation(F.linear(x, layer.weight, layer.bias))
        return F.linear(x, last.weight, last.bias)


def mlp(
    in_dim: int, hidden: tuple[int, ...], out_dim: int, activation: str, out_gain: float, ortho: bool
) -> MLP:
    """``in_dim → hidden… → out_dim`` with orthogonal init (gain √2 hidden, ``out_gain`` for the output)."""
    return MLP((in_dim, *hidden, out_dim), activation, out_gain, ortho)


class Critic(nn.Module):
    """State-value function V(s): ``[N, *obs_shape] → [N]``."""

    def __init__(self, obs_dim: int, cfg: PolicyConfig):
        super().__init__()
        self.net = mlp(obs_dim, cfg.hidden, 1, cfg.activation, 1.0, cfg.ortho_init)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).squeeze(-1)


class CategoricalActor(nn.Module):
    """π(a|s) = softmax(logits(s)) over ``n_actions`` discrete actions."""

    discrete = True

    def __init__(self, obs_dim: int, n_actions: int, cfg: PolicyConfig):
        super().__init__()
        self.net = mlp(obs_dim, cfg.hidden, n_actions, cfg.activation, 0.01, cfg.ortho_init)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, n_actions]``."""
        return self.net(obs)

    def act(self, obs: torch.Tensor, deterministic: bool = False, generator=None):
        """Sample (or argmax) actions ``[N]`` and their log-probs ``[N]``; call under no_grad."""
        log_p = torch.log_softmax(self.net(obs), dim=-1)
        if deterministic:
            actions = log_p.argmax(dim=-1)
        else:  # inverse-CDF sampling: 3× cheaper than torch.multinomial on CPU for a handful of actions
            cdf = log_p.exp().cumsum(dim=-1)
            u = torch.rand((cdf.shape[0], 1), generator=generator, dtype=cdf.dtype)
            actions = torch.searchsorted(cdf, u).clamp_max_(cdf.shape[-1] - 1).squeeze(-1)
        return actions, log_p.gather(-1, actions.unsqueeze(-1)).squeeze(-1)

    def evaluate(
        self, obs: torch.Tensor, actions: torch.Tensor, with_entropy: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(log π(a|s) ``[N]``, entropy ``[N]`` or None when not asked for), differentiable."""
        logits = self.net(obs)
        log_p = torch.log_softmax(logits, dim=-1)
        entropy = entropy_from_logits(logits) if with_entropy else None
        return log_p.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1), entropy

    def dist_params(self, obs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (self.net(obs),)

    def kl(self, old_params: tuple[torch.Tensor, ...], obs: torch.Tensor) -> torch.Tensor:
        """KL(π_old(·|s) ‖ π(·|s)) per state ``[N]`` (exact, via ``torch.distributions``)."""
        old = torch.distributions.Categorical(logits=old_params[0].detach())
        new = torch.distributions.Categorical(logits=self.net(obs))
        return torch.distributions.kl_divergence(old, new)


class GaussianActor(nn.Module):
    """π(a|s) = N(μ(s), diag σ²) with a state-independent, learned log σ."""

    discrete = False

    def __init__(self, obs_dim: int, act_dim: int, cfg: PolicyConfig):
        super().__init__()
        self.net = mlp(obs_dim, cfg.hidden, act_dim, cfg.activation, 0.01, cfg.ortho_init)
        self.log_std = nn.Parameter(torch.full((act_dim,), float(cfg.log_std_init)))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Mean action μ(s) ``[N, act_dim]``."""
        return self.net(obs)

    def act(self, obs: torch.Tensor, deterministic: bool = False, generator=None):
        """Sample (or take the mean) ``[N, act_dim]`` and the log-prob of the unclipped sample ``[N]``."""
        mean = self.net(obs)
        if deterministic:
            actions = mean
        else:
            noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype)
            actions = mean + noise * self.log_std.exp()
        return actions, diag_gaussian_log_prob(actions, mean, self.log_std)

    def evaluate(
        self, obs: torch.Tensor, actions: torch.Tensor, with_entropy: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(log π(a|s) ``[N]``, entropy ``[N]`` or None when not asked for), differentiable."""
        mean = self.net(obs)
        entropy = diag_gaussian_entropy(self.log_std).expand(mean.shape[0]) if with_entropy else None
        return diag_gaussian_log_prob(actions, mean, self.log_std), entropy

    def dist_params(self, obs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        mean = self.net(obs)
        return mean, self.log_std.expand_as(mean)

    def kl(self, old_params: tuple[torch.Tensor, ...], obs: torch.Tensor) -> torch.Tensor:
        """KL(π_old(·|s) ‖ π(·|s)) per state ``[N]`` (exact, via ``torch.distributions``)."""
        old_mean, old_log_std = (p.detach() for p in old_params)
        old = torch.distributions.Normal(old_mean, old_log_std.exp())
        mean = self.net(obs)
        new = torch.distributions.Normal(mean, self.log_std.exp().expand_as(mean))
        return torch.distributions.kl_divergence(old, new).sum(-1)


class GSDEActor(nn.Module):
    """π(a|s) with generalized state-dependent exploration (the module docstring has the definition).

    ``reset_noise(n)`` draws the exploration weights of ``n`` envs; the rollout loop calls it at the start of
    every rollout and every ``sde_sample_freq`` steps (``postrl.control.buffer.collect_rollout``). ``act`` on
    a batch whose size differs from the drawn weights' (a fresh actor, an evaluation with another number of
    envs) draws new ones first.
    """

    discrete = False
    use_sde = True
    epsilon = 1e-6  # added to the variance, as SB3's StateDependentNoiseDistribution

    def __init__(self, obs_dim: int, act_dim: int, cfg: PolicyConfig):
        super().__init__()
        self.net = mlp(obs_dim, cfg.hidden, act_dim, cfg.activation, 0.01, cfg.ortho_init)
        features = cfg.hidden[-1] if cfg.hidden else obs_dim
        self.log_std = nn.Parameter(torch.full((features, act_dim), float(cfg.log_std_init)))
        self.sde_sample_freq = cfg.sde_sample_freq
        self.exploration: torch.Tensor | None = None  # [E, F, A] ε per env

    def features_and_mean(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(f(s) ``[N, F]``, detached; μ(s) ``[N, A]``)."""
        *hidden, last = self.net.layers
        x = obs
        for layer in hidden:
            x = self.net.activation(F.linear(x, layer.weight, layer.bias))
        return x.detach(), F.linear(x, last.weight, last.bias)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Mean action μ(s) ``[N, act_dim]``."""
        return self.net(obs)

    def std_of(self, features: torch.Tensor) -> torch.Tensor:
        """σ_a(s) = sqrt(Σ_j f_j(s)² σ_ja² + 1e-6) ``[N, A]``: the std of f(s)·ε, ε ~ N(0, σ²)."""
        return torch.sqrt((features * features) @ torch.exp(2 * self.log_std) + self.epsilon)

    @torch.no_grad()
    def reset_noise(self, n_envs: int, generator: torch.Generator | None = None) -> None:
        """Draw ε_e ~ N(0, σ²) ``[F, A]`` for each of ``n_envs`` envs."""
        z = torch.randn((n_envs, *self.log_std.shape), generator=generator, dtype=self.log_std.dtype)
        self.exploration = z * self.log_std.exp()

    def act(self, obs: torch.Tensor, deterministic: bool = False, generator=None):
        """Sample (or take the mean) ``[N, act_dim]`` and the log-prob of the unclipped sample ``[N]``."""
        features, mean = self.features_and_mean(obs)
        std = self.std_of(features)
        if deterministic:
            actions = mean
        else:
            if self.exploration is None or self.exploration.shape[0] != obs.shape[0]:
                self.reset_noise(obs.shape[0], generator)
            actions = mean + torch.bmm(features.unsqueeze(1), self.exploration).squeeze(1)
        return actions, diag_gaussian_log_prob(actions, mean, std.log())

    def evaluate(
        self, obs: torch.Tensor, actions: torch.Tensor, with_entropy: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(log π(a|s) ``[N]``, entropy ``[N]`` or None when not asked for), differentiable."""
        features, mean = self.features_and_mean(obs)
        log_std = self.std_of(features).log()
        entropy = diag_gaussian_entropy(log_std) if with_entropy else None
        return diag_gaussian_log_prob(actions, mean, log_std), entropy

    def dist_params(self, obs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        features, mean = self.features_and_mean(obs)
        return mean, self.std_of(features).log()

    def kl(self, old_params: tuple[torch.Tensor, ...], obs: torch.Tensor) -> torch.Tensor:
        """KL(π_old(·|s) ‖ π(·|s)) per state ``[N]`` (exact, via ``torch.distributions``)."""
        old_mean, old_log_std = (p.detach() for p in old_params)
        old = torch.distributions.Normal(old_mean, old_log_std.exp())
        features, mean = self.features_and_mean(obs)
        new = torch.distributions.Normal(mean, self.std_of(features))
        return torch.distributions.kl_divergence(old, new).sum(-1)


def make_actor(obs_space: gym.Space, action_space: gym.Space, cfg: PolicyConfig) -> nn.Module:
    """The actor for a flat Box observation space and a Discrete or Box action space."""
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        raise ValueError(f"postrl.control MLP policies need a flat Box observation space, got {obs_space}")
    obs_dim = obs_space.shape[0]
    if cfg.use_sde and not isinstance(action_space, gym.spaces.Box):
        raise ConfigError(f"'policy.use_sde' needs a Box action space; this env's is {action_space}")
    if isinstance(action_space, gym.spaces.Discrete):
        return CategoricalActor(obs_dim, int(action_space.n), cfg)
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        if cfg.use_sde:
            return GSDEActor(obs_dim, action_space.shape[0], cfg)
        return GaussianActor(obs_dim, action_space.shape[0], cfg)
    raise ValueError(f"unsupported action space {action_space}: need Discrete or a 1-D Box")
