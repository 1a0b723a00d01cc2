"""The build program: serving's one dependency on export, kept a process apart. Serving and encoding start a build
(a new artifact directory, a variant first asked for) as a child process, `python -m attnserve.export.build_process`
(engine/builds.py), so that they never import export or torch, and what a build holds goes back to the system when
it exits. export/build_process.py is that program.

Its name and the protocol both ends keep are declared here, on the floor below both, so that the import graph sees
engine/builds.py and export/build_process.py meet here; tests/test_layers.py checks that this is the one module
that names a higher layer's module to run, and that the module named is that program.

The protocol: arguments in, `new CHECKPOINT OUT [--name NAME] --run PRECISION --provider P` or `add DIRECTORY
--variants A,B --provider P`; progress lines on stderr as they come; a failure's last line ERROR and its message,
with exit status 2.
"""

from __future__ import annotations

import sys

MODULE = "attnserve.export.build_process"
ERROR = "error: "  # a failed build's last line starts so, its message after it


def command(args: list[str]) -> list[str]:
    """The child's command line: this interpreter running the build program with args."""
    return [sys.executable, "-m", MODULE, *args]
