"""A vision-language policy acting over turns in an environment whose observations are pictures (issue #35
item 2): FrozenLake rendered with ``rgb_array``, the built-in tiny LLaVA (`postrl/lm/vlm/base_model`)."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from postrl.lm.agents import AgentError, EpisodeBudget
from postrl.lm.agents.pictures import PictureGymEnv, sample_picture_episodes
from postrl.lm.rollout import SamplingConfig
from postrl.lm.vlm import base_model, encode_rows, image_token_id, load_vlm, sft_batch, vlm_score
from postrl.lm.vlm.train import completion_nll


@pytest.fixture(scope="module")
def vlm():
    return load_vlm(str(base_model.path()))


def test_the_observation_is_the_worlds_picture_and_the_action_is_read_from_the_reply():
    env = PictureGymEnv("FrozenLake-v1", is_slippery=False)
    (message,), _ = env.reset(seed=0)
    image, text = message["content"]
    assert message["role"] == "user" and image["type"] == "image" and "left, down, right, up" in text["text"]
    start = np.asarray(image["image"])
    assert start.shape == (256, 256, 3)
    (after,), reward, terminated, _, info = env.step("I go right")
    assert info["action"] == 2 and (reward, terminated) == (0.0, False)
    assert not np.array_equal(np.asarray(after["content"][0]["image"]), start)  # the agent moved
    (same,), _, _, _, info = env.step("no idea")
    assert info["invalid"] and np.array_equal(
        np.asarray(same["content"][0]["image"]), np.asarray(after["content"][0]["image"])
    )


class NoPictures(gym.Env):
    metadata = {"render_modes": ["ansi"]}

    def __init__(self, render_mode=None):
        self.render_mode = render_mode
        self.action_space = gym.spaces.Discrete(2)
        self.observation_space = gym.spaces.Discrete(2)


def test_an_environment_without_pictures_is_refused():
    gym.register("postrl-test/NoPictures-v0", entry_point=NoPictures)
    try:
        with pytest.raises(AgentError, match="NoPictures-v0 has no rgb_array render"):
            PictureGymEnv("postrl-test/NoPictures-v0")
    finally:
        del gym.registry["postrl-test/NoPictures-v0"]


def test_a_vlm_policy_acts_over_turns_and_its_log_probs_are_the_teacher_forced_ones(vlm):
    model, processor = vlm
    envs = [PictureGymEnv("FrozenLake-v1", is_slippery=False) for _ in range(3)]
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.0)
    gen = torch.Generator().manual_seed(0)
    out = sample_picture_episodes(
        model, processor, envs, sampling, EpisodeBudget(3, 18), gen, seeds=[0, 1, 2]
    )
    image = image_token_id(model, processor)
    encoded = processor(text=["<image>"], images=[envs[0].picture()], return_tensors="pt")
    per_picture = int((encoded["input_ids"][0] == image).sum())
    turns = [len(ep.actions) for ep in out.episodes]
    assert max(turns) > 1
    # one picture at the start and one after every reply but the last; each as the processor's placeholders
    assert out.pictures_per_row == turns
    assert (out.input_ids == image).sum(-1).tolist() == [n * per_picture for n in turns]
    assert out.pixel_values.shape[0] == sum(turns)
    after = out.input_ids[:, out.prompt_len :]
    assert not bool(((after == image) & (out.action_mask == 1)).any())  # placeholders: context, never actions
    act = out.action_mask.bool()
    images = {"pixel_values": out.pixel_values}
    args = (out.input_ids, out.attention_mask, out.prompt_len)
    scored = vlm_score(model, *args, images, temperature=1.0, banned=[image], share=False)
    torch.testing.assert_close(scored[act], out.log_probs[act], atol=1e-4, rtol=0)
    # the policy sees the pictures: blank ones give other log-probs
    blank = vlm_score(
        model, *args, {"pixel_values": torch.zeros_like(out.pixel_values)}, banned=[image], share=False
    )
    assert (blank[act] - scored[act]).abs().max() > 1e-3


def test_keeping_the_vlm_cache_across_turns_gives_the_episodes_of_re_prefilling(vlm):
    model, processor = vlm
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.3)
    out = {}
    for kv in ("reuse", "prefill"):
        envs = [PictureGymEnv("FrozenLake-v1", is_slippery=False) for _ in range(4)]
        gen = torch.Generator().manual_seed(3)
        budget = EpisodeBudget(3, 14)  # some replies cut by the token budget, some rows ending first
        out[kv] = sample_picture_episodes(model, processor, envs, sampling, budget, gen, [0, 0, 1, 2], kv)
    a, b = out["reuse"], out["prefill"]
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.action_mask, b.action_mask)
    torch.testing.assert_close(a.log_probs, b.log_probs, atol=2e-5, rtol=0)
    assert torch.equal(a.pixel_values, b.pixel_values) and a.pictures_per_row == b.pictures_per_row
    assert max(a.pictures_per_row) > 1  # pictures came after the first prompt, through the kept cache


def _sft_row(env: PictureGymEnv, moves: list[str], answer: str) -> dict:
    """An SFT row of a played episode: the conversation after ``moves`` (a picture per observation) → answer."""
    messages, _ = env.reset(seed=0)
    prompt, images = [], []
    for move in [*moves, None]:
        image, text = messages[0]["content"]
        prompt.append({"role": "user", "content": [{"type": "image"}, text]})
        images.append(image["image"])
        if move is not None:
            prompt.append({"role": "assistant", "content": move})
            messages, *_ = env.step(move)
    return {"prompt": prompt, "completion": answer, "images": images}


def test_sft_on_episode_rows_with_different_numbers_of_pictures(vlm):
    # rows of episodes hold one picture per turn; two rows share their prompt, and the batch's 6 pictures
    # split 2 per row though the rows hold 1, 1 and 4 (up and left at the start do not move: the same
    # frame): the shared forward took the first two "rows of pictures" for 5 placeholders and raised
    model, processor = vlm
    env = PictureGymEnv("FrozenLake-v1", is_slippery=False)
    rows = [_sft_row(env, [], "down"), _sft_row(env, [], "down"), _sft_row(env, ["up", "left", "up"], "down")]
    examples = encode_rows(processor, rows, "sft", 512)
    assert [len(e.pixel_values) for e in examples] == [1, 1, 4]
    pad = processor.tokenizer.pad_token_id
    with torch.no_grad():
        nll, count = completion_nll(model, sft_batch(examples, pad))
        alone = [completion_nll(model, sft_batch([e], pad)) for e in examples]
    assert count == sum(n for _, n in alone)
    torch.testing.assert_close(nll, sum(v for v, _ in alone), atol=1e-4, rtol=1e-5)


def test_picture_episodes_are_cut_at_the_models_context_with_their_pictures(vlm):
    model, processor = vlm
    config = model.config.text_config
    positions = config.max_position_embeddings
    envs = [PictureGymEnv("FrozenLake-v1", is_slippery=False) for _ in range(2)]
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.0)
    try:
        config.max_position_embeddings = 100  # the first prompt and about one turn
        out = sample_picture_episodes(
            model, processor, envs, sampling, EpisodeBudget(8, 48), torch.Generator().manual_seed(0), [0, 1]
        )
    finally:
        config.max_position_embeddings = positions
    image = image_token_id(model, processor)
    for i, ep in enumerate(out.episodes):
        assert ep.terminated or ep.infos[-1]["cut"] == "context"
        assert int(out.attention_mask[i].sum()) <= 100
        # every placeholder kept has its picture: the dropped observation took its picture with it
        assert int((out.input_ids[i] == image).sum()) == out.pictures_per_row[i] * int(
            (out.input_ids[0, : out.prompt_len] == image).sum()
        )
    assert any(ep.infos[-1].get("cut") == "context" for ep in out.episodes)
    assert out.pixel_values.shape[0] == sum(out.pictures_per_row)
