"""Generate the Python gRPC code in attnserve/v1/ from protos/: the only way that code is made.

    python protos/generate.py          # write attnserve/v1/*_pb2*.py(i)
    python protos/generate.py --check  # exit 1 if the committed code differs from a fresh generation

grpcio-tools is pinned in the dev extra, so a regeneration is byte-for-byte reproducible.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
PACKAGE = "attnserve/v1"


def generate(out: Path) -> list[Path]:
    from grpc_tools import protoc

    sources = sorted(str(p.relative_to(PROTOS)) for p in (PROTOS / PACKAGE).glob("*.proto"))
    args = ["protoc", f"-I{PROTOS}", f"-I{protoc_include()}", f"--python_out={out}", f"--pyi_out={out}",
            f"--grpc_python_out={out}", *sources]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted(p.relative_to(out) for p in (out / PACKAGE).glob("*_pb2*"))


def protoc_include() -> str:
    import grpc_tools

    return str(Path(grpc_tools.__file__).parent / "_proto")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with a fresh generation instead of writing")
    args = parser.parse_args()
    if not args.check:
        for path in generate(ROOT):
            print(f"wrote {path}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        committed = sorted(p.relative_to(ROOT) for p in (ROOT / PACKAGE).glob("*_pb2*"))
        stale = [str(p) for p in fresh if not (ROOT / p).exists() or not filecmp.cmp(Path(tmp) / p, ROOT / p, False)]
        stale += [str(p) for p in committed if p not in fresh]
    if stale:
        print(f"generated code is stale: {', '.join(stale)}; run python protos/generate.py", file=sys.stderr)
        return 1
    print("generated code is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
