"""The engine shared by the server and offline encoding: tokenize, plan batches, run a session, pool."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import cast

import numpy as np

from attnserve.config import EngineConfig
from attnserve.errors import ArtifactError, ConfigError, GraphUnavailableError
from attnserve.pooling_modes import PROMPT_TOKEN
from attnserve.progress import progress_log

from .batch_outputs import Assembled, assemble_batches, object_array
from .batching import pad, pad_types, plan_batches
from .bge_m3 import BgeM3Heads
from .builds import BackgroundBuilds, add_in_child, has
from .calibration import Choice, budgets, recorded_choice, timed_choice
from .encoded_inputs import EncodedInput
from .image_encoder import ImageEncoder, ImageInput
from .late_chunking import ChunkMeans
from .machine import this_machine
from .manifest import GraphVariant, Manifest, load_manifest
from .multi_vector import MultiVectorTokenizer
from .openvino_session import openvino_available
from .output_options import OutputHeads, OutputOptions, SparseOptions
from .outputs import chunk_vectors
from .prompts import prompt_text, unpooled_prompt
from .quantize import quantize
from .rows import BatchOutput
from .session import CPU, CUDA, OPENVINO, Session, open_graph, resolve_provider
from .tokenizer import TextTokenizer, TokenizedInput
from .variants import defaults_of, first_of, run_variants, variants_of
from .windows import Windows

# Texts a chunk of Engine.encode on a GPU, tokenized while the chunk before runs: a few of the GPU's batches.
OVERLAPPED_CHUNK = 512

log = logging.getLogger("attnserve.engine")

ATTENTION_VARIANT = "attention"
# The last layer's maps and rollout alone (export/attention_last.py): what the default attention request (the last
# layer) and rollout without weights need, at about the embeddings graph's cost where the attention graph's every
# layer and value norms cost 1.2-1.5x (docs/performance.md, "The attention path"). Artifacts exported before it
# have none: those requests run the attention graph.
LAST_LAYER_VARIANT = "attention_last"

# The attention graph's outputs after the embeddings', in order (export/torch_to_onnx.py MAPS).
MAPS = ("attentions", "value_norms")


@dataclass
class EncodeStats:
    texts: int = 0
    tokens: int = 0
    cells: int = 0  # token cells computed, padding included
    seconds: float = 0.0

    @property
    def padding_fraction(self) -> float:
        return (self.cells - self.tokens) / self.cells if self.cells else 0.0

    def add(self, other: EncodeStats) -> None:
        self.texts += other.texts
        self.tokens += other.tokens
        self.cells += other.cells
        self.seconds += other.seconds


@dataclass
class Encoded:
    # (N, D) float32 (D: manifest.embedding_size), in input order; a ColBERT model's: (N,) of (K_i, d) arrays
    embeddings: np.ndarray
    num_tokens: np.ndarray  # (N,) int32
    truncated: np.ndarray  # (N,) bool
    stats: EncodeStats = field(default_factory=EncodeStats)
    # Late chunking's (embeddings then (N,) of (k_i, H) chunk means): each text's chunks' (k_i, 3) int32 start, stop
    # (characters) and token count.
    chunks: np.ndarray | None = None
    # bge-m3's other outputs of the same pass (Engine.encode_bge_m3), where asked: (N,) of (indices, values) pairs,
    # and (N,) of (T_i - 1, d) ColBERT vectors.
    sparse: np.ndarray | None = None
    multi_vector: np.ndarray | None = None

    @staticmethod
    def joined(parts: Sequence[Encoded]) -> Encoded:
        """Consecutive parts' rows as one, in order (their stats summed): dense embeddings, and sparse weights
        where the parts have them."""
        stats = EncodeStats()
        for part in parts:
            stats.add(part.stats)
        sparse = [p.sparse for p in parts if p.sparse is not None]
        return Encoded(np.concatenate([p.embeddings for p in parts]), np.concatenate([p.num_tokens for p in parts]),
                       np.concatenate([p.truncated for p in parts]), stats,
                       sparse=object_array([pair for s in sparse for pair in s]) if sparse else None)


def _pairs(inputs: Sequence[EncodedInput]) -> np.ndarray:
    """(N,) of ((K_i,) int32 indices, (K_i,) float32 values): each input's sparse weights, one per input (a filter
    here would shift every later row onto another's)."""
    pairs = [(x.sparse.indices, x.sparse.values) for x in inputs if x.sparse is not None]
    assert len(pairs) == len(inputs), "sparse weights were asked of every input"
    return object_array(pairs)


class NotBuiltError(ArtifactError):
    """No graph of the precision a run asks for is built yet: `names` are the variants to build first."""

    def __init__(self, message: str, names: list[str]):
        super().__init__(message)
        self.names = names


def default_graphs(manifest: Manifest) -> dict[str, str]:
    """precision -> the name of its default graph, for the artifact's kind (engine/variants.py)."""
    return defaults_of(manifest.kind)


def precision_graph(manifest: Manifest, precision: str) -> GraphVariant | None:
    """The graph of `precision` that runs where the machine's own choice is not known (on CUDA, on Ray's driver;
    on the CPU it is one candidate among the exact graphs of its precision, candidate_graphs): the precision's
    default where it is built, else the one a run builds first, else another built of that precision (the same
    outputs); None where none is."""
    for name in (defaults_of(manifest.kind).get(precision), first_of(manifest.kind).get(precision)):
        if name in manifest.variants:
            return manifest.variants[name]
    table = variants_of(manifest.kind)
    built = [v for name, v in sorted(manifest.variants.items()) if v.precision == precision
             and name in table and table[name].step not in ("attention",)]
    return built[0] if built else None


