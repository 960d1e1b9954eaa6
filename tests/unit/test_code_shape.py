"""Code a newcomer can carry: no class over 400 lines, no module docstring over 15 lines.

A class that long holds several concerns (split it along its seams into classes or modules
that can be tested alone); a module docstring that long is an essay or a measurement (keep the
what and why; measurements go to docs/results.md, design to docs/architecture.md). Lengths
are source lines, from the first line to the last (a docstring's closing quotes included).
Every .py file of the project is read except the generated `pollux/v1`.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("pollux", "services", "client", "benchmarks", "examples", "scripts", "tests")
SKIPPED = (ROOT / "pollux" / "v1",)
MAX_CLASS_LINES = 400
MAX_DOCSTRING_LINES = 15


def source_files() -> list[Path]:
    """Every project .py file under `FOLDERS`, generated code and build output left out."""
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT).parts
            if any(path.is_relative_to(skipped) for skipped in SKIPPED):
                continue
            if any(part.startswith(".") or part in ("build", "__pycache__") for part in parts):
                continue
            found.append(path)
    return found


def spans(path: Path) -> tuple[int, list[tuple[str, int]]]:
    """The module docstring's length in lines (0: none) and each class's (name, lines)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docstring = 0
    first = tree.body[0] if tree.body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
        and first.end_lineno is not None
    ):
        docstring = first.end_lineno - first.lineno + 1
    classes = [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.end_lineno is not None
    ]
    return docstring, classes


FILES = source_files()


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_the_rule_sees_every_part_of_the_tree() -> None:
    seen = {relative(path).split("/")[0] for path in FILES}
    assert seen == set(FOLDERS)
    assert not any(relative(path).startswith("pollux/v1/") for path in FILES)
    assert not any("/.venv/" in f"/{relative(path)}" for path in FILES)


def test_no_class_is_over_400_lines() -> None:
    long = [
        f"{relative(path)}: class {name} is {lines} lines"
        for path in FILES
        for name, lines in spans(path)[1]
        if lines > MAX_CLASS_LINES
    ]
    assert not long, "split these along their seams:\n" + "\n".join(long)


def test_no_module_docstring_is_over_15_lines() -> None:
    long = [
        f"{relative(path)}: {lines} lines"
        for path in FILES
        if (lines := spans(path)[0]) > MAX_DOCSTRING_LINES
    ]
    assert not long, "trim these to the what and why:\n" + "\n".join(long)


def test_the_measure_counts_source_lines_closing_quotes_included(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    body = "\n".join(f"    line {i}" for i in range(3))
    sample.write_text(f'"""Title.\n\n{body}\n"""\n\n\nclass A:\n    x = 1\n\n    y = 2\n')
    assert spans(sample) == (6, [("A", 4)])
