"""The `attnserve` command: one console script, a subcommand per job."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import logging
import os
import re
import select
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TextIO

from attnserve import __version__
from attnserve.config import (
    CHUNK_ROWS,
    DEFAULT_CHUNK_TOKENS,
    HTTP_TARGET,
    IMAGE_CHUNK_ROWS,
    ClientConfig,
    EncodeConfig,
    EngineConfig,
    ExportConfig,
    LoadTestConfig,
    ServerConfig,
    add_arguments,
    from_args,
    is_set,
)
from attnserve.errors import AttnserveError
from attnserve.progress import show_on_stderr

if TYPE_CHECKING:
    from attnserve.offline.job import EncodeJob, EncodeResult


def cmd_export(args: argparse.Namespace) -> int:
    from attnserve.default_model import (
        DEFAULT_MODEL_NAME,
        checkpoint_artifacts_dir,
        default_checkpoint_dir,
        warn_if_pipeline_assumed,
    )

    try:
        from attnserve.export.artifacts import add_variants, all_variants, build_artifacts, same_source
        from attnserve.model.checkpoint import read_checkpoint
    except ImportError as e:
        raise AttnserveError(f"export needs the export extra ({e.name} is missing): "
                             "pip install 'attnserve[export]'") from None
    from attnserve.engine.session import resolve_provider
    from attnserve.engine.variants import run_variants, trace_precision

    options = from_args(ExportConfig, args)
    directory = Path(options.checkpoint) if options.checkpoint else default_checkpoint_dir()
    ckpt = read_checkpoint(directory, options.name or (None if options.checkpoint else DEFAULT_MODEL_NAME))
    out = Path(options.out) if options.out else checkpoint_artifacts_dir(directory, ckpt.name)
    provider = resolve_provider(options.provider)
    names = all_variants(ckpt) if options.all else run_variants(ckpt.kind, options.precision, provider)
    if same_source(out, ckpt):  # built from this checkpoint already: what it lacks is added, nothing rebuilt
        add_variants(out, names, provider=provider)
    else:
        precision = options.precision if options.precision != "auto" else "fp16" \
            if provider != "CPUExecutionProvider" else "fp32"
        build_artifacts(ckpt, out, variants=names, trace=trace_precision(precision), provider=provider)
    warn_if_pipeline_assumed(directory, out)
    print(out)
    return 0


def cmd_encode(args: argparse.Namespace) -> int:
    from attnserve.offline.checks import check_before_loading, late_chunking_refusal
    from attnserve.offline.image_readers import is_image_folder
    from attnserve.offline.job import summary_line

    config, options = from_args(EngineConfig, args), from_args(EncodeConfig, args)
    text_column = options.text_column or "text"
    check_before_loading(Path(args.input), Path(args.output), allow_empty=options.allow_empty,
                         text_column=text_column, id_column=options.id_column, image_column=options.image_column)
    images = options.image_column is not None or is_image_folder(args.input)
    chunk_rows = _checked_chunk_rows(options, images)
    _check_encode_flags(options, args.input, images)
    # From the model's files, before it loads: a checkpoint's export and a first start's calibration take a while.
    if options.late_chunking and not options.server and config.artifacts and (
            why := late_chunking_refusal(Path(config.artifacts))):
        raise AttnserveError(why)
    job = _encode_job(args, options, text_column, chunk_rows)
    stats = _encode(job, config, options)
    print(summary_line(stats, job.output, job.errors_path if job.on_error == "skip" else None,
                       "images" if images else "texts"))
    return 0


def _checked_chunk_rows(options: EncodeConfig, images: bool) -> int:
    """--chunk-rows, or its default for the input's kind."""
    chunk_rows = options.chunk_rows if options.chunk_rows is not None else IMAGE_CHUNK_ROWS if images else CHUNK_ROWS
    if chunk_rows < 1:
        raise AttnserveError(f"--chunk-rows must be positive, got {chunk_rows}")
    return chunk_rows


