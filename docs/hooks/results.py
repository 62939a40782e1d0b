"""MkDocs hook: every table of measured numbers, rendered from ``benchmarks/results/*.json`` at every build.

A benchmark writes ``benchmarks/results/<name>.json`` through ``benchmarks/_record.py`` (the result, with the
command, commit, date, machine and load of the run). A page names the file in an HTML comment and the hook puts
the table there, with the file, command, commit, date and load underneath; nothing is typed by hand, so a rerun
benchmark updates the page on the next build, and a table whose file is missing fails the build.

``<!-- results: NAME -->`` renders everything in ``NAME.json`` (scalars as a key/value table, each list of
objects as its own table). ``<!-- results: control_seeds-* ... -->`` makes one row of every
file whose name matches (``_key`` is the name), for a table whose rows are separate benchmark runs.
``<!-- results-all -->`` renders every results file whole (a new benchmark's file
appears without any edit). A chosen table is a YAML spec inside the comment::

    <!-- results: dpo
    rows:                                # explicit rows: each a mapping header -> cell template
      - {contender: postrl, steps/s: "{steps_per_s.postrl:.2f}"}
      - {contender: TRL, steps/s: "{steps_per_s.trl:.2f}"}
    -->

    <!-- results: control
    rows: runs                           # or one row per item of a list (a mapping: per value, key in _key)
    where: {backend: postrl}             # keep the items whose fields equal these
    columns: {seed: "{seed}", "eval return": "{eval_return_mean:.1f}"}
    -->

A spec's ``missing: TEXT`` puts TEXT in a note while the file (or every file of a pattern) does not exist (a
table prepared for a benchmark not rerun since results files exist); without it a missing file fails the build.

A template's ``{path:format}`` reads a dotted path (``tasks.ppo-cartpole.sb3.speed_ratio_median``; a list
index is a number; ``summary.[postrl:rloo].peak_rss_mb`` for a key with a colon; a key with dots is found as
it is) from the row, or from the file's ``result`` when it starts with ``^``; ``{a / b:.2f}``
divides two paths (a number is a number); ``{path?}`` is ``—`` when the path is missing (else the build
fails, naming the page, the file and the path). Lists format each item and join them with " / ".
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
BLOCK = re.compile(r"<!-- results: *(?P<name>[\w.+*-]+)(?P<spec>.*?)-->", re.S)
ALL = "<!-- results-all -->"
FIELD = re.compile(r"\{(?P<expr>(?:[^{}:?\[\]]|\[[^\]]*\])+)(?P<optional>\??)(?::(?P<fmt>[^{}]*))?\}")
KEY = re.compile(r"\[([^\]]*)\]|([^.\[\]]+)")
MISSING = object()


class ResultsError(Exception):
    """A results block that cannot be rendered: the message names the file and what is wrong."""


def names() -> list[str]:
    """Every results file's name, sorted."""
    return sorted(p.stem for p in RESULTS.glob("*.json"))


def load(name: str) -> dict:
    path = RESULTS / f"{name}.json"
    if not path.is_file():
        raise ResultsError(f"benchmarks/results/{name}.json does not exist (run its benchmark to write it)")
    return json.loads(path.read_text(encoding="utf-8"))


def lookup(value: Any, path: str) -> Any:
    """``value`` at a dotted ``path`` (``[a:b]`` for a key with a colon); `MISSING` where one is absent. A key
    with dots (``noise_0.0``) is found as it is: segments are joined until the mapping has the key."""
    keys = [bracketed or plain.strip() for bracketed, plain in KEY.findall(path.strip())]
    i = 0
    while i < len(keys):
        if isinstance(value, dict):
            j = next((j for j in range(i + 1, len(keys) + 1) if ".".join(keys[i:j]) in value), None)
            if j is None:
                return MISSING
            value, i = value[".".join(keys[i:j])], j
        elif (
            isinstance(value, list)
            and keys[i].lstrip("-").isdigit()
            and -len(value) <= int(keys[i]) < len(value)
        ):
            value, i = value[int(keys[i])], i + 1
        else:
            return MISSING
    return value


def _operand(text: str, row: Any, result: Any) -> Any:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        return lookup(result, text[1:]) if text.startswith("^") else lookup(row, text)


