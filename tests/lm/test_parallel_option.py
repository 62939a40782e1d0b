"""``parallel=fsdp`` where it is offered, where it is refused with the reason (PPO-RLHF with a value head on
the actor), and an unknown strategy."""

from __future__ import annotations

import pytest

from postrl.lm.grpo import GRPOConfig
from postrl.lm.grpo.build import check_grpo_config
from postrl.lm.ppo import PPOConfig, check_ppo_config
from postrl.lm.spine import RunConfig
from postrl.runtime.errors import UserError

UNKNOWN = r"parallel must be one of \('ddp', 'fsdp'\), got 'zero3'"


def test_ppo_offers_fsdp_with_a_separate_critic():
    check_ppo_config(PPOConfig(run=RunConfig(parallel="fsdp"), critic="sft", reward_model="rm"))
    with pytest.raises(
        UserError, match=r"parallel=fsdp with critic=shared: the value head lives in the actor"
    ):
        check_ppo_config(PPOConfig(run=RunConfig(parallel="fsdp"), critic="shared", reward_model="rm"))
    with pytest.raises(UserError, match=UNKNOWN):
        check_ppo_config(PPOConfig(run=RunConfig(parallel="zero3"), critic="sft", reward_model="rm"))


def test_grpo_offers_fsdp():
    check_grpo_config(GRPOConfig(run=RunConfig(parallel="fsdp")), 1)
    check_grpo_config(GRPOConfig(run=RunConfig(parallel="ddp")), 1)
    with pytest.raises(UserError, match=UNKNOWN):
        check_grpo_config(GRPOConfig(run=RunConfig(parallel="zero3")), 1)
