"""Two `VecEnv`s stepped side by side: the comparison the env tests share."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from postrl.control.envs import VecEnv


def assert_same_steps(
    ours: VecEnv, theirs: VecEnv, actions_of: Callable[[np.ndarray], np.ndarray], steps: int
) -> dict[str, int]:
    """Step both with ``actions_of(ours.obs)`` for ``steps`` steps; every step's observations, rewards, both
    flags and final observations (values and dtypes) and its ended episodes must be equal. Returns how many
    copies terminated, truncated, and did both on one step."""
    ended = {"terminated": 0, "truncated": 0, "both": 0}
    for _ in range(steps):
        actions = actions_of(ours.obs)
        a, b = ours.step(actions), theirs.step(actions)
        for name in ("obs", "rewards", "terminated", "truncated", "final_obs"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None) == (y is None), name
            if x is not None:
                np.testing.assert_array_equal(x, y, err_msg=name)
                assert x.dtype == y.dtype, name
        assert a.episodes == b.episodes
        ended["terminated"] += int(a.terminated.sum())
        ended["truncated"] += int(a.truncated.sum())
        ended["both"] += int((a.terminated & a.truncated).sum())
    return ended