def embeddings_graph(manifest: Manifest, config: EngineConfig) -> tuple[str, str, GraphVariant]:
    """(provider, precision, graph) that an engine with `config` runs before any calibration, without opening a
    session: the graph --graph names, else the precision's (precision_graph). NotBuiltError where the directory
    holds no graph of the precision yet."""
    provider = resolve_provider(config.provider)
    forced = _forced_graph(manifest, config)
    precision = config.precision if config.precision != "auto" else (
        forced.precision if forced else "fp16" if provider == CUDA else "fp32")
    if precision in ("int8", "bf16") and provider == CUDA:
        # Dynamic int8 ops have CPU kernels only: on CUDA they would silently run on the CPU; bf16 is OpenVINO's.
        raise ConfigError(f"the {precision} graph is for the CPU; on CUDA use fp16 or fp32")
    if precision == "bf16" and not this_machine().native_bf16:
        raise ConfigError("--precision bf16 needs a CPU with native bf16 (AVX512-BF16 or AMX), which this one "
                          f"lacks ({this_machine().describe()}): emulated, it runs slower than fp32; use fp32 or int8")
    variants = default_graphs(manifest)
    if precision not in variants:
        raise ConfigError(f"{manifest.model} has no {precision} graph; use one of {', '.join(variants)}")
    graph = precision_graph(manifest, precision)
    first = first_of(manifest.kind).get(precision)
    if graph is None and first in manifest.refused:  # a build made it and left it out: say why, build nothing
        raise ConfigError(f"{manifest.model} has no {precision} graph: {manifest.refused[first]}; use fp32")
    if graph is None and precision == "bf16" and not openvino_available():
        raise ConfigError("bf16 runs on OpenVINO, which is not installed: pip install 'attnserve[openvino]'")
    if graph is None:
        if manifest.source is None:  # exported whole, before variants were built as needed: it lacks this one
            if precision == "bf16":
                raise ConfigError(f"{manifest.model} has no bf16 graph: export it where OpenVINO is installed "
                                  "(pip install 'attnserve[openvino]') on a CPU with native bf16")
            if manifest.kind == "reranker" and precision == "int8":  # export left out an int8 off its bar
                raise ConfigError(f"{manifest.model} has no int8 graph: its int8 scores missed the export's bar, "
                                  "or it was exported before rerankers had one (re-export); use fp32")
            raise ArtifactError(f"{manifest.directory} has no {precision} graph ({variants[precision]}); re-export")
        raise NotBuiltError(f"{manifest.directory} holds no {precision} graph yet",
                            run_variants(manifest.kind, precision, provider))
    if forced is None:
        return provider, precision, graph
    candidates = candidate_graphs(manifest, precision)
    if forced not in candidates:
        raise ConfigError(f"--graph {forced.name} is not one of the {precision} graphs of {manifest.model}: "
                          f"{', '.join(v.name for v in candidates)} (or auto)")
    return provider, precision, forced


def _forced_graph(manifest: Manifest, config: EngineConfig) -> GraphVariant | None:
    if config.graph == "auto":
        return None
    table = variants_of(manifest.kind)
    # The graphs an engine can run: those with the outputs of the fp32 default (not the attention graph).
    outputs = table[defaults_of(manifest.kind)["fp32"]].outputs
    if config.graph not in manifest.variants:
        if manifest.source is not None and config.graph in table and table[config.graph].outputs == outputs:
            raise NotBuiltError(f"{manifest.directory} holds no {config.graph} graph yet", [config.graph])
        runnable = [v.name for v in manifest.variants.values() if v.outputs == outputs]
        if manifest.source is not None:
            runnable += [name for name, v in table.items() if v.outputs == outputs and name not in runnable]
        raise ConfigError(f"--graph {config.graph}: {manifest.model} has no such graph; choose auto or one of "
                          f"{', '.join(runnable)}")
    return manifest.variants[config.graph]


def candidate_graphs(manifest: Manifest, precision: str) -> list[GraphVariant]:
    """The exact graphs of a precision, the default first: the same outputs as the default (so not the attention
    graph), each verified against PyTorch at export within the precision's tolerance. OpenVINO's are left out
    where OpenVINO is not installed."""
    default = precision_graph(manifest, precision)
    assert default is not None, "embeddings_graph found one"
    others = sorted((v for v in manifest.variants.values() if v is not default and v.precision == precision
                     and v.outputs == default.outputs and (v.backend != OPENVINO or openvino_available())),
                    key=lambda v: v.name)
    return [default, *others]


# What --precision auto needs of a bf16 graph to choose it over fp32 unasked (issue 21: it stays close to fp32): its
# parity metric at export and the least value. A bf16 graph under it is still served where bf16 is asked for (it
# holds fp16's bar, export/verify.py TOLERANCES).
AUTO_BF16 = ("mean_cosine_sentence_embedding_texts", 0.9999)


