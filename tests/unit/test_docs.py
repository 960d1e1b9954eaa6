"""The documentation's shape and links: a short README, and no link that leads nowhere.

Every relative link of the project's own pages must name a file or folder of the repository
(and, into a Markdown page, a heading it has, by GitHub's anchor rules); nothing may point
outside the repository except http(s) URLs. Links inside code (fenced blocks, `code spans`) are
text, not links, and are not checked.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[2]
README_MAX_LINES = 200

PAGES = sorted(
    [
        REPO / "README.md",
        *(REPO / "docs").glob("*.md"),
        REPO / "deploy" / "README.md",
        REPO / "deploy" / "grafana" / "README.md",
        REPO / "protos" / "released" / "README.md",
    ]
)
"""The project's own pages (vendored READMEs under data/ and static/vendor/ are not ours)."""


_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+).+?\1")
_INLINE_LINK = re.compile(r"\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
"""The `](target "title")` of an inline link or image: its text may begin on an earlier line."""
_REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_URL_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def _prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def links(text: str) -> list[tuple[int, str]]:
    """Every link target of a Markdown text, with its line, code excluded."""
    found: list[tuple[int, str]] = []
    for number, line in _prose_lines(text):
        prose = _CODE_SPAN.sub("", line)
        found.extend((number, m.group(1)) for m in _INLINE_LINK.finditer(prose))
        if m := _REFERENCE_LINK.match(prose):
            found.append((number, m.group(1)))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text, lower case, punctuation dropped, spaces → -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").lower()
    kept = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return kept.strip().replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading anchor of a Markdown text, duplicates numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in _prose_lines(text):
        if m := _HEADING.match(line):
            base = slug(m.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            out.add(base if count == 0 else f"{base}-{count}")
    return out


def _problem(page: Path, target: str) -> str | None:
    """What is wrong with one link of `page`; None when nothing is."""
    if target.startswith(("http://", "https://")):
        return None
    if _URL_SCHEME.match(target):
        return f"{target}: only http(s) URLs may leave the repository"
    path_part, _, fragment = target.partition("#")
    if path_part.startswith("/"):
        return f"{target}: an absolute path; link relative to the page"
    resolved = (page.parent / unquote(path_part)).resolve() if path_part else page
    if not resolved.is_relative_to(REPO):
        return f"{target}: leads outside the repository"
    relative = resolved.relative_to(REPO).as_posix()
    if not resolved.exists():
        return f"{target}: {relative} does not exist"
    if not fragment or resolved.suffix != ".md":
        return None
    if unquote(fragment) not in anchors(resolved.read_text(encoding="utf-8")):
        return f"{target}: {relative} has no heading with the anchor #{fragment}"
    return None


def test_the_readme_is_a_front_door() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; keep it to {README_MAX_LINES} and move the rest "
        "to the page of docs/ for its audience (docs/README.md lists them)"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_link_resolves_inside_the_repository(page: Path) -> None:
    problems = [
        f"{page.relative_to(REPO)}:{number}: {problem}"
        for number, target in links(page.read_text(encoding="utf-8"))
        if (problem := _problem(page, target))
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_page_names_the_development_machines_shared_folder(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert "/work/shared" not in text
    assert "../shared" not in text


def test_every_guide_is_in_the_index() -> None:
    index = (REPO / "docs" / "README.md").read_text(encoding="utf-8")
    targets = {target.partition("#")[0] for _, target in links(index)}
    guides = (p.name for p in (REPO / "docs").glob("*.md") if p.name != "README.md")
    missing = sorted(name for name in guides if name not in targets)
    assert not missing, f"docs/README.md does not list {missing}"


# ---- the checker itself ----------------------------------------------------------------------


def test_links_skip_code_and_find_every_kind() -> None:
    text = "\n".join(
        [
            'See [a](a.md) and ![img](img/x.png), [b](b.md#part "title").',
            "`[not](code.md)` is code.",
            "```",
            "[not](fenced.md)",
            "```",
            "[ref]: ref.md",
            "[text over",
            "two lines](two.md)",
        ]
    )
    assert links(text) == [
        (1, "a.md"),
        (1, "img/x.png"),
        (1, "b.md#part"),
        (6, "ref.md"),
        (8, "two.md"),
    ]


def test_slugs_follow_github() -> None:
    text = "\n".join(
        [
            "## 13. The training library (`pollux.train`)",
            "## The paper's table: faithful Pollux and the baselines",
            "### `tenant_shares`",
            "## Notes",
            "## Notes",
            "```",
            "# not a heading",
            "```",
        ]
    )
    assert anchors(text) == {
        "13-the-training-library-polluxtrain",
        "the-papers-table-faithful-pollux-and-the-baselines",
        "tenant_shares",
        "notes",
        "notes-1",
    }


def test_a_bad_link_is_named() -> None:
    page = REPO / "docs" / "users.md"
    assert _problem(page, "nowhere.md") == "nowhere.md: docs/nowhere.md does not exist"
    assert "outside the repository" in (_problem(page, "../../outside.md") or "")
    assert "absolute path" in (_problem(page, "/etc/passwd") or "")
    assert "only http(s)" in (_problem(page, "file:///etc/passwd") or "")
    assert "no heading" in (_problem(page, "operators.md#no-such-section") or "")
    assert _problem(page, "operators.md#limits") is None
    assert _problem(page, "https://example.com/x") is None
