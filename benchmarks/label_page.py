"""The labelling page in a real browser: screenshots for the docs, and how many labels a minute a person who
uses only the keyboard can give (headless Chromium driven by Selenium, sending each key as soon as the page
shows the next pair).

    .venv/bin/python benchmarks/label_page.py            # docs/img/label_lm.png, label_segments.png, speed
    .venv/bin/python benchmarks/label_page.py --shots    # the screenshots only (also: make label-shots)

Needs Chromium and its driver (Debian: ``apt-get install -y chromium chromium-driver``) and selenium (the
test extra). ``tests/label/test_browser.py`` uses the helpers here.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "img"


def browser_problem() -> str | None:
    """Why a headless Chromium cannot be driven here (None when it can)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install 'postrl[test]')"
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        return "no Chromium (Debian: apt-get install -y chromium chromium-driver)"
    if not shutil.which("chromedriver"):
        return "no chromedriver (Debian: apt-get install -y chromium-driver)"
    return None


def make_driver(width: int = 1280, height: int = 900) -> Any:
    """A headless Chromium (the system's) driven by Selenium."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def wait_until(driver: Any, condition: Any, timeout: float = 20.0) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.005).until(lambda d: condition(d))


def shown_pair(driver: Any) -> str | None:
    """The index of the pair on screen ("" when all are judged, None before the first and while one loads)."""
    return driver.execute_script(
        "return document.body.dataset.ready ? (document.body.dataset.pair ?? null) : null"
    )


def log_in(driver: Any, url: str, name: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver.get(url)
    box = driver.find_element(By.ID, "name")
    box.clear()
    box.send_keys(name, Keys.ENTER)
    wait_until(driver, lambda d: shown_pair(d) is not None)


def act(driver: Any, key: str | None = None, click: str | None = None) -> None:
    """Press ``key`` (or click the button of choice ``click``) and wait until the page has saved it."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    driver.execute_script("document.getElementById('status').textContent = ''")
    if click is not None:
        driver.find_element(By.CSS_SELECTOR, f"button[data-choice='{click}']").click()
    else:
        ActionChains(driver).send_keys(key).perform()
    wait_until(driver, lambda d: d.find_element(By.ID, "status").text in ("saved", "undone"))


def by_true_return(folder: Path, index: int) -> str:
    """The choice (left, right or tie) for segment pair ``index`` of a labelling folder as the page shows it,
    by the two segments' true returns read from the folder's pairs file: a scripted person cannot watch the
    clips, so it reads what they show a person."""
    from postrl.label.pairs import swapped

    row = json.loads((folder / "pairs.jsonl").read_text().splitlines()[index])
    first, second = (sum(row[side]["true_rewards"]) for side in ("first", "second"))
    left, right = (second, first) if swapped(index) else (first, second)
    return "tie" if left == right else "left" if left > right else "right"


def on_screen(driver: Any) -> int | None:
    """The pair the page shows once it has loaded; None while one loads or all are judged (the page clears its
    index while it loads the next pair, so a key is never decided for a pair that is leaving the screen)."""
    index = shown_pair(driver)
    return int(index) if index else None


def label_run(url: str, folder: Path, stop: Any, made: list[int], name: str = "ada") -> None:
    """A scripted person for a running ``postrl control prefs`` (labeller.source page): logs in once the run
    serves the page, then labels each pair the page shows (`by_true_return`, keys 1/2/0) until ``stop`` (a
    threading.Event) is set; appends each pair it judged to ``made``."""
    keys = {"left": "1", "right": "2", "tie": "0"}
    driver = make_driver(1000, 700)
    try:
        for _ in range(1200):  # the run serves the page after its first rollout
            try:
                log_in(driver, url, name)
                break
            except Exception:  # not served yet
                time.sleep(0.1)
        while not stop.is_set():
            index = on_screen(driver)
            if index is None:
                time.sleep(0.05)
                continue
            act(driver, keys[by_true_return(folder, index)])
            made.append(index)
    finally:
        driver.quit()