def _check_encode_flags(options: EncodeConfig, source: str, images: bool) -> None:
    """encode's flags against each other and the input's kind, after the input's own checks."""
    from attnserve.config import MAX_IMAGE_PIXELS_CEILING

    if options.max_image_pixels is not None:
        if not images:
            raise AttnserveError(f"--max-image-pixels applies to images; {source} holds texts")
        if options.server:
            raise AttnserveError("--max-image-pixels applies to this process's decoding; through --server, the "
                                 "server's own limit (serve --max-image-pixels) applies")
        if not 1 <= options.max_image_pixels < MAX_IMAGE_PIXELS_CEILING:
            raise AttnserveError(f"--max-image-pixels must be from 1 to below Pillow's bomb limit "
                                 f"{MAX_IMAGE_PIXELS_CEILING:,}, got {options.max_image_pixels:,}")
    if options.server and options.engine != "local":
        raise AttnserveError("--server sends the work to a running server; it does not combine with --engine ray")
    if options.prompt_name is not None and options.prompt is not None:
        raise AttnserveError("give --prompt-name or --prompt, not both")
    if options.model and not options.server:
        raise AttnserveError("--model names one of a --server's models; without --server, give --artifacts")
    if options.chunk_tokens is not None and options.late_chunking != "tokens":
        raise AttnserveError("--chunk-tokens goes with --late-chunking tokens")


def _encode_job(args: argparse.Namespace, options: EncodeConfig, text_column: str, chunk_rows: int) -> EncodeJob:
    from attnserve.images import DEFAULT_MAX_PIXELS
    from attnserve.offline.job import EncodeJob
    from attnserve.offline.rows import LateChunks, Prompt

    late = LateChunks(options.late_chunking, DEFAULT_CHUNK_TOKENS if options.chunk_tokens is None
                      else options.chunk_tokens) if options.late_chunking else None
    return EncodeJob(Path(args.input), Path(args.output), options.normalize, text_column, options.id_column,
                     chunk_rows, progress=options.progress, on_error=options.on_error, overwrite=options.overwrite,
                     dimensions=options.dimensions, prompt=Prompt(options.prompt_name, options.prompt),
                     model=options.model, task=options.task, embedding_type=options.precision_out,
                     input_type=options.input_type, late_chunking=late,
                     outputs=tuple(name.strip() for name in options.outputs.split(",")) if options.outputs else (),
                     image_column=options.image_column,
                     max_image_pixels=DEFAULT_MAX_PIXELS if options.max_image_pixels is None
                     else options.max_image_pixels)


def _encode(job: EncodeJob, config: EngineConfig, options: EncodeConfig) -> EncodeResult:
    """The job, through a server, on a pool of Ray actors or in this process: its totals."""
    from attnserve.default_model import resolve_artifacts

    if options.server:
        from attnserve.offline.remote import encode_file_remote

        return encode_file_remote(job, from_args(ClientConfig, argparse.Namespace(target=options.server,
                                                                                  api_key=options.api_key)))
    if options.engine == "ray":
        from attnserve.offline.ray_encode import encode_file_ray

        return encode_file_ray(job, config, _task_artifacts(resolve_artifacts(
            config.artifacts, config.precision, config.provider), options.task),
                               options.ray_address, options.ray_actors)
    from attnserve.engine.engine import Engine
    from attnserve.offline.encode import encode_file

    engine = Engine.from_directory(_task_artifacts(resolve_artifacts(
        config.artifacts, config.precision, config.provider), options.task), config)
    print(f"attnserve: {engine.describe()}", file=sys.stderr)
    return encode_file(engine, job)


def _task_artifacts(directory: Path, task: str | None) -> Path:
    """The artifact directory of --task's merged graphs (engine/tasks.py), or a one-line refusal."""
    if task is None:
        return directory
    from attnserve.engine.manifest import load_manifest
    from attnserve.engine.tasks import task_directory

    return task_directory(load_manifest(directory, check_hashes=False), task)


