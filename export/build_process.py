"""Builds in a process of their own: `python -m attnserve.export.build_process`, what serving and encoding run when
they need a directory or a variant that is not built yet (engine/builds.py starts it and reads its lines).

    python -m attnserve.export.build_process new CHECKPOINT OUT [--name NAME] --run PRECISION [--provider P]
    python -m attnserve.export.build_process add DIRECTORY --variants A,B [--provider P]

`new` builds what a run of PRECISION (one of a run's --precision choices: EngineConfig's) on the provider needs first
(engine/variants.py run_variants), traced straight into fp16 for fp16 and bf16 (trace_precision).

Why a process: an export holds the model in PyTorch and onnxruntime's tools hold graphs several times over, and
glibc keeps much of what they free (export/memory.py); in a child all of it goes back when it exits, and the
server or encoder that asked never imports torch. Its progress lines go to stderr as they come; a failure ends
with one line, "error: ...", and exit status 2 (engine/builds.py raises it as an ArtifactError): the protocol
attnserve/build_program.py declares, with this module's name.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnserve.build_program import ERROR, MODULE
from attnserve.config import EngineConfig, choices
from attnserve.errors import AttnserveError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    sub = parser.add_subparsers(dest="job", required=True)
    new = sub.add_parser("new")
    new.add_argument("checkpoint")
    new.add_argument("out")
    new.add_argument("--name")
    new.add_argument("--run", default="auto", choices=choices(EngineConfig, "precision"))  # a run's --precision
    new.add_argument("--provider", default="CPUExecutionProvider")
    add = sub.add_parser("add")
    add.add_argument("directory")
    add.add_argument("--variants", required=True)
    add.add_argument("--provider", default="CPUExecutionProvider")
    args = parser.parse_args(argv)
    names = [n for n in args.variants.split(",") if n] if args.job == "add" else []
    try:
        try:
            from attnserve.export.artifacts import add_variants, build_artifacts
            from attnserve.model.checkpoint import read_checkpoint
        except ImportError as e:
            raise AttnserveError(f"building graphs needs the export extra ({e.name} is missing): "
                                 "pip install 'attnserve[export]', or serve a directory `attnserve export --all` "
                                 "built") from None
        if args.job == "new":
            from attnserve.engine.variants import run_variants, trace_precision

            ckpt = read_checkpoint(Path(args.checkpoint), args.name)
            precision = args.run if args.run != "auto" or args.provider == "CPUExecutionProvider" else "fp16"
            names = run_variants(ckpt.kind, args.run, args.provider)
            build_artifacts(ckpt, Path(args.out), variants=names, trace=trace_precision(precision),
                            provider=args.provider)
        else:
            add_variants(Path(args.directory), names, provider=args.provider)
    except AttnserveError as e:
        print(f"{ERROR}{e}", file=sys.stderr, flush=True)
        return 2
    except MemoryError:
        print(f"{ERROR}out of memory while building {', '.join(names)}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
