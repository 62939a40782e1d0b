"""The LM's return on CliffWalking as text, from a warm start, vs random and vs tabular Q-learning (issue #35,
Show (b)). Ends with ONE JSON line (also written to benchmarks/results/agents_cliffwalking.json).

The recipe of benchmarks/agents_frozenlake.py (its docstring: SFT warm start on scripted episodes played in the
text environment, GRPO from it, greedy and sampled evaluation on held-out seeds, the same options), on the 4×12
CliffWalking: −1 a step, −100 and back to the start for a step off the cliff, the goal ends the episode; the
shortest path (up, 11 × right along the cliff's edge, down) returns −13, tabular Q-learning's optimum. Episodes
of at most ``MAX_TURNS`` = 14 replies (the optimum and one more: a policy that dawdles is truncated at −14 or
less). What differs from the lake:

- the observation is ``make_env("cliffwalking", view="local")``: the agent's row and column and the 3×3 cells
  around it (21 tokens of the built-in tokenizer at most, the first prompt 106). With the full ansi grid
  (173-token prompt, 115 tokens a step) the 13 moves of the optimum are about 1,700 tokens, past the built-in
  model's 512 positions; in the local view 14 turns of valid replies take at most 106 + 13 × 27 + 6 = 463;
- a reply with no action costs −2 (``invalid_penalty``; the registry's default for cliffwalking is −1, a
  step's cost). The rollout cuts an episode whose conversation fills the model's positions
  (``sampled_cut_at_context`` counts them), and in a world that charges every step a cut before the goal can
  pay: a first run with −1 and a 172-token first prompt (the map shown) learned it, every episode of GRPO's
  last 8 steps cut at turn 8 (return −8, "better" than the optimum's −13), its replies no actions, each
  answered by a 42-token "No action read" message. At −2 and this prompt every way to fill the 512 positions
  within 13 turns costs at least 16 (10 moves and 3 such replies), so no cut beats the goal;
- the scripted player's best action in each state is value iteration's (`postrl.control.tabular`, γ 0.99: the
  shortest path that keeps off the cliff, ties to the lower action number); ``--script safe`` plays uniformly
  among the moves that stay off the cliff;
- random: uniformly random actions for 14 steps (Monte Carlo, 400 episodes); Q-learning: 500 episodes, α 0.5,
  ε 0.1 (tests/control/test_tabular.py's), its greedy policy's return.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/agents_cliffwalking.py --seeds 0 1 2 \
        --workdir /tmp/agents-cliffwalking
    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/agents_cliffwalking.py --seeds 0 1 2 \
        --sft-steps 40 --workdir /tmp/agents-cliffwalking-sft40

Measured 2026-12-06 on the shared 2-core machine with the two commands above: 02:29-02:33 UTC (load average
1.6-2.5; an SFT warm start of 10 steps took 19-24 s, 40 GRPO steps 31-57 s) and 02:33-02:40 UTC (load 1.6-3.2;
40 SFT steps 76-98 s, GRPO 40-55 s). References: uniformly random actions −207.3 (14 steps, 400 episodes);
tabular Q-learning's greedy policy −13, the optimum. The base model: greedy −18, sampled −108.8, an action in
21% of its replies, every sampled episode cut at the context (its replies no action, each answered by the
42-token message: that is what the −2 is for).
- defaults (10 SFT steps): the warm start writes an action in 93-96% of its replies but has not learned
  where: greedy −1400 / −1400 / −14 (seeds 0 and 1 step off the cliff every turn), sampled −684.7 / −581.1 /
  −73.4, no sampled episode at the goal. GRPO (40 × 16 episodes) learns to keep off the cliff, not the way:
  greedy −14 / −14 / −14, sampled −14.0 / −14.0 / −14.0, no episode at the goal. Trajectory credit over 14
  steps of −1 gives no signal toward a goal the group never reaches: every safe episode returns −14.
- ``--sft-steps 40``: the warm start reaches the goal in 30% / 14% / 3% of its sampled episodes (sampled return
  −27.8 / −45.0 / −15.6, greedy −14 on every seed); GRPO from it reaches the optimum greedily on every seed,
  −13 / −13 / −13, as tabular Q-learning does, and sampled −13.1 / −28.9 / −14.7 (mean −18.9), at the goal in
  92% / 70% / 88% of the sampled episodes. No evaluated episode of either warm start or GRPO was cut at the
  context (longest conversation 489 of 512 positions).
"""

from __future__ import annotations

import gymnasium as gym
from agents_frozenlake import World, main, random_return

from postrl.control.tabular import q_learning, value_iteration
from postrl.lm.agents import GymTextEnv

MAX_TURNS = 14
CLIFF = {
    "id": "cliffwalking",
    "options": {"view": "local", "invalid_penalty": -2.0},
    "max_turns": MAX_TURNS,
    "max_tokens": 6 * MAX_TURNS,
}
"""the episodes: agents_credit.train's replies are at most 6 tokens"""


def best_actions(env: GymTextEnv) -> dict[int, int]:
    """Value iteration's greedy action in every state of the world's model."""
    _, policy = value_iteration(env.env, gamma=0.99)
    return {s: int(a) for s, a in enumerate(policy)}


def q_learning_return() -> float:
    """The return of tabular Q-learning's greedy policy within ``MAX_TURNS`` steps."""
    env = gym.make("CliffWalking-v1")
    q, _ = q_learning(env, episodes=500, alpha=0.5, epsilon=0.1, seed=0)
    state, _ = env.reset(seed=0)
    total = 0.0
    for _ in range(MAX_TURNS):
        state, reward, terminated, truncated, _ = env.step(int(q[state].argmax()))
        total += float(reward)
        if terminated or truncated:
            break
    return total


CLIFF_WORLD = World(
    "agents_cliffwalking", CLIFF, best_actions, lambda: random_return(CLIFF), q_learning_return
)

if __name__ == "__main__":
    main(CLIFF_WORLD, __doc__)