def auto_candidates(manifest: Manifest, provider: str) -> tuple[list[GraphVariant], list[str]]:
    """What --precision auto times on the CPU: the fp32 graphs, and the bf16 graph where this CPU computes bf16
    and OpenVINO is installed (issue 21: bf16 runs by default where it is faster). And why bf16 is not among them,
    for the calibration record."""
    candidates = candidate_graphs(manifest, "fp32")
    bf16 = manifest.variants.get(default_graphs(manifest).get("bf16", ""))
    if provider != CPU or manifest.kind == "reranker":
        return candidates, []
    machine = this_machine()
    if not machine.native_bf16:
        why = f"this CPU has no native bf16 (AVX512-BF16 or AMX): {machine.describe()}"
    elif not openvino_available():
        why = "OpenVINO, which runs it, is not installed: pip install 'attnserve[openvino]'"
    elif bf16 is None:
        why = ("not built yet: `attnserve export --all` builds it, or run once with --precision bf16"
               if manifest.source is not None else "the artifacts have no bf16 graph (exported without OpenVINO)")
    elif (cosine := bf16.parity.get(AUTO_BF16[0], 0.0)) < AUTO_BF16[1]:
        why = (f"its embeddings' cosine to PyTorch's, {cosine:.5f} on average over real texts, is under the "
               f"{AUTO_BF16[1]:g} auto needs to choose it over fp32 (--precision bf16 serves it)")
    else:
        return [*candidates, bf16], []
    return candidates, [f"bf16 not timed: {why}"]


def host_parts(manifest: Manifest) -> OutputHeads:
    """What a request's host-side work needs of a model (an engine's, and a front-door worker's of `serve
    --workers`): its output heads (engine/output_options.py)."""
    tokenizer = TextTokenizer(manifest.path(manifest.tokenizer), manifest.served_max_length, manifest.vocab_size,
                              positions=manifest.max_seq_length, pad_to=manifest.pad_to_length,
                              pad_id=manifest.pad_id, static=manifest.static)
    multi_vector = (MultiVectorTokenizer(manifest, manifest.path(manifest.tokenizer))
                    if manifest.multi_vector is not None else None)
    bge_m3 = BgeM3Heads(manifest.directory, manifest.bge_m3) if manifest.bge_m3 is not None else None
    return OutputHeads(tokenizer, multi_vector, bge_m3)