def _lm_folder(tmp: Path, n: int) -> Any:
    """A folder of ``n`` chat pairs: the reviews task's preference pairs, its prompts as user turns."""
    from postrl.label.app import Labelling
    from postrl.lm.tasks import get_task

    system = {"role": "system", "content": "You write short restaurant reviews."}
    rows = [
        {
            "prompt": [system, {"role": "user", "content": r["prompt"].strip()}],
            "responses": [[{"role": "assistant", "content": r[k].strip()}] for k in ("chosen", "rejected")],
        }
        for r in get_task("reviews").preference_rows("train")[:n]
    ]
    pairs = tmp / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return Labelling(tmp / "lab-lm", pairs)


def _segment_folder(tmp: Path, n: int) -> Any:
    from postrl.label.app import Labelling
    from postrl.label.segments import segment_pairs

    return Labelling(tmp / "lab-seg", segment_pairs("CartPole-v1", tmp / "seg" / "pairs.jsonl", n, seed=2))


def screenshots(tmp: Path, out: Path = DOCS) -> list[Path]:
    """docs/img/label_lm.png and label_segments.png: the page of a second labeller, after a first."""
    from postrl.label.app import running

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, labelling in (
        ("label_lm.png", _lm_folder(tmp, 8)),
        ("label_segments.png", _segment_folder(tmp, 6)),
    ):
        for k in range(3):  # a first labeller, so that the page has agreement to show
            labelling.store.record("ada", k, ("left", "right", "tie")[k])
        driver = make_driver(1280, 860)
        try:
            with running(labelling) as url:
                log_in(driver, url, "grace")
                for key in ("1", "2"):
                    act(driver, key)
                time.sleep(1.2)  # the clips play: the two segments part ways
                driver.save_screenshot(str(out / name))
        finally:
            driver.quit()
        written.append(out / name)
    return written


def labels_per_minute(tmp: Path, kind: str, n: int = 120) -> float:
    """Labels a minute of a keyboard-only labeller who presses 1/2/0 as soon as each pair is shown."""
    from postrl.label.app import Labelling, running

    if kind == "lm":
        pairs = tmp / f"speed-{kind}.jsonl"
        rows = [
            {"prompt": f"Review number {i}:", "responses": [f" was good {i} .", f" was bad {i} ."]}
            for i in range(n)
        ]
        pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
        labelling = Labelling(tmp / f"speed-{kind}", pairs)
    else:
        labelling = _segment_folder(tmp / "speed", n)
    driver = make_driver()
    try:
        with running(labelling) as url:
            log_in(driver, url, "speedy")
            start = time.perf_counter()
            for i in range(n):
                act(driver, "120"[i % 3])
            elapsed = time.perf_counter() - start
    finally:
        driver.quit()
    assert len(labelling.store.made["speedy"]) == n
    return 60 * n / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shots", action="store_true", help="only the screenshots")
    parser.add_argument("--n", type=int, default=120, help="pairs labelled per speed measurement")
    args = parser.parse_args(argv)
    problem = browser_problem()
    if problem:
        print(f"label_page: {problem}", file=sys.stderr)
        return 2
    result: dict[str, Any] = {"pairs": args.n}
    with tempfile.TemporaryDirectory() as tmp:
        for path in screenshots(Path(tmp)):
            print(f"wrote {path.relative_to(ROOT)}")
        if args.shots:
            return 0
        for kind in ("lm", "segments"):
            rate = labels_per_minute(Path(tmp), kind, args.n)
            result[f"labels_per_min_{kind}"] = round(rate, 1)
            print(f"keyboard-only labelling, {kind} pairs: {rate:.0f} labels/min over {args.n} pairs")
    from _record import record  # benchmarks/ is on the path when this runs as a script

    record("label_page", result)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
