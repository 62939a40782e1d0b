"""`shapes`: small pictures rendered from a seed, and questions whose answer needs the picture.

Five kinds of question, each with answers drawn uniformly, so that the question text alone says nothing
about the answer (the image-free baseline `prior_accuracy` stays at chance):

    count     "How many dots are there?"              1 … 3 / 5 / 7 dots (difficulty 1 / 2 / 3)
    colour    "What colour is the square?"            red, green, blue, yellow (+ purple, orange at 3)
    position  "Is the circle on the left or the right?"  left, right (nearer the middle as it gets harder)
    bars      "Which bar is taller, left or right?"   left, right (a smaller difference as it gets harder)
    digit     "What digit is shown?"                  0 … 9, drawn with Pillow's default font

From difficulty 2 on, a distractor shape of another kind and colour joins the colour and position scenes.
A scene is a pure function of (seed, split, index); the scene space is partitioned once by a stable hash of
each scene's parameters, so a held-out picture never appears in the train split.

Rows are in TRL's vision format: ``images`` (a list of PIL images), a conversational ``prompt`` whose user
turn holds ``{"type": "image"}`` and the question, ``completion`` (an assistant turn) and ``answer``.
`ShapesTask.export` writes them as JSONL with the images as PNG files (``images``: relative paths).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from postrl.lm.tasks.base import (
    Split,
    Task,
    TaskError,
    check_split,
    completion_text,
    in_test_split,
    split_rng,
)

KINDS = ("count", "colour", "position", "bars", "digit")
COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 170, 40),
    "blue": (30, 60, 220),
    "yellow": (235, 200, 0),
    "purple": (140, 40, 170),
    "orange": (245, 130, 0),
}
SHAPES = ("circle", "square", "triangle")
MAX_COUNT = {1: 3, 2: 5, 3: 7}


@dataclass(frozen=True)
class ShapesConfig:
    """Options of the shapes task."""

    kinds: str = "count,colour,position,bars,digit"
    """question kinds, comma-separated, drawn uniformly (any of count, colour, position, bars, digit)"""
    difficulty: int = 1
    """1 (easy) … 3 (hard): more dots, distractors, closer bars, more colours, smaller digits"""
    image_size: int = 32
    """pictures are image_size × image_size RGB"""
    n_train: int = 4000
    """train scenes"""
    n_test: int = 300
    """held-out scenes (never in train)"""
    test_fraction: float = 0.2
    """share of the scene space reserved for the held-out split"""
    seed: int = 0
    """seed of the split partition and of the scenes"""
    blank: bool = False
    """draw every picture blank (white), the questions and answers unchanged: the image-free baseline"""

    CHECKS = {"difficulty": "[1, 3]", "image_size": ">= 16", "n_train": ">= 1", "n_test": ">= 1"}
    CHECKS |= {"test_fraction": "(0, 1)"}


@dataclass(frozen=True)
class Scene:
    """One picture and its question: ``items`` are (shape, colour name, x, y, size) in a 32-unit frame."""

    kind: str
    question: str
    answer: str
    items: tuple[tuple[str, str, float, float, float], ...]

    @property
    def key(self) -> str:
        return json.dumps([self.kind, self.question, self.answer, self.items])


def _colours(difficulty: int) -> list[str]:
    return list(COLOURS)[: 6 if difficulty >= 3 else 4]


def _free_spot(rng: random.Random, taken: list[tuple[float, float]], gap: float, lo=4.0, hi=28.0):
    for _ in range(200):
        x, y = rng.uniform(lo, hi), rng.uniform(lo, hi)
        if all((x - a) ** 2 + (y - b) ** 2 >= gap**2 for a, b in taken):
            return x, y
    raise RuntimeError("no free spot")  # cannot happen for ≤ 7 dots of radius 2 in 32 units


def _count(rng: random.Random, d: int) -> Scene:
    k = rng.randint(1, MAX_COUNT[d])
    spots: list[tuple[float, float]] = []
    for _ in range(k):
        spots.append(_free_spot(rng, spots, 6.5))
    colour = rng.choice(_colours(d))
    items = tuple(("dot", colour if d < 3 else rng.choice(_colours(d)), x, y, 2.2) for x, y in spots)
    return Scene("count", "How many dots are there?", str(k), items)


def _with_distractor(rng: random.Random, d: int, main: tuple, side: str | None = None) -> tuple:
    """``main`` alone (difficulty 1), else with a shape of another kind and colour: on the other side when
    ``side`` is given (position questions), else anywhere it does not overlap."""
    if d < 2:
        return (main,)
    shape = rng.choice([s for s in SHAPES if s != main[0]])
    colour = rng.choice([c for c in _colours(d) if c != main[1]])
    if side is None:
        x, y = _free_spot(rng, [(main[2], main[3])], 10.0)
    else:
        x, y = (rng.uniform(22, 28) if side == "left" else rng.uniform(4, 10)), rng.uniform(6, 26)
    return (main, (shape, colour, x, y, 3.5))


def _colour(rng: random.Random, d: int) -> Scene:
    shape, colour = rng.choice(SHAPES), rng.choice(_colours(d))
    main = (shape, colour, rng.uniform(8, 24), rng.uniform(8, 24), 5.0 if d < 3 else 3.5)
    return Scene("colour", f"What colour is the {shape}?", colour, _with_distractor(rng, d, main))


def _position(rng: random.Random, d: int) -> Scene:
    shape, side = rng.choice(SHAPES), rng.choice(["left", "right"])
    offset = rng.uniform({1: 8, 2: 5, 3: 3}[d], 11)  # distance from the middle, in 32 units
    x = 16 - offset if side == "left" else 16 + offset
    main = (shape, rng.choice(_colours(d)), x, rng.uniform(6, 26), 4.0)
    question = f"Is the {shape} on the left or the right?"
    return Scene("position", question, side, _with_distractor(rng, d, main, side))


def _bars(rng: random.Random, d: int) -> Scene:
    gap = rng.randint({1: 8, 2: 4, 3: 2}[d], 14)
    short = rng.randint(4, 26 - gap)
    taller = rng.choice(["left", "right"])
    left, right = (short + gap, short) if taller == "left" else (short, short + gap)
    colour = rng.choice(_colours(d))
    items = (("bar", colour, 10.0, float(left), 5.0), ("bar", colour, 22.0, float(right), 5.0))
    return Scene("bars", "Which bar is taller, left or right?", taller, items)


def _digit(rng: random.Random, d: int) -> Scene:
    digit = rng.randint(0, 9)
    colour = "black" if d < 2 else rng.choice(_colours(d))
    size = {1: 24.0, 2: 22.0, 3: 16.0}[d]
    item = ("digit" + str(digit), colour, 16 + rng.uniform(-3, 3), 16 + rng.uniform(-3, 3), size)
    return Scene("digit", "What digit is shown?", str(digit), (item,))


MAKERS = {"count": _count, "colour": _colour, "position": _position, "bars": _bars, "digit": _digit}


def render(scene: Scene, size: int = 32) -> Any:
    """The scene as a ``size`` × ``size`` RGB PIL image (white background)."""
    from PIL import Image, ImageDraw, ImageFont  # deferred: only the image tasks need Pillow

    s = size / 32
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    for shape, colour, x, y, r in scene.items:
        fill = COLOURS.get(colour, (0, 0, 0))
        box = [(x - r) * s, (y - r) * s, (x + r) * s, (y + r) * s]
        if shape in ("dot", "circle"):
            draw.ellipse(box, fill=fill)
        elif shape == "square":
            draw.rectangle(box, fill=fill)
        elif shape == "triangle":
            draw.polygon([(x * s, (y - r) * s), ((x - r) * s, (y + r) * s), ((x + r) * s, (y + r) * s)], fill)
        elif shape == "bar":  # x: centre, y: height from the bottom, r: half width
            draw.rectangle([(x - r) * s, (30 - y) * s, (x + r) * s, 30 * s], fill=fill)
        elif shape.startswith("digit"):
            font = ImageFont.load_default(size=max(6, round(r * s)))
            draw.text((x * s, y * s), shape[5:], fill=fill, font=font, anchor="mm")
    return image


def caption(scene: Scene) -> str:
    """A description of the picture (the alignment stage's target): what is drawn, where, in which colour."""
    if scene.kind == "count":
        colours = sorted({c for _, c, *_ in scene.items})
        what = "dot" if len(scene.items) == 1 else "dots"
        return f"{len(scene.items)} {colours[0] + ' ' if len(colours) == 1 else ''}{what}"
    if scene.kind == "bars":
        (_, colour, _, left, _), (_, _, _, right, _) = scene.items
        return f"two {colour} bars, the {'left' if left > right else 'right'} one taller"
    if scene.kind == "digit":
        shape, colour, *_ = scene.items[0]
        return f"the digit {shape[5:]} in {colour}"
    parts = [f"a {c} {s} on the {'left' if x < 16 else 'right'}" for s, c, x, *_ in scene.items]
    return " and ".join(parts)


def normalise(text: str) -> str:
    """The first word of an answer, lower-cased, without punctuation ("Red." → "red")."""
    words = text.strip().lower().split()
    return words[0].strip(".,!?;:\"'") if words else ""


class ShapesTask(Task):
    """Questions about rendered pictures; reward 1.0 when the completion's first word is the answer."""

    name = "shapes"

    def __init__(self, config: ShapesConfig | None = None) -> None:
        self.config = config or ShapesConfig()
        kinds = [k.strip() for k in self.config.kinds.split(",") if k.strip()]
        bad = [k for k in kinds if k not in KINDS]
        if bad or not kinds:
            raise TaskError(f"kinds: unknown {bad or 'empty'}; choose from {', '.join(KINDS)}")
        if self.config.difficulty not in (1, 2, 3):
            raise TaskError(f"difficulty must be 1, 2 or 3; got {self.config.difficulty}")
        self.kinds = kinds
        self._scenes: dict[str, list[Scene]] = {}

    def scenes(self, split: Split = "train") -> list[Scene]:
        """The unique scenes of ``split``, in a fixed order (kinds drawn uniformly)."""
        check_split(split)
        if split not in self._scenes:
            c = self.config
            rng, wanted = split_rng(c.seed, split, "scenes"), c.n_train if split == "train" else c.n_test
            found: dict[str, Scene] = {}
            for _ in range(wanted * 50):
                if len(found) == wanted:
                    break
                scene = MAKERS[rng.choice(self.kinds)](rng, c.difficulty)
                if in_test_split(scene.key, c.seed, c.test_fraction) == (split == "test"):
                    found.setdefault(scene.key, scene)
            self._scenes[split] = list(found.values())
        return self._scenes[split]

    def image(self, scene: Scene) -> Any:
        """The picture of ``scene`` at this task's size (blank with ``blank``)."""
        return render(replace(scene, items=()) if self.config.blank else scene, self.config.image_size)

    # ---- Task interface --------------------------------------------------------------------------------
    def prompts(self, split: Split = "train") -> list[str]:
        """The question texts alone (what an image-free model sees)."""
        return [s.question for s in self.scenes(split)]

    def prompt_rows(self, split: Split = "train") -> list[dict[str, Any]]:
        """``{"images", "prompt", "answer", "kind"}`` rows in TRL's conversational vision format."""
        return [
            {
                "images": [self.image(s)],
                "prompt": [
                    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": s.question}]}
                ],
                "answer": s.answer,
                "kind": s.kind,
            }
            for s in self.scenes(split)
        ]

    def sft_rows(self, split: Split = "train") -> list[dict[str, Any]]:
        """Prompt rows plus ``completion``: the assistant turn holding the answer."""
        rows = self.prompt_rows(split)
        return [{**r, "completion": [{"role": "assistant", "content": r["answer"]}]} for r in rows]

    def caption_rows(self, split: Split = "train") -> list[dict[str, Any]]:
        """Alignment rows: the picture and "Describe the picture." → its `caption` (no answer column)."""
        question = [{"type": "image"}, {"type": "text", "text": "Describe the picture."}]
        return [
            {
                "images": [self.image(s)],
                "prompt": [{"role": "user", "content": question}],
                "completion": [{"role": "assistant", "content": caption(s)}],
            }
            for s in self.scenes(split)
        ]

    def reward_fn(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        """1.0 where the completion's first word (`normalise`) is the ``answer`` column's value, else 0.0."""
        answers = kwargs.get("answer")
        if answers is None:
            raise TaskError("shapes: the reward needs the 'answer' column (the picture alone decides it)")
        return [
            1.0 if normalise(completion_text(c)) == normalise(str(a)) else 0.0
            for c, a in zip(completions, answers, strict=True)
        ]

    def corpus_lines(self, n: int, seed: int = 0) -> list[str]:
        """``n`` lines from the train split, "question answer" and captions in turn (for a tokenizer)."""
        scenes = self.scenes("train")
        rng = split_rng(seed, "train", "corpus-shapes")
        picked = [rng.choice(scenes) for _ in range(n)]
        return [f"{s.question} {s.answer}" if i % 2 else caption(s) for i, s in enumerate(picked)]

    # ---- baselines and export ------------------------------------------------------------------------
    def prior_accuracy(self, split: Split = "test") -> float:
        """Accuracy of the best image-free answerer: for each question text, the train split's most common
        answer to it (the Bayes-optimal guess without the picture); near chance by construction."""
        answers: dict[str, Counter] = {}
        for s in self.scenes("train"):
            answers.setdefault(s.question, Counter())[s.answer] += 1
        scenes = self.scenes(split)
        hits = sum(
            1
            for s in scenes
            if s.question in answers and answers[s.question].most_common(1)[0][0] == s.answer
        )
        return hits / max(1, len(scenes))

    def chance_accuracy(self, split: Split = "test") -> float:
        """Mean over the split of 1 / (number of possible answers to its question)."""
        n = {"count": MAX_COUNT[self.config.difficulty], "colour": len(_colours(self.config.difficulty))}
        n |= {"position": 2, "bars": 2, "digit": 10}
        scenes = self.scenes(split)
        return sum(1 / n[s.kind] for s in scenes) / max(1, len(scenes))

    def export(self, folder: str | Path, kind: str = "sft", split: Split = "train", limit: int | None = None):
        """Write ``folder/{split}.jsonl`` and ``folder/images/{split}_N.png`` in TRL's vision format (the
        ``images`` column holds paths relative to the JSONL file); returns the JSONL path."""
        if kind not in ("sft", "prompts"):
            raise TaskError(f"shapes: kind {kind!r} cannot be exported; choose sft or prompts")
        folder = Path(folder)
        (folder / "images").mkdir(parents=True, exist_ok=True)
        rows = self.rows(kind, split)[:limit]
        path = folder / f"{split}.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for i, row in enumerate(rows):
                name = f"images/{split}_{i}.png"
                row["images"][0].save(folder / name)
                f.write(json.dumps({**row, "images": [name]}, ensure_ascii=False) + "\n")
        return path
