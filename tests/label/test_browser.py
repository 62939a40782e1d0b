"""The labelling page in a real browser: headless Chromium (Debian's package) driven by Selenium against a
uvicorn server on a free port. A person types a name, labels a round with keys and clicks (left, right, tie,
skip, undo), and the preferences file holds exactly the rows those choices mean; a second labeller then sees
the agreement, and a reload continues where the first left off."""

from __future__ import annotations

import json

import pytest

from benchmarks.label_page import act, browser_problem, log_in, make_driver, shown_pair, wait_until
from postrl.label.pairs import swapped

problem = browser_problem()
if problem:
    pytest.skip(f"no browser to drive: {problem}", allow_module_level=True)

from postrl.label.app import Labelling, running  # noqa: E402

PAIRS = [
    {"prompt": f"Review of dish {i}:", "responses": [f" was good {i} .", f" was bad {i} ."]} for i in range(6)
]


@pytest.fixture
def driver():
    d = make_driver()
    yield d
    d.quit()


def _rows(folder):
    return [json.loads(line) for line in (folder / "preferences.jsonl").read_text().splitlines()]


def _left_right(i):
    a, b = PAIRS[i]["responses"]
    return (b, a) if swapped(i) else (a, b)


def test_a_round_of_labels_in_the_browser(tmp_path, driver):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    src = tmp_path / "pairs.jsonl"
    src.write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    labelling = Labelling(tmp_path / "lab", src)
    with running(labelling) as url:
        assert url.startswith("http://127.0.0.1:")
        log_in(driver, url, "ada")
        assert shown_pair(driver) == "0" and driver.find_element(By.ID, "count").text == "0 of 6 judged"
        left, right = _left_right(0)
        assert driver.find_element(By.ID, "left").text.endswith(left.strip())
        assert driver.find_element(By.ID, "right").text.endswith(right.strip())
        act(driver, "1")  # pair 0: left
        act(driver, click="right")  # pair 1: right
        act(driver, "0")  # pair 2: tie
        act(driver, "s")  # pair 3: skip
        act(driver, Keys.ARROW_RIGHT)  # pair 4: right ...
        act(driver, "u")  # ... undone: pair 4 again
        assert shown_pair(driver) == "4"
        act(driver, click="tie")  # pair 4: tie
        assert driver.find_element(By.ID, "count").text == "5 of 6 judged"
        assert driver.find_element(By.ID, "skips").text == "1 skipped"

        rows = _rows(tmp_path / "lab")
        expected = [(0, "left"), (1, "right"), (2, "tie"), (4, "tie")]
        assert [r["pair"] for r in rows] == [p for p, _ in expected]
        for row, (i, choice) in zip(rows, expected, strict=True):
            left, right = _left_right(i)
            chosen = right if choice == "right" else left
            assert (row["chosen"], row["target"], row["labeller"]) == (
                chosen,
                0.5 if choice == "tie" else 1.0,
                "ada",
            )

        # a reload (or a restart of the page) continues at the first pair not yet judged
        driver.refresh()
        log_in(driver, url, "ada")
        assert shown_pair(driver) == "5"
        act(driver, "1")
        wait_until(
            driver, lambda d: not d.find_element(By.ID, "finished").get_attribute("class").count("hidden")
        )

        # a second labeller: agreement with ada on the pairs both judged
        log_in(driver, url, "bob")
        act(driver, "1")  # pair 0: left, as ada
        act(driver, "1")  # pair 1: left, ada said right
        agree = driver.find_element(By.ID, "agree").text
        assert "ada" in agree and "50%" in agree and "2 shared" in agree
    assert len(_rows(tmp_path / "lab")) == 7


def test_a_vision_language_pair_shows_its_picture(tmp_path, driver):
    from PIL import Image
    from selenium.webdriver.common.by import By

    Image.new("RGB", (64, 48), (200, 30, 30)).save(tmp_path / "red.png")
    prompt = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is it?"}]}
    ]
    src = tmp_path / "pairs.jsonl"
    src.write_text(
        json.dumps({"prompt": prompt, "responses": ["Red.", "Blue."], "images": ["red.png"]}) + "\n"
    )
    with running(Labelling(tmp_path / "lab", src)) as url:
        log_in(driver, url, "ada")
        picture = driver.find_element(By.CSS_SELECTOR, "#images img")
        wait_until(driver, lambda d: d.execute_script("return arguments[0].naturalWidth", picture) == 64)
        assert "What colour is it?" in driver.find_element(By.ID, "prompt").text
        act(driver, "2")
    row = _rows(tmp_path / "lab")[0]
    assert row["images"][0].startswith("media/") and row["prompt"] == prompt