def _evaluate(expr: str, row: Any, result: Any) -> Any:
    """A path, or ``path / path`` (a ratio of two numbers, or of two lists item by item)."""
    if "/" not in expr:
        return _operand(expr, row, result)
    num, den = (_operand(part, row, result) for part in expr.split("/", 1))
    if MISSING in (num, den) or None in (num, den):
        return MISSING if MISSING in (num, den) else None
    if isinstance(num, list) or isinstance(den, list):
        nums = num if isinstance(num, list) else [num] * len(den)
        dens = den if isinstance(den, list) else [den] * len(num)
        return [a / b for a, b in zip(nums, dens, strict=True)]
    return num / den


def fmt(value: Any, spec: str = "") -> str:
    """One value as a table cell: None as —, booleans as yes/no, lists item by item joined by " / "."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return " / ".join(fmt(v, spec) for v in value)
    if isinstance(value, dict):
        return f"{len(value)} fields"
    if spec:
        return format(value, spec)
    if isinstance(value, (int, float)) and abs(value) >= 10_000:
        return format(value, ",.0f")
    if isinstance(value, float):
        return format(value, ".4g" if value == 0 or abs(value) >= 1e-3 else ".2e")
    return str(value).replace("|", "\\|").replace("\n", " ")


def render_cell(template: str, row: Any, result: Any) -> str:
    def one(match: re.Match) -> str:
        value = _evaluate(match["expr"], row, result)
        if value is MISSING:
            if match["optional"]:
                return "—"
            raise ResultsError(f"no value at {match['expr'].strip()!r} (in the cell {template!r})")
        try:
            return fmt(value, match["fmt"] or "")
        except (TypeError, ValueError) as e:
            raise ResultsError(f"{match['expr'].strip()!r} = {value!r} does not take the format "
                               f"{match['fmt']!r}: {e}") from e  # fmt: skip

    return FIELD.sub(one, str(template))


def _rows(spec: dict, result: Any) -> list[dict[str, str]]:
    """The spec's table as rows of header -> rendered cell."""
    rows = spec.get("rows")
    if isinstance(rows, list):
        return [{str(k): render_cell(v, result, result) for k, v in row.items()} for row in rows]
    items = lookup(result, rows) if isinstance(rows, str) else MISSING
    if isinstance(items, dict):
        items = [
            {**v, "_key": k} if isinstance(v, dict) else {"_key": k, "value": v} for k, v in items.items()
        ]
    if not isinstance(items, list) or not isinstance(spec.get("columns"), dict):
        raise ResultsError(f"rows: {rows!r} must be a list of rows, or the path of a list or mapping with "
                           f"columns: {{header: template}}")  # fmt: skip
    where = spec.get("where") or {}
    kept = [item for item in items if all(lookup(item, str(k)) == v for k, v in where.items())]
    return [{str(h): render_cell(t, item, result) for h, t in spec["columns"].items()} for item in kept]


def markdown_table(rows: list[dict[str, str]]) -> list[str]:
    headers = list(dict.fromkeys(h for row in rows for h in row))
    lines = ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    return lines + ["| " + " | ".join(row.get(h, "") for h in headers) + " |" for row in rows]


def source_line(name: str, record: dict) -> str:
    """What the table was measured with: file, command, commit, date, load, machine (and an import's note)."""
    commit = (record.get("commit") or "unknown")[:7]
    dirty = " with uncommitted changes" if record.get("dirty") else ""
    machine = record.get("machine") or {}
    load = " / ".join(f"{x:g}" for x in record.get("load_average") or []) or "not recorded"
    date = str(record.get("date", "undated")).replace("T", " ").replace("Z", " UTC")
    line = (f"`benchmarks/results/{name}.json`: `{record.get('command', '?')}`, commit `{commit}`{dirty}, "
            f"{date}, load average {load} (1/5/15 min), {machine.get('cpu', 'CPU not recorded')}, "
            f"{machine.get('cpu_count', '?')} CPUs")  # fmt: skip
    if record.get("imported"):
        line += f". **Imported**, not written by the benchmark: {record['imported']}"
    return line + ".\n{ .results-source }"


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """Scalars and lists of scalars by dotted key; lists of objects are left to `generic`'s own tables."""
    if isinstance(value, dict):
        return {k: v for key, sub in value.items() for k, v in _flat(sub, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): value}


def _short(value: Any) -> str:
    if isinstance(value, list) and len(value) > 8:
        return f"{fmt(value[:3])} / … / {fmt(value[-1])} ({len(value)} values)"
    return fmt(value)


