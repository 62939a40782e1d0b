"""report.html: the demo report's Markdown as a small self-contained HTML page (the subset `postrl.demo.report`
writes: headings, paragraphs, bullet lists, tables, `code` spans, **bold**, inline PNGs)."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

_BLOCKS = {"|": "table", "- ": "list", "![": "image", "#": "heading"}


def _inline(text: str) -> str:
    """Escaped text with `code` spans as <code> and **bold** as <strong> outside them (an escaped backtick
    or star is a literal one)."""
    parts = re.split(r"((?<!\\)`.+?(?<!\\)`)", html.escape(text))
    out = []
    for k, part in enumerate(parts):
        if k % 2:  # a code span: its text as written
            out.append(f"<code>{part[1:-1]}</code>")
        else:
            out.append(re.sub(r"(?<!\\)\*\*(.+?)(?<!\\)\*\*", r"<strong>\1</strong>", part))
    return "".join(out).replace("\\`", "`").replace("\\*", "*")


def _cells(line: str) -> list[str]:
    """The cells of one Markdown table row (``\\|`` is a literal bar inside a cell)."""
    inner = line.strip().removeprefix("|").removesuffix("|")
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", inner)]


def _table_html(lines: list[str]) -> str:
    """A header row of <th>, then one <tr> of <td> per data row (the ``|---|`` separator dropped)."""
    rows = [_cells(line) for line in lines if not re.fullmatch(r"\|?(\s*:?-+:?\s*\|)+\s*", line.strip())]
    head = "<tr>" + "".join(f"<th>{_inline(c)}</th>" for c in rows[0]) + "</tr>"
    body = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in rows[1:])
    return f"<table><thead>{head}</thead><tbody>{body}</tbody></table>"


def _kind(line: str) -> str:
    return next(
        (kind for start, kind in _BLOCKS.items() if line.startswith(start)), "text" if line.strip() else ""
    )


def _block_html(kind: str, lines: list[str], out: Path) -> list[str]:
    if kind == "table":
        return [_table_html(lines)]
    if kind == "list":
        return ["<ul>" + "".join(f"<li>{_inline(line[2:])}</li>" for line in lines) + "</ul>"]
    if kind == "image":
        images = []
        for line in lines:
            src = line[line.index("(") + 1 : -1]
            data = base64.b64encode((out / src).read_bytes()).decode()
            images.append(f'<img src="data:image/png;base64,{data}" alt="{html.escape(src)}">')
        return images
    if kind == "heading":  # one line: a heading always starts a block of its own
        level = len(lines[0]) - len(lines[0].lstrip("#"))
        return [f"<h{level}>{_inline(lines[0].lstrip('#').strip())}</h{level}>"]
    return [f"<p>{_inline(' '.join(lines))}</p>"] if kind == "text" else []


def to_html(md_lines: list[str], out: Path) -> str:
    """A small self-contained HTML rendering of the report's Markdown: headings, paragraphs, bullet lists,
    tables (a header row, then a row per data row), `code` spans and inline PNGs."""
    lines = "\n".join(md_lines).split("\n")
    body: list[str] = []
    start = 0
    for end in range(1, len(lines) + 1):
        if end == len(lines) or _kind(lines[end]) != _kind(lines[start]) or _kind(lines[end]) == "heading":
            body += _block_html(_kind(lines[start]), lines[start:end], out)
            start = end
    style = (
        "body{font-family:sans-serif;max-width:960px;margin:2em auto;line-height:1.4}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px}"
        "th{background:#f3f3f3}td{font-variant-numeric:tabular-nums}"
        "code{background:#f3f3f3;padding:0 3px;border-radius:3px}img{max-width:720px}"
    )
    head = f"<meta charset='utf-8'><title>postrl demo</title><style>{style}</style>"
    return "\n".join([f"<!doctype html><html><head>{head}</head><body>", *body, "</body></html>"]) + "\n"
