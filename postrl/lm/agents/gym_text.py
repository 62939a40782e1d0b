"""Any Gymnasium environment with a discrete action space as a text environment.

The observation is rendered as text (the environment's ``ansi`` render where it has one, with the coloured
cell, the agent's, written ``[c]``; its state number otherwise) and the action is read from the reply: the last
action name it writes (``left``, ``pickup``, …, for the tabular worlds whose actions have names) or the last
action number. A reply with no action is answered with the list of actions and costs the turn, not a step of
the world.

``view="local"`` (the grid worlds FrozenLake and CliffWalking) renders each observation as the agent's row and
column and the 3×3 cells around it, and the first prompt the map's size besides: CliffWalking's ansi render
writes every cell with two spaces around it, so its first prompt is 173 tokens of the built-in tokenizer and
each observation 115, and the 13 moves of its shortest path are about 1,700 tokens, more than the built-in
model's 512 positions; in the local view the first prompt is 106 tokens and an observation 21 at most. The
map is not shown: a policy learns it from what it sees, as a tabular learner does (a map of one letter a cell
would add 34 tokens to CliffWalking's first prompt).

`postrl.control` is not imported (DESIGN.md: `control` and `lm` never import each other); this uses gymnasium
directly.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
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

VIEWS = ("grid", "local")
"""grid: the whole ansi render at every step; local: the agent's row, column and the 3×3 cells around it"""


def _cliff_cells(env: Any) -> list[str]:
    """CliffWalking's cells as its ansi render writes them: ``o`` ground, ``C`` cliff, ``T`` the goal."""
    rows, cols = env.shape
    cells = [["C" if env._cliff[r, c] else "o" for c in range(cols)] for r in range(rows)]
    cells[rows - 1][cols - 1] = "T"
    return ["".join(row) for row in cells]


CELLS: dict[str, Callable[[Any], list[str]]] = {
    "FrozenLake": lambda env: ["".join(row) for row in env.desc.astype(str)],
    "CliffWalking": _cliff_cells,
}
"""the map of each grid world, one letter a cell, from its unwrapped environment (the state is row · cols +
column)"""

_COLOURED = re.compile(r"\x1b\[[0-9;]*m(.*?)\x1b\[0m", re.DOTALL)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _family(env_id: str) -> str:
    return env_id.split("/")[-1].split("-")[0]


class GymTextEnv(TextEnv):
    """A Gymnasium environment with ``Discrete`` actions, played in text.

    Args:
        env_id: a registered Gymnasium id, e.g. ``FrozenLake-v1``, ``CliffWalking-v1``, ``Taxi-v4``.
        invalid_penalty: reward of a reply in which no action can be read.
        view: ``grid``, the ansi render at every step; ``local`` (FrozenLake, CliffWalking): the agent's row,
            column and the 3×3 cells around it (``#`` off the map).
        make_kwargs: passed to ``gymnasium.make`` (e.g. ``is_slippery=False``).
    """

    def __init__(
        self, env_id: str, invalid_penalty: float = 0.0, view: str = "grid", **make_kwargs: Any
    ) -> None:
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
        if view not in VIEWS:
            raise AgentError(f"view must be one of {', '.join(VIEWS)}, got {view!r}")
        if view == "local" and _family(env_id) not in CELLS:
            raise AgentError(
                f"view 'local' needs a grid world ({', '.join(CELLS)}); {env_id} has no map of cells:"
                " use view 'grid'"
            )
        self.view = view

    def action_list(self) -> str:
        if self.names:
            return ", ".join(self.names)
        return ", ".join(str(a) for a in range(self.n_actions))

    def cells(self) -> list[str]:
        """The map of a grid world (FrozenLake, CliffWalking), one string of cell letters per row."""
        return CELLS[_family(self.env_id)](self.env.unwrapped)

    def render(self, state: Any) -> str:
        """The observation as text: the ansi render (coloured cells as ``[c]``) and the state, or in the local
        view the agent's row and column and the 3×3 cells around it, the agent's at the centre."""
        if self.view == "local":
            cells = self.cells()
            row, col = divmod(int(state), len(cells[0]))
            window = [
                "".join(
                    cells[r][c] if 0 <= r < len(cells) and 0 <= c < len(cells[0]) else "#"
                    for c in range(col - 1, col + 2)
                )
                for r in range(row - 1, row + 2)
            ]
            return f"row {row} col {col}\n" + "\n".join(window)
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
        intro = f"You act in {self.env_id}."
        if self.view == "local":
            cells = self.cells()
            intro = f"You act in {self.env_id}, {len(cells)} rows by {len(cells[0])} columns, # off the map."
        prompt = f"{intro}\n{self.render(state)}\nActions: {self.action_list()}. Reply with one action."
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
