"""Generate the Python gRPC code in attnserve/v1/, attnserve/kserve/ and attnserve/tei/ from protos/: the only way
that code is made.

    python protos/generate.py          # write attnserve/{v1,kserve,tei}/*_pb2*.py(i)
    python protos/generate.py --check  # exit 1 if the committed code differs from a fresh generation

grpcio-tools is pinned in the dev extra, so a regeneration is byte-for-byte reproducible.

KServe's protocol (attnserve/kserve/) keeps Triton's proto package, `inference`, which the wire needs. Its messages
are therefore built in a descriptor pool of their own (attnserve/kserve/__init__.py's POOL), not protobuf's default
one: tritonclient.grpc registers the same names there, and one process may hold both (a test, an application that
serves and calls). Generation points the generated code at that pool; nothing else in it changes.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
PACKAGES = ("attnserve/v1", "attnserve/kserve", "attnserve/tei")
# The packages whose messages live in a descriptor pool of their own (their clients register the same names in the
# default one: tritonclient.grpc `inference`, tei-client `tei.v1`), and how their generated code reaches it.
OWN_POOL = ("attnserve/kserve", "attnserve/tei")
DEFAULT_POOL = "_descriptor_pool.Default()"


def generate(out: Path) -> list[Path]:
    from grpc_tools import protoc

    written: list[Path] = []
    for package in PACKAGES:
        sources = sorted(str(p.relative_to(PROTOS)) for p in (PROTOS / package).glob("*.proto"))
        args = ["protoc", f"-I{PROTOS}", f"-I{protoc_include()}", f"--python_out={out}", f"--pyi_out={out}",
                f"--grpc_python_out={out}", *sources]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        if package in OWN_POOL:
            for path in (out / package).glob("*_pb2.py"):
                _use_own_pool(path, package.replace("/", "."))
        written += sorted(p.relative_to(out) for p in (out / package).glob("*_pb2*"))
    return written


def _use_own_pool(path: Path, module: str) -> None:
    """The generated module, adding its file to its package's POOL instead of the default pool."""
    code = path.read_text()
    if code.count(DEFAULT_POOL) != 1:
        raise SystemExit(f"{path}: expected one {DEFAULT_POOL} in protoc's output; has its form changed?")
    code = code.replace(DEFAULT_POOL, "_POOL").replace("# @@protoc_insertion_point(imports)\n",
                                                        f"from {module} import POOL as _POOL\n"
                                                        "# @@protoc_insertion_point(imports)\n", 1)
    path.write_text(code)


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
        committed = sorted(p.relative_to(ROOT) for package in PACKAGES for p in (ROOT / package).glob("*_pb2*"))
        stale = [str(p) for p in fresh if not (ROOT / p).exists() or not filecmp.cmp(Path(tmp) / p, ROOT / p, False)]
        stale += [str(p) for p in committed if p not in fresh]
    if stale:
        print(f"generated code is stale: {', '.join(stale)}; run python protos/generate.py", file=sys.stderr)
        return 1
    print("generated code is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
