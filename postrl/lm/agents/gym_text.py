"""Any Gymnasium environment with a discrete action space as a text environment.

The observation is rendered as text (the environment's ``ansi`` render where it has one, with the coloured
cell, the agent's, written ``[c]``; its state number otherwise) and the action is read from the reply: the last
action name it writes (``left``, ``pickup``, …, for the tabular worlds whose actions have names) or the last
action number. A reply with no action is answered with the list of actions and costs the turn, not a step of
the world. `postrl.control` is not imported (DESIGN.md: `control` and `lm` never import each other); this
uses gymnasium directly.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

from postrl.lm.agents.env import AgentError, Message, TextEnv

ACTION_NAMES: dict[str, tuple[str, ...]] = {
    "FrozenLake": ("left", "down", "right", "up"),
    "CliffWalking": ("up", "right", "down", "left"),
    "Taxi": ("south", "north", "east", "west", "pickup", "dropoff"),
}
"""the names of the actions of Gymnasium's tabular worlds, in the order of their action numbers"""

_COLOURED = re.compile(r"\x1b\[[0-9;]*m(.*?)\x1b\[0m", re.DOTALL)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _family(env_id: str) -> str:
    return env_id.split("/")[-1].split("-")[0]


class GymTextEnv(TextEnv):
    """A Gymnasium environment with ``Discrete`` actions, played in text.

    Args:
        env_id: a registered Gymnasium id, e.g. ``FrozenLake-v1``, ``CliffWalking-v1``, ``Taxi-v4``.
        invalid_penalty: reward of a reply in which no action can be read.
        make_kwargs: passed to ``gymnasium.make`` (e.g. ``is_slippery=False``).
    """

    def __init__(self, env_id: str, invalid_penalty: float = 0.0, **make_kwargs: Any) -> None:
        if env_id not in gym.registry:
            close = difflib.get_close_matches(env_id, list(gym.registry), n=3)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            raise AgentError(f"unknown Gymnasium environment {env_id!r} (not in gymnasium.registry){hint}")
        entry = gym.spec(env_id).entry_point
        creator = load_env_creator(entry) if isinstance(entry, str) else entry
        modes = getattr(creator, "metadata", {}).get("render_modes", [])
        kwargs = {**make_kwargs, **({"render_mode": "ansi"} if "ansi" in modes else {})}
        try:
            self.env = gym.make(env_id, **kwargs)
        except Exception as err:
            raise AgentError(f"gymnasium.make({env_id!r}, **{make_kwargs}) failed: {err}") from err
        if not isinstance(self.env.action_space, gym.spaces.Discrete):
            raise AgentError(
                f"Gymnasium environment {env_id!r} has action space {self.env.action_space}; a text environment"
                " needs a Discrete one"
            )
        self.env_id = env_id
        self.n_actions = int(self.env.action_space.n)
        self.names = ACTION_NAMES.get(_family(env_id), ())
        self.invalid_penalty = invalid_penalty

    def action_list(self) -> str:
        if self.names:
            return ", ".join(self.names)
        return ", ".join(str(a) for a in range(self.n_actions))

    def render(self, state: Any) -> str:
        """The observation as text: the ansi render (coloured cells as ``[c]``) and the state."""
        text = self.env.render() if self.env.render_mode == "ansi" else None
        grid = _ANSI.sub("", _COLOURED.sub(r"[\1]", text)).strip("\n") if isinstance(text, str) else ""
        return f"{grid}\nstate {state}".lstrip("\n")

    def parse_action(self, text: str) -> int | None:
        """The last action named (or numbered) in ``text``, or None."""
        words = re.findall(r"[a-z]+|\d+", text.lower())
        for word in reversed(words):
            if word in self.names:
                return self.names.index(word)
            if word.isdigit() and int(word) < self.n_actions:
                return int(word)
        return None

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        state, info = self.env.reset(seed=seed)
        prompt = (
            f"You act in {self.env_id}.\n{self.render(state)}\n"
            f"Actions: {self.action_list()}. Reply with one action."
        )
        return [{"role": "user", "content": prompt}], dict(info)

    def step(self, action: str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        chosen = self.parse_action(action)
        if chosen is None:
            message = f"No action read. Reply with one of: {self.action_list()}."
            return (
                [{"role": "user", "content": message}],
                self.invalid_penalty,
                False,
                False,
                {"invalid": True},
            )
        state, reward, terminated, truncated, info = self.env.step(chosen)
        observation = [{"role": "user", "content": self.render(state)}]
        return observation, float(reward), bool(terminated), bool(truncated), {**info, "action": chosen}