def generic(name: str, record: dict) -> list[str]:
    """Everything in a results file: its scalars as key/value rows, each list of objects as a table."""
    flat = _flat(record.get("result"))
    tables = {k: v for k, v in flat.items() if isinstance(v, list) and v and isinstance(v[0], dict)}
    scalars = [{"key": f"`{k}`", "value": _short(v)} for k, v in flat.items() if k not in tables]
    lines = markdown_table(scalars) if scalars else []
    for key, items in tables.items():
        rows = [
            {f"`{k}`": _short(v) for k, v in _flat(item).items()} for item in items if isinstance(item, dict)
        ]
        lines += ["", f"`{key}`:", "", *markdown_table(rows)]
    return [*lines, "", source_line(name, record)]


def _missing_note(text: str) -> str:
    return f'!!! note "Not measured into a results file yet"\n    {text}'


def _many(pattern: str, spec: Any) -> str:
    """One row per results file whose name matches ``pattern`` (``control_seeds-*``), ``_key`` its name."""
    found = sorted(p.stem for p in RESULTS.glob(f"{pattern}.json"))
    if not found and isinstance(spec, dict) and spec.get("missing"):
        return _missing_note(spec["missing"])
    if not found:
        raise ResultsError(f"no results file matches benchmarks/results/{pattern}.json")
    if not isinstance(spec, dict) or not isinstance(spec.get("columns"), dict):
        raise ResultsError("a pattern takes a spec with columns: {header: template} (one row per file)")
    records = {n: load(n) for n in found}
    rows = [{str(h): render_cell(t, {**records[n].get("result", {}), "_key": n}, records[n].get("result"))
             for h, t in spec["columns"].items()} for n in found]  # fmt: skip
    return "\n".join([*markdown_table(rows), "", *[source_line(n, records[n]) + "\n" for n in found]])


def render_block(name: str, spec_text: str) -> str:
    spec = yaml.safe_load(spec_text) if spec_text.strip() else None
    if "*" in name:
        return _many(name, spec)
    if isinstance(spec, dict) and spec.get("missing") and not (RESULTS / f"{name}.json").is_file():
        return _missing_note(spec["missing"])
    record = load(name)
    if spec is None:
        return "\n".join(generic(name, record))
    if not isinstance(spec, dict) or "rows" not in spec:
        raise ResultsError("the spec must be a mapping with rows: (see docs/hooks/results.py)")
    rows = _rows(spec, record.get("result"))
    if not rows:
        raise ResultsError("the table has no rows (where: matched nothing?)")
    return "\n".join([*markdown_table(rows), "", source_line(name, record)])


def render(markdown: str, where: str = "page") -> str:
    """``markdown`` with every results block rendered; a block that cannot be raises naming ``where``."""

    def one(match: re.Match) -> str:
        try:
            return render_block(match["name"], match["spec"])
        except (ResultsError, yaml.YAMLError) as e:
            raise ResultsError(f"{where}: <!-- results: {match['name']} -->: {e}") from e

    markdown = BLOCK.sub(one, markdown)
    if ALL in markdown:
        sections = [f"## {n}\n\n" + "\n".join(generic(n, load(n))) for n in names()]
        markdown = markdown.replace(ALL, "\n\n".join(sections))
    return markdown


NOT_MEASURED = "<!-- not-measured -->"
MEASURED = re.compile(r"\d\.\d|\d,\d{3}|\d\s?[×x%]|\d\s?(?:s|ms|MB|GB)\b")


def hand_tables(markdown: str) -> list[tuple[int, str]]:
    """Hand-typed tables that quote measured numbers, as (line number, first row): a table outside code fences
    and results blocks whose body has a decimal, a thousands separator, a ratio, a percentage or a time or size,
    and is not marked ``<!-- not-measured -->`` on the line before (a table of defaults or of tolerances)."""
    found: list[tuple[int, str]] = []
    lines = BLOCK.sub(lambda m: "\n" * m[0].count("\n"), markdown).split("\n")
    fence, i = False, 0
    while i < len(lines):
        if lines[i].lstrip().startswith(("```", "~~~")):
            fence = not fence
        if fence or not lines[i].startswith("|"):
            i += 1
            continue
        start = i
        while i < len(lines) and lines[i].startswith("|"):
            i += 1
        marked = start > 0 and lines[start - 1].strip() == NOT_MEASURED
        if not marked and any(MEASURED.search(row) for row in lines[start + 2 : i]):
            found.append((start + 1, lines[start]))
    return found


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    from mkdocs.exceptions import PluginError

    try:
        return render(markdown, page.file.src_uri)
    except ResultsError as e:
        raise PluginError(str(e)) from e
