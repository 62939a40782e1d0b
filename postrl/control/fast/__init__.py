"""Fast paths of the control algorithms: guests, each pinned by tests to the reference it stands in for.

- ``ppo_step``: PPO's minibatch step by hand (`ppo_step.FusedStep`), chosen once at build time by ``ppo.backend``
  (`ppo_step.use_fused`: ``auto`` takes it when it is exact for the networks and logs which path runs and why
  the other was refused). The reference is ``ReferenceStep`` in `postrl.control.ppo`: `ppo_actor_critic_loss` through
  autograd, ``clip_grad_norm_`` and ``torch.optim.Adam``; tests/control/test_ppo_grad.py pins the two.
- ``ppo_grad``: the hand-written gradient of `postrl.control.ppo.ppo_actor_critic_loss` for postrl's MLP actor and critic.
- ``flat``: the parameters of the actor and critic as views of one flat tensor, Adam on it as one kernel
  (tests/control/test_flat.py pins it to ``torch.optim.Adam`` and ``clip_grad_norm_``).
- ``numpy_actor``: the rollout's actor in numpy, drawing what ``actor.act`` draws (PPO's fused path; A2C and
  TRPO whenever the actor allows; tests/control/test_policies.py).

Nothing in the algorithm files needs these to be read.
"""