def cmd_serve(args: argparse.Namespace) -> int:
    import asyncio

    from attnserve.server import logs
    from attnserve.server.ports import check_ports_free

    engine_config, server_config = from_args(EngineConfig, args), from_args(ServerConfig, args)
    logs.configure(args.log_level or "INFO", server_config.log_format)
    # First of all: --workers auto measures the default model (and on a first start exports it), minutes for a
    # large one, and a port in use would be found only after that.
    check_ports_free(server_config)
    if server_config.workers == "auto":
        from attnserve.server.workers.auto import auto_workers

        server_config = dataclasses.replace(server_config, workers=str(auto_workers(engine_config, server_config)))
    if server_config.worker_count > 1:
        return serve_workers(engine_config, server_config, args.log_level or "INFO")
    from attnserve.server.app import serve

    return asyncio.run(serve(engine_config, server_config))


def serve_workers(engine_config: EngineConfig, server_config: ServerConfig, log_level: str) -> int:
    """`serve --workers N` (server/workers/): every process's metrics go to files in one directory, which
    prometheus_client must know of before it is imported in any of them."""
    import asyncio
    import shutil
    import tempfile

    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    directory = given or tempfile.mkdtemp(prefix="attnserve-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory  # the workers inherit it
    # Imported already, its values would stay this process's alone (a bug, not a user's mistake).
    assert "prometheus_client" not in sys.modules, "prometheus_client imported before its multiprocess directory"
    from attnserve.server.workers.supervisor import serve_workers as run

    try:
        return asyncio.run(run(engine_config, server_config, log_level))
    finally:
        if not given:
            shutil.rmtree(directory, ignore_errors=True)


def cmd_embed(args: argparse.Namespace) -> int:
    import json

    from attnserve.client import Client

    texts = [line.rstrip("\n") for line in sys.stdin] if args.texts == ["-"] else args.texts
    with Client(config=from_args(ClientConfig, args), model=args.model) as client:
        results = client.encode(texts, normalize=args.normalize, pooling=args.pooling, truncate=args.truncate,
                                token_embeddings=args.token_embeddings, dimensions=args.dimensions,
                                prompt_name=args.prompt_name, prompt=args.prompt)
    out = []
    for text, r in zip(texts, results, strict=True):
        item = {"text": text, "num_tokens": r.num_tokens, "truncated": r.truncated,
                "embedding": [round(float(x), 7) for x in r.sentence_embedding]}
        if r.token_embeddings is not None:
            item["tokens"] = r.tokens
            item["token_embeddings"] = [[round(float(x), 7) for x in row] for row in r.token_embeddings]
        out.append(item)
    json.dump({"embeddings": out}, sys.stdout)
    print()
    return 0


def cmd_attention(args: argparse.Namespace) -> int:
    from attnserve.client import Client
    from attnserve.client.attention_export import check_request, fetch, write
    from attnserve.client.image_attention import is_image_file
    from attnserve.server.requests import out_of_range

    path = Path(args.output)
    if is_image_file(args.text):  # an image-text model's image: its maps over the patches
        return _image_attention(args, path)
    check_request(args.view, path, args.head, args.scale)
    with Client(config=from_args(ClientConfig, args), model=args.model) as client:
        info = client.model_info()
        for flag, what, index, size in (("--layer", "layer", args.layer, info.num_layers),
                                        ("--head", "head", args.head, info.num_heads)):
            if index is not None and (problem := out_of_range(what, index, size, named=flag)):
                raise AttnserveError(problem)
        data = fetch(client, args.text, args.pair, args.layer, info.num_layers, args.view, path,
                     norms=info.kind != "reranker")
    what = write(data, info.model, args.view, path, args.head, args.scale)
    print(f"wrote {path}: {what}, {len(data.tokens)} tokens")
    return 0


def _image_attention(args: argparse.Namespace, path: Path) -> int:
    from attnserve.client import Client
    from attnserve.client.image_attention import check_image_request, fetch_image, write_image
    from attnserve.server.requests import out_of_range

    check_image_request(args.view, path)
    if args.pair is not None:
        raise AttnserveError("--pair is for texts: an image has no second segment")
    with Client(config=from_args(ClientConfig, args), model=args.model) as client:
        info = client.model_info()
        if not info.HasField("image_tower"):
            raise AttnserveError(f"{info.model} is a text model: {args.text} is an image (ask a server of an "
                                 "image-text model: CLIP, SigLIP)")
        tower = info.image_tower
        for flag, what, index, size in (("--layer", "layer", args.layer, tower.num_layers),
                                        ("--head", "head", args.head, tower.num_heads)):
            if index is not None and (problem := out_of_range(what, index, size, named=flag)):
                raise AttnserveError(problem)
        data = fetch_image(client, Path(args.text), tower.num_layers)
    what = write_image(data, args.view, path, args.layer % tower.num_layers,
                       None if args.head is None else args.head % tower.num_heads)
    print(f"wrote {path}: {what}, {len(data.tokens)} positions")
    return 0


def cmd_health(args: argparse.Namespace) -> int:
    from attnserve.client.client import open_channel
    from attnserve.client.health import NotServing, wait_until_serving

    config = from_args(ClientConfig, args)
    with open_channel(config, health_checked=False) as channel:  # it asks for the health itself
        try:
            wait_until_serving(channel, config.target, 0, service=args.service, probe_seconds=config.timeout)
        except NotServing as e:
            if e.status is None:  # no answer: an error, not a status
                raise
            print(f"{config.target}: {e.status}")
            return 1
    print(f"{config.target}: SERVING")
    return 0


def cmd_loadtest(args: argparse.Namespace) -> int:
    from attnserve.loadtest.run import run_loadtest

    config, client = from_args(LoadTestConfig, args), from_args(ClientConfig, args)
    if config.protocol in ("http", "kserve-http") and not is_set(ClientConfig, args, "target"):
        client.target = HTTP_TARGET  # the HTTP door's port, not the gRPC one that ClientConfig's default names
    return run_loadtest(config, client)


def add_request_options(parser: argparse.ArgumentParser) -> None:
    """What `embed` asks of each text, as `encode` does (EncodeConfig's --dimensions, --prompt-name and --prompt,
    the same help) and every protocol's requests do: flags only, since embed's other request flags have no
    environment variable either."""
    fields = {f.name: f for f in dataclasses.fields(EncodeConfig)}
    parser.add_argument("--dimensions", type=int, default=None, help=fields["dimensions"].metadata["help"])
    parser.add_argument("--prompt-name", default=None, help=fields["prompt_name"].metadata["help"])
    parser.add_argument("--prompt", default=None, help=fields["prompt"].metadata["help"])


class _Parser(argparse.ArgumentParser):
    """argparse's, whose errors are one line, with the likely fix: argparse's own print the whole usage above them
    (37 lines for serve), which hides the one line that matters. Its subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}; {_hint(message, self.prog)}\n")


# argparse's message for a value not among an argument's choices (the choices quoted or not, as versions differ).
_INVALID_CHOICE = re.compile(r"invalid choice: '?(?P<given>[^']*?)'? \(choose from (?P<choices>.*)\)$")


def _hint(message: str, prog: str) -> str:
    """The choice closest to an invalid one, or where to read what the command takes."""
    wrong = _INVALID_CHOICE.search(message)
    if wrong:
        choices = [choice.strip().strip("'\"") for choice in wrong["choices"].split(",")]
        close = difflib.get_close_matches(wrong["given"], choices, n=1, cutoff=0.6)
        if close:
            return f"did you mean {close[0]}?"
    return f"`{prog} --help` lists what it takes"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="attnserve", description="Contextualized embeddings and attention maps from a Transformer encoder.")
    parser.add_argument("--version", action="version", version=f"attnserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = _Parser(add_help=False)  # the options every command takes; of the subcommands' parser class
    common.add_argument("--log-level", default=None, choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                        help="default: INFO for serve, WARNING otherwise")
    for add in (_add_export, _add_encode, _add_serve, _add_embed, _add_attention, _add_health, _add_loadtest):
        add(sub, common)
    return parser


def _add_export(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    export = sub.add_parser("export", parents=[common], help="build the ONNX artifact directory from a checkpoint",
                            description="Export a checkpoint to ONNX, each graph verified against PyTorch: the graph "
                                        "a run of --precision on --provider needs (the other graphs are built when "
                                        "a run first needs them), or with --all every graph: fp32, fused, int8, "
                                        "fp16, OpenVINO's where it is installed, and the attention graphs. fp16 and "
                                        "bf16 are traced straight into half precision, with no fp32 copy of the "
                                        "weights held; graphs are verified on the provider. An --out that holds "
                                        "this checkpoint's artifacts gets what it lacks added.")
    add_arguments(export, ExportConfig)
    export.set_defaults(func=cmd_export)


def _add_encode(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    encode = sub.add_parser("encode", parents=[common],
                            help="encode a .txt, .jsonl or .parquet file, or a folder of images, into Parquet "
                                 "embeddings",
                            description="Offline batch encoding. Output columns: id, embedding, num_tokens, "
                                        "truncated; rows in input order.")
    # The run's input and output are named on each command line, not settings of an environment.
    encode.add_argument("input", help=".txt (one text per line), .jsonl ('text' or 'token_ids', optional 'id'), "
                                      ".parquet (a text column, or --image-column; optional id column), or a folder "
                                      "of images (an image-text model's: every .png, .jpg, .jpeg, .webp, .gif, .bmp, "
                                      ".tif, .tiff file under it, by path; each row's id its path in the folder)")
    encode.add_argument("-o", "--output", required=True, help="the .parquet file to write, in a folder that exists")
    add_arguments(encode, EncodeConfig)
    add_arguments(encode, EngineConfig)
    encode.set_defaults(func=cmd_encode)


def _add_serve(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    serve = sub.add_parser("serve", parents=[common], help="serve embeddings and attention weights over gRPC and HTTP",
                           description="The attnserve.v1.Encoder gRPC service, with grpc.health.v1 health, server "
                                       "reflection and Prometheus metrics, and on --http-port the OpenAI- and "
                                       "TEI-compatible HTTP routes and /v1/attention. Inputs of concurrent "
                                       "requests of both are batched by length. SIGTERM or SIGINT drains and "
                                       "exits 0.")
    add_arguments(serve, EngineConfig)
    add_arguments(serve, ServerConfig)
    serve.set_defaults(func=cmd_serve)


def _add_embed(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    embed = sub.add_parser("embed", parents=[common], help="client: embed texts on a running server, print JSON",
                           description="Send texts to a running attnserve server and print their sentence "
                                       "embeddings as JSON.")
    embed.add_argument("texts", nargs="+", metavar="TEXT", help="texts to embed; a single - reads lines from stdin")
    embed.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                       help="L2-normalise (default: as the model's own pipeline does)")
    embed.add_argument("--pooling", choices=("default", "mean", "cls"), default="default",
                       help="sentence pooling (default: the model's own)")
    embed.add_argument("--truncate", action=argparse.BooleanOptionalAction, default=None,
                       help="cut texts longer than max_seq_length (--no-truncate: refuse them) (default: as the "
                            "server's --long-inputs says, which cuts unless turned off)")
    embed.add_argument("--token-embeddings", action="store_true", help="also print per-token embeddings")
    embed.add_argument("--model", default=None, help="the served model to use (default: the server's default)")
    add_request_options(embed)
    add_arguments(embed, ClientConfig)
    embed.set_defaults(func=cmd_embed)


def _add_attention(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    attention = sub.add_parser("attention", parents=[common],
                               help="client: draw or export a text's or an image's attention",
                               description="Fetch TEXT's attention weights and analyses from a running server and "
                                           "write a figure (.png, .svg, .pdf), a standalone explorer page (.html) "
                                           "or the arrays (.npz, .json), the type following -o's extension.")
    attention.add_argument("text", help="the text (truncated at max_seq_length), or an image file's path (.png, "
                                        ".jpg, .webp, ...: an image-text model's maps over its patches, drawn over "
                                        "it as .png or .jpg, or its arrays as .npz or .json)")
    attention.add_argument("--pair", default=None, help="a second text: TEXT and it as a sentence pair")
    # Checked by client/attention_export.py rather than argparse's choices: a wrong value is then one line.
    attention.add_argument("--view", default="heatmap",
                           help="the figure: heatmap (a layer's; the default), heads (its head view), model (every "
                                "layer x head), rollout, norms (norm-weighted attention), stats (per-head statistics)")
    attention.add_argument("--layer", type=int, default=-1, help="layer index; negative counts from the end "
                                                                  "(default -1, the last)")
    attention.add_argument("--head", type=int, default=None,
                           help="head index (default: the mean of all heads; for norms, their sum)")
    attention.add_argument("--scale", default="fixed",
                           help="colours: fixed 0..1 (the default: maps compare), row (each row to its largest), log")
    attention.add_argument("-o", "--output", required=True,
                           help="the file to write: .png, .svg, .pdf, .html, .npz or .json")
    attention.add_argument("--model", default=None, help="the served model to use (default: the server's default)")
    add_arguments(attention, ClientConfig)
    attention.set_defaults(func=cmd_attention)


def _add_health(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    health = sub.add_parser("health", parents=[common], help="client: ask a server's gRPC health service",
                            description="Ask the standard grpc.health.v1 service of a running server; exit 0 when "
                                        "it is SERVING, 1 otherwise. For container health checks and scripts.")
    health.add_argument("--service", default="", help="service name to ask about (default: the whole server)")
    add_arguments(health, ClientConfig)
    health.set_defaults(func=cmd_health)


def _add_loadtest(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    loadtest = sub.add_parser(
        "loadtest", parents=[common], help="client: closed- or open-loop load against a server or fleet",
        description="Send Embed requests to TARGET, either keeping --concurrency requests in flight (closed loop) or "
                    "starting --rate requests per second whatever the replies (open loop), for --duration seconds "
                    "or --requests requests. Reports requests/s, tokens/s, latency p50/p90/p99/max and every "
                    "status code; --json and --plot write it to files. SIGINT or SIGTERM stops the load early "
                    "and still reports.")
    add_arguments(loadtest, LoadTestConfig)
    add_arguments(loadtest, ClientConfig)
    loadtest.set_defaults(func=cmd_loadtest)


def _refuse_unknown(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> NoReturn:
    """An argument no subcommand takes, named by the subcommand it was given to, with the flag it comes closest
    to (argparse itself says `attnserve: error: unrecognized arguments` with the top-level usage)."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    command = commands[args.command]
    given = next((e for e in extra if e.startswith("-")), extra[0]).split("=", 1)[0]
    flags = [flag for action in command._actions for flag in action.option_strings]
    close = difflib.get_close_matches(given, flags, n=1, cutoff=0.6) if given.startswith("-") else []
    # One line, not the usage argparse prints above its errors: the one thing wrong, and its likely fix.
    print(f"attnserve {args.command}: error: unrecognized argument {given}"
          + (f"; did you mean {close[0]}?" if close else f"; `attnserve {args.command} --help` lists what it takes"),
          file=sys.stderr)
    sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            return _main(argv)
        finally:
            # Here, where a reader gone is caught: at the interpreter's exit it would print "Exception ignored".
            sys.stdout.flush()
    except BrokenPipeError as e:
        if not _reader_gone(sys.stdout):
            print(f"attnserve: error: {e.strerror or e}", file=sys.stderr)
            return 1
        # `attnserve embed ... | head`: the reader has what it wanted. Quiet, as tools killed by SIGPIPE are: what is
        # still buffered goes nowhere, and the status is theirs.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _reader_gone(stream: TextIO) -> bool:
    """Whether the stream is a pipe whose reading end is closed (poll reports an error on its writing end)."""
    try:
        poll = select.poll()
        poll.register(stream.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError):  # no file descriptor (a test's StringIO), or a closed one
        return False


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        _refuse_unknown(parser, args, extra)
    logging.basicConfig(level=args.log_level or "WARNING", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command != "serve":  # serve's log carries them, in its format
        show_on_stderr()  # a first start's calibration, say what it does while it does it
    try:
        return args.func(args)
    except AttnserveError as e:
        print(f"attnserve {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        # An encode run says where it stopped and that the same command resumes.
        print(f"attnserve {args.command}: {str(e) or 'interrupted'}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
