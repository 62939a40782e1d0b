"""Classic-control PPO under torchrun, run by the tests with 1 process or 2.

``python -m torch.distributed.run --standalone --nproc_per_node 2 control_ppo_run.py OUT_DIR``:

1. one PPO update (3 epochs on the whole batch, advantages whitened over it, gradient clipping) on the same
   global rollout of 8 envs × 16 steps, each rank holding the rows of its 4 envs: rank 0 saves actor and
   critic to ``OUT_DIR/update_{actor,critic}.safetensors``;
2. a 4-iteration `train` of 2 ranks × 4 CartPole envs (minibatches of 64 rows, 32 per rank) into
   ``OUT_DIR/straight``, checkpoints every 2 iterations; then a resume from its iteration-2 checkpoint into
   ``OUT_DIR/resumed``, which must end with the straight run's weights.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from postrl.control.buffer import collect_rollout
from postrl.control.envs import EnvConfig, VecEnv
from postrl.control.loop import ControlRunConfig, train_from_config
from postrl.control.ppo import ControlPPOConfig, PPOHyperparams, PPOLearner
from postrl.core import gae
from postrl.runtime import distributed as dist
from postrl.runtime.seeding import seed_everything

N_ENVS, N_STEPS = 8, 16


def update_config() -> ControlPPOConfig:
    ppo = PPOHyperparams(n_steps=N_STEPS, batch_size=N_ENVS * N_STEPS, epochs=3, ent_coef=0.01, vf_clip=0.2)
    return ControlPPOConfig(env=EnvConfig(n_envs=N_ENVS), ppo=ppo)


def one_update(info: dist.DistInfo) -> PPOLearner:
    """This rank's envs' rows of one global rollout (the same on every rank) through `PPOLearner.update`."""
    cfg = update_config()
    seed_everything(0)
    env = VecEnv(cfg.env, 0)
    env.reset()
    agent = PPOLearner(cfg, env)
    buf = agent.buffer
    collect_rollout(env, agent.actor, agent.critic, buf)
    advantages, returns = gae(
        buf.rewards, buf.values, buf.next_values(), buf.terminated, buf.episode_end, 0.99, 0.95
    )
    envs = dist.shard_range(
        N_ENVS, info
    )  # flattened rows are env-major: env e holds rows e·T ... e·T + T − 1
    rows = torch.arange(envs.start * N_STEPS, envs.stop * N_STEPS)
    agent.update(buf.flatten(advantages, returns).take(rows), clip_eps=0.2)
    env.close()
    return agent


def run_config() -> ControlPPOConfig:
    return ControlPPOConfig(
        env=EnvConfig(n_envs=4),
        ppo=PPOHyperparams(n_steps=16, batch_size=64, epochs=2),
        run=ControlRunConfig(steps=4 * 2 * 4 * 16, eval_episodes=2, save_every=2, keep_last=4),
    )


def main(out: Path) -> None:
    info = dist.init_distributed("cpu")
    agent = one_update(info)
    if info.is_main:
        for name, module in agent.modules.items():
            # copies: the parameters are views of one flat tensor (PPO's FlatParameters)
            weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
            save_file(weights, str(out / f"update_{name}.safetensors"))
    cfg = run_config()
    train_from_config(cfg, out / "straight")
    if info.is_main:  # the resumed run starts from the iteration-2 checkpoint of the straight one
        shutil.copytree(out / "straight" / "checkpoints" / "step_00000256",
                        out / "resumed" / "checkpoints" / "step_00000256")  # fmt: skip
    dist.barrier()
    train_from_config(replace(cfg, run=replace(cfg.run, save_every=0)), out / "resumed", resume=True)
    dist.cleanup()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
