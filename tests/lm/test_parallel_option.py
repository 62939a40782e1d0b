"""``parallel=fsdp`` where it is offered and where it is refused with the reason (the RL trainers sample)."""

from __future__ import annotations

import pytest

from postrl.lm.grpo import GRPOConfig, _check_config
from postrl.lm.ppo import PPOConfig, check_config
from postrl.runtime.errors import UserError

REFUSED = r"parallel=fsdp: the RL trainers that sample \(ppo, grpo\) run with parallel=ddp only"


def test_ppo_refuses_fsdp():
    with pytest.raises(UserError, match=REFUSED):
        check_config(PPOConfig(parallel="fsdp"))


def test_grpo_refuses_fsdp():
    with pytest.raises(UserError, match=REFUSED):
        _check_config(GRPOConfig(parallel="fsdp"), 1)
    _check_config(GRPOConfig(parallel="ddp"), 1)  # the default passes
