"""docs/development.md's layout names every module: each package's entry (a line starting with the package's
folder, and the indented lines after it) names each of its .py files but __init__, so a new module cannot land
unlisted."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("model", "export", "engine", "offline", "server", "server/workers", "server/grpc", "server/http",
            "client", "loadtest", "attnserve")


def layout_entries() -> dict[str, str]:
    """The layout's code block, as {package folder: the text of its entry}."""
    doc = (REPO / "docs/development.md").read_text(encoding="utf-8")
    block = doc[doc.index("## Layout"):].split("```")[1]
    entries: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        head = re.match(r"^(\S+)\s", line)
        if head:
            current = head.group(1).rstrip("/")
            entries[current] = line[len(head.group(1)):]
        elif current is not None:
            entries[current] += " " + line
    return entries


def test_every_module_is_named_in_its_packages_entry():
    entries = layout_entries()
    missing = []
    for package in PACKAGES:
        assert package in entries, f"docs/development.md's layout has no entry for {package}/"
        for module in sorted((REPO / package).glob("*.py")):
            if module.stem != "__init__" and not re.search(rf"(?<![\w/]){re.escape(module.stem)}\b",
                                                           entries[package]):
                missing.append(f"{package}/{module.name}")
    assert not missing, f"docs/development.md's layout does not name {missing}"
