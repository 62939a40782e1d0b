"""The built-in visual task `shapes`: scenes, splits, the verifier, the image-free baseline and the export."""

from __future__ import annotations

import json

import pytest

from postrl.lm.tasks import TaskError, get_task
from postrl.lm.tasks.shapes import KINDS, Scene, normalise, render


def test_splits_disjoint_deterministic_and_balanced() -> None:
    task = get_task("shapes", n_train=600, n_test=100)
    train, test = task.scenes("train"), task.scenes("test")
    assert len(train) == 600 and len(test) == 100
    assert not {s.key for s in train} & {s.key for s in test}
    assert get_task("shapes", n_train=600, n_test=100).scenes("test") == test
    assert {s.kind for s in train} == set(KINDS)
    assert get_task("shapes", seed=1, n_train=600, n_test=100).scenes("test") != test


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_pictures_decide_the_answer(difficulty: int) -> None:
    # the question text alone is no better than chance: the best image-free guess per question text
    task = get_task("shapes", difficulty=difficulty, n_train=3000, n_test=600)
    chance = task.chance_accuracy("test")
    assert 0.2 < chance < 0.4
    assert abs(task.prior_accuracy("test") - chance) < 0.07  # 600 scenes: sd ≈ 0.019


def test_rows_images_and_rewards() -> None:
    task = get_task("shapes", n_train=50, n_test=20, image_size=48)
    row = task.sft_rows("test")[0]
    assert row["images"][0].size == (48, 48) and row["images"][0].mode == "RGB"
    assert row["prompt"][0]["content"][0] == {"type": "image"}
    assert row["completion"] == [{"role": "assistant", "content": row["answer"]}]
    answers = ["3", "red"]
    assert task.reward_fn(
        ["p", "p"], [" 3.", [{"role": "assistant", "content": "Blue"}]], answer=answers
    ) == [
        1.0,
        0.0,
    ]
    assert normalise(" Left, I think") == "left"
    with pytest.raises(TaskError, match="answer"):
        task.reward_fn(["p"], ["3"])
    with pytest.raises(TaskError, match="kinds"):
        get_task("shapes", kinds="count,size")


def test_rendering_shows_the_scene() -> None:
    # two dots: exactly the pixels of their colour appear; a digit darkens pixels; bars differ in height
    scene = Scene(
        "count", "How many dots are there?", "2", (("dot", "red", 8, 8, 3), ("dot", "red", 24, 24, 3))
    )
    image = render(scene)
    assert image.getpixel((8, 8)) == (220, 30, 30) and image.getpixel((16, 16)) == (255, 255, 255)
    digit = render(Scene("digit", "What digit is shown?", "7", (("digit7", "black", 16, 16, 24),)))
    assert min(digit.convert("L").tobytes()) < 100
    bars = render(Scene("bars", "q", "left", (("bar", "blue", 10, 20, 5), ("bar", "blue", 22, 5, 5))))
    assert bars.getpixel((10, 15)) != (255, 255, 255) and bars.getpixel((22, 15)) == (255, 255, 255)


def test_export_is_trl_vision_jsonl(tmp_path) -> None:
    from PIL import Image

    task = get_task("shapes", n_train=10, n_test=5)
    path = task.export(tmp_path, "sft", "test")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 5 and set(rows[0]) >= {"images", "prompt", "completion", "answer"}
    image = Image.open(tmp_path / rows[0]["images"][0])
    assert image.size == (32, 32)
    assert image.convert("RGB").tobytes() == task.sft_rows("test")[0]["images"][0].tobytes()


def test_blank_pictures_keep_the_questions() -> None:
    task, blank = (
        get_task("shapes", n_train=20, n_test=5),
        get_task("shapes", n_train=20, n_test=5, blank=True),
    )
    assert blank.scenes("test") == task.scenes("test")
    assert set(blank.sft_rows("test")[0]["images"][0].tobytes()) == {255}
