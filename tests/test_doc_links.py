"""The pages hold together: every relative link in README.md and docs/*.md leads to a file, and a #anchor to a heading
of it as GitHub slugs it (headings in fenced code are not headings); docs/development.md's layout names every module,
so that a new one cannot land unlisted."""

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
PACKAGES = ("model", "export", "engine", "offline", "server", "server/workers", "server/grpc", "server/http",
            "client", "loadtest", "attnserve")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def github_slug(heading: str) -> str:
    """Lower case; punctuation but hyphens and underscores dropped; spaces to hyphens; a link counts by its text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The page's headings' slugs; a repeated heading gets -1, -2, ..."""
    seen: dict[str, int] = {}
    for match in filter(None, map(HEADING.match, prose_lines(page.read_text(encoding="utf-8")))):
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        if count:
            seen[f"{slug}-{count}"] = 1
    return set(seen)


def relative_links(page: Path) -> list[str]:
    """Its links' targets but those with a scheme (http:, https:, mailto: ...)."""
    return [target for line in prose_lines(page.read_text(encoding="utf-8"))
            for target in LINK.findall(INLINE_CODE.sub("", line))
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE)]


@pytest.mark.parametrize(("heading", "slug"), [
    ("Health, reflection and grpcurl", "health-reflection-and-grpcurl"),
    ("The graph chosen on the machine that runs", "the-graph-chosen-on-the-machine-that-runs"),
    ("`dimensions`", "dimensions"), ("KServe v2", "kserve-v2"),
    ("Probes, HEAD and timeouts", "probes-head-and-timeouts"),
])
def test_the_slug_rule_is_githubs(heading, slug):
    assert github_slug(heading) == slug


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
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: broken links:\n" + "\n".join(broken)


def test_every_module_is_named_in_its_packages_entry_of_the_layout():
    """An entry: a line of the layout's code block starting with the package's folder, and the indented lines after it;
    it names each of the package's .py files but __init__."""
    doc = (REPO / "docs/development.md").read_text(encoding="utf-8")
    entries: dict[str, str] = {}
    current = None
    for line in doc[doc.index("## Layout"):].split("```")[1].splitlines():
        if head := re.match(r"^(\S+)\s", line):
            current = head.group(1).rstrip("/")
            entries[current] = line[len(head.group(1)):]
        elif current is not None:
            entries[current] += " " + line
    missing = []
    for package in PACKAGES:
        assert package in entries, f"docs/development.md's layout has no entry for {package}/"
        missing += [f"{package}/{module.name}" for module in sorted((REPO / package).glob("*.py"))
                    if module.stem != "__init__"
                    and not re.search(rf"(?<![\w/]){re.escape(module.stem)}\b", entries[package])]
    assert not missing, f"docs/development.md's layout does not name {missing}"
