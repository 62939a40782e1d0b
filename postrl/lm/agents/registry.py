"""Environment ids: the built-in text environments, any Gymnasium id with discrete actions, and the same worlds
observed through pictures (for vision-language policies)."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from postrl.lm.agents.env import AgentError, TextEnv, reset_env, step_env
from postrl.lm.agents.games import CalculatorEnv, GuessNumberEnv
from postrl.lm.agents.gym_text import GymTextEnv

GYM_PREFIX = "gym:"
"""``gym:<id>``: any registered Gymnasium environment with a Discrete action space, e.g. ``gym:Taxi-v4``"""
PICTURES_PREFIX = "pictures:"
"""``pictures:<id>``: the same, observed through its ``rgb_array`` render (`postrl.lm.agents.pictures`)"""


def _pictures(env_id: str, **kwargs: Any) -> TextEnv:
    from postrl.lm.agents.pictures import PictureGymEnv  # deferred: it imports postrl.lm.vlm (transformers)

    return PictureGymEnv(env_id, **kwargs)


ENVS: dict[str, Callable[..., TextEnv]] = {
    "calculator": CalculatorEnv,
    "guess_number": GuessNumberEnv,
    "frozenlake": lambda **kw: GymTextEnv("FrozenLake-v1", **{"is_slippery": False, **kw}),
    "cliffwalking": lambda **kw: GymTextEnv("CliffWalking-v1", **{"invalid_penalty": -1.0, **kw}),
    "taxi": lambda **kw: GymTextEnv("Taxi-v4", **{"invalid_penalty": -1.0, **kw}),
    "frozenlake_pictures": lambda **kw: _pictures("FrozenLake-v1", **{"is_slippery": False, **kw}),
}
"""the built-in environments by id (``frozenlake`` is the deterministic 4×4 lake; ``frozenlake_pictures`` the
same lake observed through pictures; in ``cliffwalking`` and ``taxi`` a reply without an action costs −1, as a
step does: at 0 a policy would learn to write no action, which costs the turn but never a step)"""
PICTURE_ENVS = ("frozenlake_pictures",)
"""the built-in ids whose observations are pictures"""


def env_ids() -> list[str]:
    """The built-in ids (``gym:<id>`` and ``pictures:<id>`` take any Gymnasium id besides)."""
    return sorted(ENVS)


def returns_pictures(env_id: str) -> bool:
    """Whether ``env_id``'s observations are pictures (a policy for it is a vision-language model)."""
    return env_id.startswith(PICTURES_PREFIX) or env_id in PICTURE_ENVS


def make_env(env_id: str, **kwargs: Any) -> TextEnv:
    """A fresh environment for ``env_id`` (a built-in id, ``gym:<Gymnasium id>`` or ``pictures:<Gymnasium
    id>``), or an `AgentError` that names the id and the closest known ones."""
    if env_id.startswith(GYM_PREFIX):
        return GymTextEnv(env_id[len(GYM_PREFIX) :], **kwargs)
    if env_id.startswith(PICTURES_PREFIX):
        return _pictures(env_id[len(PICTURES_PREFIX) :], **kwargs)
    if env_id in ENVS:
        try:
            return ENVS[env_id](**kwargs)
        except TypeError as err:
            raise AgentError(f"environment {env_id!r}: {err}") from err
    close = difflib.get_close_matches(env_id, [*ENVS, *(GYM_PREFIX + k for k in gym.registry)], n=3)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    raise AgentError(
        f"unknown environment {env_id!r}: expected one of {', '.join(env_ids())}, gym:<Gymnasium id> or"
        f" pictures:<Gymnasium id>{hint}"
    )


def check_env(env_id: str, options: dict[str, Any]) -> None:
    """What a trainer asks of an environment before it loads a model: it is made (an unknown id or option is
    an `AgentError`), resets and takes one step on an empty reply (a `reset` or `step` that raises is an
    `AgentError` naming the environment and where its method is). A fresh environment, thrown away."""
    env = make_env(env_id, **options)
    reset_env(env, seed=0, options=None)
    step_env(env, "", turn=0)
