"""Every relative link in README.md and docs/*.md leads somewhere: the file exists, and a #anchor is a heading of
that file as GitHub slugs it (lower case; punctuation but hyphens and underscores dropped; spaces to hyphens; a
repeated heading gets -1, -2, ...). Headings inside fenced code blocks are not headings.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target) and ![alt](target), target without spaces; an optional "title" after it.
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"`[^`\n]*`")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def github_slug(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading counts by its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    for line in prose_lines(page.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        if count:
            seen[f"{slug}-{count}"] = 1
    return set(seen)


def relative_links(page: Path) -> list[str]:
    links = []
    for line in prose_lines(page.read_text(encoding="utf-8")):
        for target in LINK.findall(INLINE_CODE.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, https:, mailto: ...
                continue
            links.append(target)
    return links


def test_the_slug_rule_is_githubs():
    assert github_slug("Health, reflection and grpcurl") == "health-reflection-and-grpcurl"
    assert github_slug("The graph chosen on the machine that runs") == "the-graph-chosen-on-the-machine-that-runs"
    assert github_slug("`dimensions`") == "dimensions"
    assert github_slug("KServe v2") == "kserve-v2"
    assert github_slug("Probes, HEAD and timeouts") == "probes-head-and-timeouts"


def test_there_are_pages_and_links_to_check():
    assert len(PAGES) >= 10
    assert sum(len(relative_links(page)) for page in PAGES) >= 20


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in relative_links(page):
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        if not linked.exists():
            shown = linked.relative_to(REPO) if linked.is_relative_to(REPO) else linked
            broken.append(f"{target}: no such file {shown}")
            continue
        if anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: broken links:\n" + "\n".join(broken)
