"""Prints the requirements of attnserve with the given extras, read from pyproject.toml, one per line.

    python requirements.py PYPROJECT [EXTRA...] > requirements.txt

The images install these in a layer of their own, before the project's wheel, so that a change to the code
reuses the layer with the dependencies (torch's hundreds of MB in the export stage) instead of installing them
again. pyproject.toml stays the only place they are written.
"""

import sys

import tomllib

path, *extras = sys.argv[1:]
with open(path, "rb") as f:
    project = tomllib.load(f)["project"]
unknown = sorted(set(extras) - set(project["optional-dependencies"]))
if unknown:
    sys.exit(f"requirements.py: {path} has no extra {', '.join(unknown)}")
print("\n".join([*project["dependencies"], *(r for e in extras for r in project["optional-dependencies"][e])]))
