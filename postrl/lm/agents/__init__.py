"""Agents: language policies acting over many turns in text environments, with tools (issue #35).

`TextEnv` (Gymnasium's shape with text actions and message observations), `run_episode` (one episode under a
budget of turns and tokens), TRL's ``tools=`` / ``environment_factory`` conventions (`ToolEnv`), and built-in
environments by id (`make_env`): ``calculator``, ``guess_number``, ``frozenlake``, ``cliffwalking``, ``taxi``
and ``gym:<any Gymnasium id with discrete actions>``; ``frozenlake_pictures`` and ``pictures:<Gymnasium id>``
observed through pictures, for vision-language policies (`postrl.lm.agents.pictures`). The credit per turn is
`postrl.core.turns`.
"""

from postrl.lm.agents.env import AgentError, Episode, EpisodeBudget, TextEnv, as_messages, run_episode
from postrl.lm.agents.games import CalculatorEnv, GuessNumberEnv, carrying_sum
from postrl.lm.agents.gym_text import GymTextEnv
from postrl.lm.agents.registry import ENVS, check_env, env_ids, make_env
from postrl.lm.agents.tools import ToolCall, ToolEnv, call_tool, parse_tool_calls, tool_schema

__all__ = [
    "ENVS",
    "AgentError",
    "CalculatorEnv",
    "Episode",
    "EpisodeBudget",
    "GuessNumberEnv",
    "GymTextEnv",
    "TextEnv",
    "ToolCall",
    "ToolEnv",
    "as_messages",
    "call_tool",
    "carrying_sum",
    "check_env",
    "env_ids",
    "make_env",
    "parse_tool_calls",
    "run_episode",
    "tool_schema",
]
