"""MkDocs hook: the configuration reference, generated from the config dataclasses at every build.

A page line ``<!-- config-keys -->`` becomes one section per command: every LM stage of the registry
(`postrl.lm.stages.STAGES`), every ``postrl control`` algorithm and the demo, each a table of every key with its
default and its help, read by `postrl.runtime.config_help.describe` (what ``--list-keys`` prints). A stage or a
key added to the code appears here on the next build; nothing is typed by hand, so the page cannot drift.
"""

from __future__ import annotations

import dataclasses
from typing import Any

MARKER = "<!-- config-keys -->"


def _cell(text: str) -> str:
    """A Markdown table cell: pipes escaped, whitespace folded."""
    return " ".join(text.replace("|", "\\|").split())


def _table(rows: list[tuple[str, str, str]]) -> list[str]:
    lines = ["| key | default | meaning |", "| --- | --- | --- |"]
    return lines + [f"| `{key}` | `{_cell(default)}` | {_cell(doc)} |" for key, default, doc in rows]


def _section(title: str, command: str, cls: type) -> list[str]:
    from postrl.runtime.config_help import describe

    doc = (cls.__doc__ or "").strip().split("\n\n")[0]
    head = [
        f"## {title}",
        "",
        f"{_cell(doc)} Command: `{command}`; class: `{cls.__module__}.{cls.__name__}`.",
        "",
    ]
    return head + _table(describe(cls)) + [""]


def _demo_section(stage_classes: dict[type, str]) -> list[str]:
    """The demo's own keys; its sections that are a stage's config point at that stage's table."""
    from postrl.demo import DemoConfig
    from postrl.runtime.config_help import describe
    from postrl.runtime.config_values import field_types

    types_ = field_types(DemoConfig)
    refs = {f.name: stage_classes[types_[f.name]] for f in dataclasses.fields(DemoConfig)
            if types_[f.name] in stage_classes}  # fmt: skip
    rows = [row for row in describe(DemoConfig) if row[0].split(".")[0] not in refs]
    lines = ["## postrl demo", "", "`postrl demo` reads `postrl.demo.DemoConfig`. Its sections "]
    lines[-1] += ", ".join(
        f"`{name}` (the keys of [postrl {stage}](#postrl-{stage}))" for name, stage in refs.items()
    )
    lines[-1] += " take every key of that stage under their prefix (`sft.run.steps`); its other keys:"
    return [*lines, "", *_table(rows), ""]


def reference() -> str:
    """The whole generated reference (Markdown)."""
    from postrl.control.loop import ALGORITHMS, algorithm
    from postrl.lm.stages import STAGES

    lines: list[str] = []
    stage_classes: dict[type, str] = {}
    for stage in STAGES.values():
        cls = stage.config_class()
        stage_classes[cls] = stage.name
        lines += _section(f"postrl {stage.name}", f"postrl {stage.name}", cls)
    for name in ALGORITHMS:
        command = "postrl control prefs" if name == "prefs" else f"postrl control train --algo {name}"
        lines += _section(f"postrl control {name}", command, algorithm(name).config)
    return "\n".join(lines + _demo_section(stage_classes))


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """Replace the marker with the generated reference."""
    return markdown.replace(MARKER, reference()) if MARKER in markdown else markdown