class Engine:
    def __init__(self, manifest: Manifest, config: EngineConfig, attention: bool = False, build: bool = True,
                 build_log: Callable[[str], None] | None = None, defer_calibration: bool = False):
        """attention: open the attention graphs' sessions now (those built). build: where no graph of the
        precision (or the --graph) is built yet, build it now, in a child process (engine/builds.py), its lines to
        build_log (default: the progress logger); else refuse. defer_calibration: on a CPU with no calibration
        record, start on the precision's default graph and batch budget at once, and time them later
        (calibrate_pending(): a server does once it serves), rather than first."""
        self._log = build_log or progress_log.info
        self._defer = defer_calibration
        self._pending: Callable[..., Choice] | None = None  # the timing deferred: timed(stop=...)
        try:
            embeddings_graph(manifest, config)
        except NotBuiltError as missing:
            if not build:
                raise ArtifactError(f"{missing}: build it with `attnserve export --all`") from None
            add_in_child(manifest.directory, missing.names, resolve_provider(config.provider), self._log)
            manifest = load_manifest(manifest.directory)
        gpu = resolve_provider(config.provider) != CPU
        # A static model's run is a lookup and a mean, whose cost is mostly the run's own: its batches take a GPU's
        # budget on the CPU too (bench/bench_static.py, 20,000 texts: 238 runs, 0.35 s after tokenizing, against
        # 1,570 and 0.42 s at 2,048).
        config = replace(config, max_batch_tokens=config.batch_tokens_on(gpu or manifest.static is not None),
                         batch_cost_tokens=config.batch_cost_on(gpu))
        if config.max_batch_tokens < manifest.served_max_length:
            # A batch holds at least one input of the longest length served (TEI raises its budget alike).
            log.info("max_batch_tokens %d raised to %d, the longest input %s serves", config.max_batch_tokens,
                     manifest.served_max_length, manifest.model)
            config = replace(config, max_batch_tokens=manifest.served_max_length)
        self.manifest, self.config = manifest, config
        self.provider, self.precision, graph = embeddings_graph(manifest, config)
        # encode() may tokenize a chunk while the one before runs. Off: on the H200 it made encode slower (2,000
        # texts in 0.135 s against 0.058 s tokenizing and 0.035 s of graph; encode's intra-op threads spin on 16
        # cores beside the tokenizer's); bench/gpu_check.py measures it with and without those threads.
        self.overlaps_tokenizing = False
        self.heads = host_parts(manifest)
        self.tokenizer, self.multi_vector, self.bge_m3 = self.heads.tokenizer, self.heads.multi_vector, \
            self.heads.bge_m3
        self.graph_choice = self._choose_graph(graph)
        self.embeddings_variant = self.graph_choice.graph
        self.precision = self.embeddings_variant.precision  # auto may have timed bf16 faster than fp32
        # The padded-token budget batches are planned with (max_batch_tokens, or less where that ran faster here).
        self.batch_tokens = self.graph_choice.batch_tokens
        self._session = self.graph_choice.session or self._open_graph(self.embeddings_variant, self.provider)
        # The same graph on half the threads, where the server pairs batches (open_narrow_session); None: not opened.
        self._narrow: Session | None = None
        # Graphs of families with token types take them (helper fam adds the input to the embedders' graphs).
        self.takes_token_types = "token_type_ids" in {i.name for i in self._session.get_inputs()}
        self._attention_sessions: dict[str, Session] = {}  # variant name -> its session, opened once
        self._attention_lock = threading.Lock()
        self._builds: BackgroundBuilds | None = None  # the server's: background_builds()
        # An image-text model's image tower (CLIP, SigLIP), at the text graph's precision.
        self.images = None if manifest.images is None else ImageEncoder(
            manifest, self.precision, self.provider, config.threads,
            "on" if config.spin_wait == "auto" else config.spin_wait)
        if attention:
            for name in (ATTENTION_VARIANT, LAST_LAYER_VARIANT):
                if name in self.manifest.variants:
                    self._open_attention_session(name)

    # -- variants built as they are needed (engine/builds.py) ---------------------------------------------------------

    def background_builds(self) -> None:
        """From now on, require() builds what a request needs in the background (a server's engine)."""
        self._builds = BackgroundBuilds(lambda: self.manifest, self.provider, self._log, self.refresh)

    def build_names(self, asked: Sequence[str]) -> tuple[str, ...]:
        """serve --build's names -> the variants this model lacks of them: attention (attention_variants), int8 or
        uint8 (the quantized embeddings' ranges, "quantization": an embedder's), or a variant's own name. ConfigError
        for a name of no variant, or for graphs that cannot be built here (artifacts exported whole)."""
        table = variants_of(self.manifest.kind)
        names: list[str] = []
        for name in asked:
            if name == "attention":
                names += self.attention_variants()
            elif name in ("int8", "uint8"):
                names += ["quantization"] if self.manifest.kind == "embedder" else []
            elif name in table:
                names.append(name)
            else:
                raise ConfigError(f"--build {name}: not a graph of {self.manifest.model}; give attention, int8 or one "
                                  f"of its variants ({', '.join(table)})")
        missing = tuple(dict.fromkeys(n for n in names if not has(self.manifest, n)))
        if missing and self.manifest.source is None:
            raise ConfigError(f"--build: {self.manifest.model}'s artifacts ({self.manifest.directory}) lack "
                              f"{', '.join(missing)} and were exported whole, before graphs were built as needed: "
                              "export them again")
        return missing

    def build_in_background(self, names: Sequence[str], why: str) -> None:
        """Start building the variants named (build_names), unless a build runs: a server's engine only."""
        if names and self._builds is not None:
            self._builds.start(names, why)

    def refresh(self) -> None:
        """Read the manifest again, after a build added variants (every file checked as at start)."""
        self.manifest = load_manifest(self.manifest.directory)

    def attention_variants(self) -> tuple[str, ...]:
        """The graphs an attention request needs: the attention graph and the last-layer one (built together)."""
        return (ATTENTION_VARIANT,) if self.manifest.kind == "reranker" else (ATTENTION_VARIANT, LAST_LAYER_VARIANT)

    def require(self, needs: Sequence[str], what: str) -> Manifest:
        """The manifest, once what is needed is built: variants by name, "attention" (attention_variants) or
        "quantization" (the quantized embeddings' ranges). Built in the background where a server's builds are on
        (GraphBuildingError, retryable, until then), in the foreground otherwise (offline, a client of the engine).
        GraphUnavailableError where it cannot be built here. what: what needs them, for the messages."""
        manifest = self.manifest
        names = [n for need in needs for n in (self.attention_variants() if need == "attention" else (need,))]
        missing = [n for n in names if not has(manifest, n)]
        if not missing:
            return manifest
        if manifest.source is None:
            raise GraphUnavailableError(
                f"{what} of {manifest.model} need {', '.join(missing)}, which its artifacts ({manifest.directory}) "
                "lack: they were exported whole before graphs were built as needed; export them again")
        if self._builds is not None:
            self._builds.require(missing, what)
            return self.manifest
        try:
            add_in_child(manifest.directory, missing, self.provider, self._log)
        except ArtifactError as e:
            raise GraphUnavailableError(f"{what} of {manifest.model} need {', '.join(missing)}, which could not be "
                                        f"built: {e}") from None
        self.refresh()
        return self.manifest

    def _choose_graph(self, graph: GraphVariant) -> Choice:
        """The graph this engine runs and its batch token budget: forced by --graph, timed on this CPU
        (engine/calibration.py), or the precision's default at max_batch_tokens where there is nothing to choose or
        the choice would not be made on this machine."""
        cap = self.config.max_batch_tokens
        if self.provider != CPU:  # the record describes CPUs; on a GPU the default runs
            return Choice(graph, "forced by --graph" if self.config.graph != "auto" else
                          "the default on this provider", cap)
        if self.config.graph != "auto":
            if self.config.backend not in ("auto", graph.backend):
                raise ConfigError(f"--graph {graph.name} runs on {graph.backend}, not on --backend "
                                  f"{self.config.backend}")
            # The graph is not chosen here (--graph, or Ray's fingerprinted graph), but its batch budget is: it
            # changes speed, never results. Recorded apart from the choice among candidates.
            if len(budgets(self.manifest, self.config)) == 1:
                return Choice(graph, "forced by --graph", cap)
            choice = self._calibrated([graph], record_key=f"{self.precision} {graph.name}")
            return replace(choice, how=f"forced by --graph; {choice.how}")
        notes: list[str] = []
        if self.config.precision == "auto":
            candidates, notes = auto_candidates(self.manifest, self.provider)
        else:
            candidates = candidate_graphs(self.manifest, self.precision)
        if self.config.backend != "auto":
            on_backend = [v for v in candidates if v.backend == self.config.backend]
            if not on_backend:
                raise ConfigError(
                    f"--backend {self.config.backend}: {self.manifest.model} has no "
                    f"{'fp32 or bf16' if self.config.precision == 'auto' else self.precision} graph that it runs "
                    f"({', '.join(f'{v.name} on {v.backend}' for v in candidates)})"
                    + ("; OpenVINO runs fp32 and bf16 graphs, exported with attnserve[openvino] installed"
                       if self.config.backend == OPENVINO else ""))
            candidates = on_backend
        if len(candidates) == 1 and len(budgets(self.manifest, self.config)) == 1:
            return Choice(candidates[0], f"the only {candidates[0].precision} graph"
                          + "".join(f"; {n}" for n in notes), cap)
        return self._calibrated(candidates, record_key=self._record_key(candidates), notes=notes)

    def _calibrated(self, candidates: Sequence[GraphVariant], record_key: str, notes: Sequence[str] = ()) -> Choice:
        """The recorded choice for this CPU; else the candidates timed now, or (deferred) the first of them at
        max_batch_tokens, its timing left for calibrate_pending()."""
        recorded = recorded_choice(self.manifest, self.config, self.precision, candidates, record_key, notes)
        if recorded is not None:
            return recorded
        timed = partial(timed_choice, self.manifest, self.config, self.precision, candidates, self._timing_session,
                        record_key, notes)
        if not self._defer:
            return timed()
        self._pending = timed
        return Choice(candidates[0], "not timed on this CPU yet: timed once serving, and recorded"
                      + "".join(f"; {n}" for n in notes), self.config.max_batch_tokens)

    def _timing_session(self, variant: GraphVariant) -> Session:
        """A session to time a candidate with: the engine's own for the graph it runs (a deferred timing, beside
        the requests it serves: no second copy of the weights), a new one for another."""
        running = getattr(self, "_session", None)
        if running is not None and variant.name == self.embeddings_variant.name:
            return running
        return self._open_graph(variant, CPU)

    def calibrate_pending(self, stop: threading.Event | None = None) -> str | None:
        """Time what the start deferred (defer_calibration), record it, and run from now on the graph and batch
        budget it chose (the session swapped where the graph changed: a batch running meanwhile finishes on the old
        one). Its line, or None where nothing was deferred. stop: set, the timing ends before its next run
        (CalibrationStopped), nothing changed or recorded."""
        if self._pending is None:
            return None
        choice, self._pending = self._pending(stop=stop), None
        if choice.graph.name != self.embeddings_variant.name:
            self._session = choice.session or self._open_graph(choice.graph, self.provider)
            self.embeddings_variant, self.precision = choice.graph, choice.graph.precision
            if self._narrow is not None:  # the pair runs the graph chosen too
                self._narrow = self._open_graph(choice.graph, self.provider, threads=self.narrow_threads)
        self.graph_choice = replace(choice, session=None)
        self.batch_tokens = choice.batch_tokens
        return choice.how

    def _record_key(self, candidates: Sequence[GraphVariant]) -> str:
        """Where the choice among candidates is recorded: by precision, "auto" where precisions compete (bf16 beside
        fp32), and apart for a forced backend, so that no two candidate sets replace each other's record."""
        key = "auto" if any(v.precision != self.precision for v in candidates) else self.precision
        return key if self.config.backend == "auto" else f"{key} on {self.config.backend}"

    def _open_graph(self, variant: GraphVariant, provider: str, arena: bool = True, prepack: bool = True,
                    threads: int | None = None) -> Session:
        """threads: intra-op threads (None: the configured ones)."""
        return open_graph(self.manifest.path(variant.file), variant.backend, variant.precision, provider,
                          self.config.threads if threads is None else threads, arena, variant.disabled_optimizers,
                          prepack, spin="on" if self.config.spin_wait == "auto" else self.config.spin_wait)

    @property
    def narrow_threads(self) -> int:
        """A paired batch's intra-op threads: half the configured ones (0: one per usable CPU)."""
        return max(1, (self.config.threads or this_machine().usable_cpus) // 2)

    @property
    def has_narrow_session(self) -> bool:
        return self._narrow is not None

    def open_narrow_session(self) -> None:
        """Open the embeddings graph a second time on half the threads (narrow_threads): a server that pairs batches
        (ServerConfig.pair_batches) runs two of them at once under load, each on half the cores, and a lone batch
        on the full session. Its weights are held twice."""
        if self.provider != CPU:
            raise ConfigError("batches are paired on a CPU only")
        if self._narrow is None:
            self._narrow = self._open_graph(self.embeddings_variant, self.provider, threads=self.narrow_threads)

    @classmethod
    def from_directory(cls, directory: str | Path, config: EngineConfig | None = None, attention: bool = False,
                       build: bool = True, build_log: Callable[[str], None] | None = None,
                       defer_calibration: bool = False) -> Engine:
        return cls(load_manifest(directory), config or EngineConfig(), attention, build, build_log, defer_calibration)

    @property
    def has_last_layer_graph(self) -> bool:
        return LAST_LAYER_VARIANT in self.manifest.variants

    @property
    def has_attention_graphs(self) -> bool:
        """Whether the graphs an attention request runs on are built (attention_variants)."""
        return all(name in self.manifest.variants for name in self.attention_variants())

    def _open_attention_session(self, name: str = ATTENTION_VARIANT) -> Session:
        with self._attention_lock:
            if name not in self._attention_sessions:
                variant = self.manifest.variants.get(name)
                if variant is None:  # requests are checked before they are queued (Engine.require); this guards
                    raise GraphUnavailableError(f"{self.manifest.directory} has no {name} graph")
                # Its intermediates grow with tokens^2 per batch: an arena would keep a burst's peak (about
                # 250 MB for MiniLM) for the process's life (at some cost in speed: docs/performance.md).
                # No prepacking: its matrix products read the weights where onnxruntime maps the shared data file
                # (page cache, shared with every process serving the directory, given back under pressure), not
                # from a second private repacked copy beside the embeddings session's. onnxruntime shares
                # prepacked copies between sessions only through a container its Python API lacks, and
                # add_initializer over the same mapping measured no less (docs/artifacts.md, "Weights stored
                # once").
                self._attention_sessions[name] = self._open_graph(variant, self.provider, arena=False,
                                                                  prepack=False)
        return self._attention_sessions[name]

    def run(self, inputs: Sequence[TokenizedInput | ImageInput], attention: bool = False, last_layer: bool = False,
            token_states: bool = True, narrow: bool = False) -> BatchOutput:
        """One padded batch through one session; safe to call from several threads. last_layer (with attention):
        the batch needs no map but the last layer's, and rollout: the last-layer graph runs where the artifacts
        have one (BatchOutput.map_layers says which layers came back). A batch of images (all ImageInput) runs
        the image tower's graph: its embeddings are the sentence embeddings, its maps over the patches.
        token_states False (no attention): the sentence embeddings alone are fetched, not the (B, T, H) states.
        narrow: on the half-thread session (open_narrow_session), where it is open; attention and images run on
        their own sessions whatever it says."""
        if inputs and isinstance(inputs[0], ImageInput):
            return self._run_images(cast(Sequence[ImageInput], inputs), attention)
        inputs = cast(Sequence[TokenizedInput], inputs)
        started = time.perf_counter()
        feed = self._feed(inputs)
        lengths = np.fromiter((len(x) for x in inputs), dtype=np.int64, count=len(inputs))
        fed = time.perf_counter()
        session = self._narrow if narrow and self._narrow is not None else self._session
        if token_states or attention or self.manifest.kind == "reranker":
            out = self._run(feed, lengths, attention, last_layer, session)
        else:
            out = BatchOutput(lengths, None, session.run(["sentence_embedding"], feed)[0])
        out.feed_seconds, out.run_seconds = fed - started, time.perf_counter() - fed
        return out

    def _run_images(self, inputs: Sequence[ImageInput], attention: bool) -> BatchOutput:
        if self.images is None:  # requests are checked before they are queued (server/requests.py); this guards
            raise GraphUnavailableError(f"{self.manifest.model} has no image tower")
        started = time.perf_counter()
        out = self.images.run(list(inputs), attention)
        lengths = np.fromiter((len(x) for x in inputs), dtype=np.int64, count=len(inputs))  # NaFlex: each its own
        batch = BatchOutput(lengths, out["last_hidden_state"], out["image_embeds"], out.get("attentions"),
                            value_norms=out.get("value_norms"))
        batch.run_seconds = time.perf_counter() - started
        return batch

    def _run(self, feed: dict[str, np.ndarray], lengths: np.ndarray, attention: bool, last_layer: bool,
             session: Session) -> BatchOutput:
        """session: the embeddings graph's (the full one or the narrow one), for a batch without attention."""
        if self.manifest.kind == "reranker":
            if attention:
                session = self._open_attention_session()
                # Graphs exported before value norms have none (the "norms" analysis is refused: attention_requests.py).
                scores, attentions, *norms = session.run(["scores", *MAPS[:len(session.get_outputs()) - 1]], feed)
                return BatchOutput(lengths, None, None, attentions, scores, norms[0] if norms else None)
            return BatchOutput(lengths, None, None, scores=session.run(["scores"], feed)[0])
        if attention and last_layer and self.has_last_layer_graph:
            names = ["last_hidden_state", "sentence_embedding", "last_attentions", "rollout"]
            hidden, sentence, last, rollout = self._open_attention_session(LAST_LAYER_VARIANT).run(names, feed)
            return BatchOutput(lengths, hidden, sentence, last[None], rollout=rollout,  # (1, B, nh, T, T)
                               map_layers=(self.manifest.num_layers - 1,))
        if attention:
            session = self._open_attention_session()
            # Graphs exported before value norms have none (the "norms" analysis is refused: attention_requests.py).
            names = ["last_hidden_state", "sentence_embedding", *MAPS[:len(session.get_outputs()) - 2]]
            hidden, sentence, attentions, *norms = session.run(names, feed)
            return BatchOutput(lengths, hidden, sentence, attentions, value_norms=norms[0] if norms else None)
        hidden, sentence = session.run(["last_hidden_state", "sentence_embedding"], feed)
        return BatchOutput(lengths, hidden, sentence)

    def _feed(self, inputs: Sequence[TokenizedInput]) -> dict[str, np.ndarray]:
        """The graph's inputs, (B, T) int64 each; token types only where the graph takes them."""
        ids, mask = pad([x.ids for x in inputs])
        for row, x in enumerate(inputs):
            if x.attended is not None:  # a ColBERT query's expansion tokens: encoded, not attended to
                mask[row, x.attended:] = 0
            if x.unpooled:  # the prompt's tokens where the pooling leaves them out: attended to, not pooled
                mask[row, :x.unpooled] = PROMPT_TOKEN
        feed = {"input_ids": ids, "attention_mask": mask}
        types = [x.type_ids for x in inputs]
        if self.takes_token_types:
            feed["token_type_ids"] = pad_types(types, ids.shape[1])
        # A reranker's graph takes token types exactly where its family has them (export/reranker.py): for the
        # others (DistilBERT's tokenizer marks segment b with 1s) transformers ignores them too.
        elif self.manifest.kind != "reranker" and any(t is not None and t.any() for t in types):
            # Requests are checked before they are queued (server/requests.py); this guards other callers.
            raise ValueError(f"{self.manifest.model}'s graph takes no token_type_ids; re-export it to encode pairs")
        return feed

    def _sentence_embeddings(self, inputs: Sequence[TokenizedInput]) -> BatchOutput:
        """A batch's sentence embeddings alone: what plain embeddings need, without the (B, T, H) token states."""
        return self.run(inputs, token_states=False)

    def plan(self, lengths: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        """Inputs of these lengths cut into batches (engine/batching.py) at this engine's budget and run cost."""
        return plan_batches(lengths, self.batch_tokens, self.config.max_batch_size, self.config.batch_cost_tokens)

    def output_options(self, normalize: bool | None = None, dimensions: int | None = None,
                       embedding_type: str = "float", ranges: np.ndarray | None = None) -> OutputOptions:
        """Plain sentence embeddings' options: normalised as the checkpoint does where normalize is None."""
        return OutputOptions(None, self.manifest.normalize if normalize is None else normalize, dimensions, False,
                             None, embedding_types=(embedding_type,), ranges=ranges)

    def _assembled(self, inputs: Sequence[TokenizedInput], options: OutputOptions, token_states: bool,
                   on_batch: Callable[[int], None] | None) -> tuple[Assembled, Encoded]:
        """The inputs batched by length, each batch assembled (engine/batch_outputs.py); and the Encoded of their
        first embedding type, its token counts and stats."""
        run = self.run if token_states else self._sentence_embeddings
        done = assemble_batches(run, inputs, options, self.heads, self.plan, on_batch)
        stats = EncodeStats(len(inputs), int(done.lengths.sum()), done.cells, done.seconds)
        truncated = np.fromiter((x.truncated for x in inputs), dtype=bool, count=len(inputs))
        kind = options.embedding_types[0]
        if not options.dense:  # a SPLADE model's sparse weights, a ColBERT model's vectors: Encoded's other fields
            embeddings = np.zeros((len(inputs), 0), np.float32)
        elif not inputs:  # no batch ran: (0, D) of the type asked all the same
            embeddings = quantize(np.zeros((0, options.dimensions or self.manifest.embedding_size), np.float32), kind,
                                  options.ranges)
        else:
            embeddings = done.typed[kind]
        return done, Encoded(embeddings, done.lengths.astype(np.int32), truncated, stats)

    def score_tokenized(self, inputs: Sequence[TokenizedInput]) -> np.ndarray:
        """A reranker's raw logits (N, num_labels) for tokenized pairs, batched by length, in input order."""
        lengths = np.fromiter((len(x) for x in inputs), dtype=np.int64, count=len(inputs))
        scores = np.empty((len(inputs), self.manifest.num_labels), dtype=np.float32)
        for batch in self.plan(lengths):
            scores[batch] = self._session.run(["scores"], self._feed([inputs[i] for i in batch]))[0]
        return scores

    def encode_tokenized(self, inputs: Sequence[TokenizedInput], normalize: bool | None = None,
                         on_batch: Callable[[int], None] | None = None, options: OutputOptions | None = None
                         ) -> Encoded:
        """Sentence embeddings of many inputs, batched by length; rows come back in input order, assembled as a
        server's are (engine/outputs.py). options: dimensions, normalisation, the embedding type (the first of
        embedding_types) and a SPLADE model's sparse weights (Encoded.sparse); None: float embeddings normalised
        as `normalize` says (None: as the checkpoint does).

        on_batch(n) is called after each batch of n inputs ran: progress for callers that show it."""
        if self.manifest.kind == "reranker":
            raise ConfigError(f"{self.manifest.model} is a reranker (a cross-encoder): it scores pairs and has no "
                              "embeddings to encode")
        if self.multi_vector is not None:  # its graph's mean of the vectors is no embedding the model gives
            raise ConfigError(f"{self.manifest.model} is a multi-vector (ColBERT) model: it gives a vector per token, "
                              "not one embedding per input (encode_multi_vector)")
        options = options or self.output_options(normalize)
        done, encoded = self._assembled(inputs, options, False, on_batch)
        if options.sparse is not None:
            encoded.sparse = _pairs(done.each)
        return encoded

    def encode_multi_vector(self, inputs: Sequence[TokenizedInput], input_type: str,
                            on_batch: Callable[[int], None] | None = None) -> Encoded:
        """A ColBERT model's vectors of many inputs (made by self.multi_vector.encode for input_type), batched by
        length: Encoded.embeddings is then an (N,) object array of (K_i, d) float32 arrays, in input order."""
        if self.multi_vector is None:
            raise ConfigError(f"{self.manifest.model} is not a multi-vector (ColBERT) model")
        options = OutputOptions(None, False, None, False, None, multi_vector=input_type, dense=False)
        done, encoded = self._assembled(inputs, options, True, on_batch)
        encoded.embeddings = object_array([x.multi_vector for x in done.each])
        return encoded

    def encode_bge_m3(self, inputs: Sequence[TokenizedInput], sparse: bool, multi_vector: bool,
                      normalize: bool | None = None, on_batch: Callable[[int], None] | None = None,
                      options: OutputOptions | None = None) -> Encoded:
        """bge-m3's dense embeddings and, from the same pass, its sparse weights and ColBERT vectors where asked
        (engine/bge_m3.py); rows in input order, batched by length. options: the dense embeddings' (dimensions,
        normalisation, type); None: float, normalised as `normalize` says."""
        if self.bge_m3 is None:
            raise ConfigError(f"{self.manifest.model} has no bge-m3 heads (colbert_linear.pt, sparse_linear.pt)")
        options = replace(options or self.output_options(normalize), sparse=SparseOptions() if sparse else None,
                          multi_vector="document" if multi_vector else None)
        done, encoded = self._assembled(inputs, options, True, on_batch)
        encoded.sparse = _pairs(done.each) if sparse else None
        encoded.multi_vector = object_array([x.multi_vector for x in done.each]) if multi_vector else None
        return encoded

    def encode_late_chunks(self, windows: Sequence[Windows], ranges: Sequence[Sequence[tuple[int, int]]],
                           on_batch: Callable[[int], None] | None = None, options: OutputOptions | None = None
                           ) -> Encoded:
        """Late chunking of many texts (engine/late_chunking.py): every text's windows (TextTokenizer.windows) run
        batched by length with all the others', and each chunk's tokens (ranges: per text, token ranges [a, b))
        mean-pooled as its windows run. Encoded.embeddings is an (N,) object array of (k_i, D) float32 means, in
        input order, cut and normalised as options say (engine/outputs.py chunk_vectors, as a server's are; None:
        (k_i, H), neither); num_tokens, each text's tokens as the model saw them in all its windows.

        on_batch(n): n texts had their last window run."""
        if not self.manifest.late_chunkable:
            raise ConfigError(f"late chunking mean-pools token embeddings, and {self.manifest.model}'s embedding is "
                              f"not a pooling of them (its pipeline is {' -> '.join(self.manifest.modules)})")
        start = time.perf_counter()
        flat = [(i, j) for i, w in enumerate(windows) for j in range(len(w.inputs))]  # (text, window) per input
        inputs = [windows[i].inputs[j] for i, j in flat]
        firsts = [np.concatenate([[0], np.cumsum(w.text_tokens)[:-1]]) for w in windows]  # each window's 1st token
        means = [ChunkMeans(r, self.manifest.hidden_size) for r in ranges]
        left = [len(w.inputs) for w in windows]
        lengths = np.fromiter((len(x) for x in inputs), dtype=np.int64, count=len(inputs))
        cells = 0
        for batch in self.plan(lengths):
            out = self.run([inputs[k] for k in batch])
            assert out.last_hidden_state is not None
            finished = 0
            for row, k in enumerate(batch):
                i, j = flat[k]
                w = windows[i]
                tokens = out.last_hidden_state[row, w.text_start:w.text_start + w.text_tokens[j]]  # (m, H)
                means[i].add(tokens, int(firsts[i][j]))
                left[i] -= 1
                finished += left[i] == 0
            cells += int(lengths[batch].max()) * len(batch)
            if on_batch is not None and finished:
                on_batch(finished)
        chunks = np.empty(len(windows), dtype=object)
        for i, m in enumerate(means):
            chunks[i] = m.means() if options is None else chunk_vectors(m, options)  # (k_i, H) or (k_i, D)
        num_tokens = np.fromiter((sum(len(x) for x in w.inputs) for w in windows), dtype=np.int32,
                                 count=len(windows))
        stats = EncodeStats(len(windows), int(lengths.sum()), cells, time.perf_counter() - start)
        return Encoded(chunks, num_tokens, np.zeros(len(windows), dtype=bool), stats)

    def encode(self, texts: Sequence[str], normalize: bool | None = None, truncate: bool = True,
               prompt_name: str | None = None, prompt: str | None = None) -> Encoded:
        """Sentence embeddings of texts, each after its prompt (engine/prompts.py: the checkpoint's default
        prompt when neither prompt_name nor prompt is given)."""
        before = prompt_text(self.manifest, prompt_name, prompt)
        texts = [before + text for text in texts] if before else list(texts)
        tokenize = partial(self.tokenizer.encode_texts, truncate=truncate,
                           unpooled_prompt=unpooled_prompt(self.manifest, before))
        if not self.overlaps_tokenizing or len(texts) <= OVERLAPPED_CHUNK:
            return self.encode_tokenized(tokenize(texts), normalize)
        # On a GPU, tokenizing is about as long as the graph's runs (bench/gpu_check.sh: 2,000 texts, 0.03 to 0.06 s
        # each): the next chunk is tokenized (the tokenizers library's threads, the GIL released) while this one's
        # batches run.
        starts = range(0, len(texts), OVERLAPPED_CHUNK)
        parts = []

        def tokenized(start: int) -> list[TokenizedInput]:
            chunk = texts[start:start + OVERLAPPED_CHUNK]
            return tokenize(chunk, labels=[f"input {start + i}" for i in range(len(chunk))])

        with ThreadPoolExecutor(1, thread_name_prefix="attnserve-tokenize") as pool:
            pending = pool.submit(tokenized, starts[0])
            for start in starts:
                inputs = pending.result()
                if start + OVERLAPPED_CHUNK < len(texts):
                    pending = pool.submit(tokenized, start + OVERLAPPED_CHUNK)
                parts.append(self.encode_tokenized(inputs, normalize))
        return Encoded.joined(parts)

    def describe(self) -> str:
        provider = "CUDA" if self.provider == CUDA else "CPU" if self.provider == CPU else self.provider
        backend = " (OpenVINO)" if self.embeddings_variant.backend == OPENVINO else ""
        return (f"{self.manifest.model} · {self.precision} ({self.embeddings_variant.name}: {self.graph_choice.how}) "
                f"on {provider}{backend}")
