"""The graph variants an artifact directory can hold, which build step makes each, and which a run needs first.

A directory grows as it is used (docs/artifacts.md): its first export traces the model once and builds the one
graph the run will use on this machine; every other variant is built by its step when first needed (a request for
attention, a --precision, `attnserve export --all`), verified against PyTorch's outputs, and only then listed in
the manifest. This module is the table of them: it imports neither torch nor onnxruntime, so that the engine and
the server can ask what a variant takes before anything builds it (export/artifacts.py builds them).

The steps, in the order `export --all` runs them:

  trace      the model traced once (torch): the plain graph, its weights file and the PyTorch reference
             (export/verify.py Reference). Traced in fp32 (embeddings.onnx), or straight into fp16
             (embeddings_half.onnx) for a run whose precision is fp16 or bf16: no fp32 copy is ever held.
  fuse       onnxruntime's transformer optimizer on the fp32 plain graph (embeddings_fused)
  fp16       the fused graph in half precision, for CUDA: converted from the fp32 plain graph, or fused from the
             half trace
  openvino   the plain graph as it is, compiled by OpenVINO in fp32 or bf16 (no file of its own)
  int8       the measured int8 recipe on the fused graph (its bar is the cosine on all 512 verification texts,
             whose PyTorch embeddings need the model loaded once more, and are kept: the quantized embeddings'
             ranges)
  attention  the attention graphs, traced with their maps (torch: their maps are verified against PyTorch's)
"""

from __future__ import annotations

from dataclasses import dataclass

from .machine import this_machine
from .openvino_session import openvino_version
from .session import CPU, ONNXRUNTIME, OPENVINO

STEPS = ("trace", "fuse", "fp16", "openvino", "int8", "attention")
# Steps that need the checkpoint loaded in PyTorch (and torch installed): the rest build from the directory alone.
TORCH_STEPS = ("trace", "int8", "attention")
# The plain graphs a trace writes, by the dtype traced in.
PLAIN = {"fp32": "embeddings.onnx", "fp16": "embeddings_half.onnx"}
SCORES_PLAIN = {"fp32": "scores.onnx"}
EMBEDDINGS_OUTPUTS = ("last_hidden_state", "sentence_embedding")
LAST_MAPS, ROLLOUT = "last_attentions", "rollout"  # export/attention_last.py's outputs


@dataclass(frozen=True)
class Variant:
    file: str
    precision: str  # "fp32", "int8", "fp16" or "bf16"
    fused: bool  # built by onnxruntime's optimizer (the manifest says whether every layer's attention fused)
    outputs: tuple[str, ...]
    step: str
    backend: str = ONNXRUNTIME
    # onnxruntime graph transformers its session must not apply (two variants may share one file and differ only
    # in these: export verifies each).
    disabled_optimizers: tuple[str, ...] = ()


# At load, onnxruntime fuses the int8 graph's residual Add + LayerNormalization into SkipLayerNormalization, whose CPU
# kernel is slower than the two ops it replaces: on 2 AVX-512 VNNI cores, 1,000 mixed-length texts, it took 19% of
# the int8 graph's kernel time (796 ms against 311 ms for Add + LayerNormalization in the fp32 graph), and the graph
# ran 1.23x faster without it; with the shipped int8 recipe, 2.50x fp32 without it and 1.95x with it
# (bench/int8_candidates.md). The default int8 variant runs without it; the fused one stays a candidate that the
# engine times on the CPU that runs (engine/calibration.py). The fp32 graphs' sessions make no such fusion.
NO_SKIP_LAYER_NORM = ("SkipLayerNormFusion",)

EMBEDDER_VARIANTS = {
    "embeddings": Variant("embeddings.onnx", "fp32", False, EMBEDDINGS_OUTPUTS, "trace"),
    "embeddings_fused": Variant("embeddings_fused.onnx", "fp32", True, EMBEDDINGS_OUTPUTS, "fuse"),
    "embeddings_fp16": Variant("embeddings_fp16.onnx", "fp16", True, EMBEDDINGS_OUTPUTS, "fp16"),
    # OpenVINO runs the plain graph as it is: the fp32 trace's, else the half trace's (its file is then
    # embeddings_half.onnx: Variants.file says which).
    "embeddings_openvino": Variant("embeddings.onnx", "fp32", False, EMBEDDINGS_OUTPUTS, "openvino", OPENVINO),
    "embeddings_bf16": Variant("embeddings.onnx", "bf16", False, EMBEDDINGS_OUTPUTS, "openvino", OPENVINO),
    "embeddings_int8": Variant("embeddings_int8.onnx", "int8", True, EMBEDDINGS_OUTPUTS, "int8",
                               disabled_optimizers=NO_SKIP_LAYER_NORM),
    "embeddings_int8_skip_layer_norm": Variant("embeddings_int8.onnx", "int8", True, EMBEDDINGS_OUTPUTS, "int8"),
    "attention": Variant("attention.onnx", "fp32", False, (*EMBEDDINGS_OUTPUTS, "attentions", "value_norms"),
                         "attention"),
    # The last layer's maps and rollout alone, at about the embeddings graph's cost (attention_last.py).
    "attention_last": Variant("attention_last.onnx", "fp32", False, (*EMBEDDINGS_OUTPUTS, LAST_MAPS, ROLLOUT),
                              "attention"),
}
RERANKER_VARIANTS = {
    "scores": Variant("scores.onnx", "fp32", False, ("scores",), "trace"),
    "scores_fused": Variant("scores_fused.onnx", "fp32", True, ("scores",), "fuse"),
    "scores_fp16": Variant("scores_fp16.onnx", "fp16", True, ("scores",), "fp16"),
    "scores_int8": Variant("scores_int8.onnx", "int8", True, ("scores",), "int8",
                           disabled_optimizers=NO_SKIP_LAYER_NORM),
    "scores_int8_skip_layer_norm": Variant("scores_int8.onnx", "int8", True, ("scores",), "int8"),
    "attention": Variant("attention.onnx", "fp32", False, ("scores", "attentions", "value_norms"), "attention"),
}
# Each step's seconds, roughly, as (fixed, per GB of fp32 weights), on 2 AVX-512 cores: what a build's progress
# lines and a server's Retry-After estimate (a model, said as "about"). Measured: all-MiniLM-L6-v2 (0.09 GB) and
# all-mpnet-base-v2 (0.44 GB); the int8 step is mostly its node-by-node search (MPNet: 105 s of it).
STEP_SECONDS = {"trace": (4.0, 30.0), "fuse": (2.0, 15.0), "fp16": (3.0, 25.0), "openvino": (2.0, 10.0),
                "int8": (8.0, 350.0), "attention": (5.0, 45.0), "quantization": (2.0, 50.0)}
STEP_TITLES = {"trace": "trace: the model traced once, PyTorch's reference, the plain graph verified",
               "fuse": "the fused graph (onnxruntime's optimizer)", "fp16": "the fp16 graph",
               "openvino": "OpenVINO's graphs", "int8": "the int8 graph (its recipe measured on texts)",
               "attention": "the attention graphs", "quantization": "the quantized embeddings' ranges (512 texts)"}


def fp32_weight_bytes(vocab_size: int, hidden_size: int, num_layers: int, intermediate_size: int) -> int:
    """About how many bytes a model's fp32 weights take: its embeddings and, per layer, attention's four projections
    and the feed-forward's two (a gated one's three: near enough)."""
    per_layer = 4 * hidden_size * hidden_size + 2 * hidden_size * intermediate_size
    return 4 * (vocab_size * hidden_size + num_layers * per_layer)


# The cores STEP_SECONDS were measured on, and how much faster a step runs where PyTorch's reference, the trace and
# verification run on a GPU (the Qwen3-Embedding-8B shape's export took 2.7 min on an H200 with 16 cores, where
# these estimated 25 min for 2 cores).
MEASURED_CORES, GPU_SPEEDUP = 2, 1.2


# Verification's work grows with the check rows at the model's length (export/verify.py: three rows at it, beside
# about 4,200 tokens of short cases and texts), and faster than their tokens (attention is quadratic), up to the
# length memory allows (a few thousand tokens). STEP_SECONDS holds at all-mpnet-base-v2's 384; the Qwen3-0.6B
# shape's first export (3,344-token rows) took 5.3 times its per-GB share.
SHORT_CHECK_TOKENS, LONG_CHECK_ROWS, CHECK_LENGTH_CAP, QUADRATIC_FROM = 4200, 3, 3344, 2048
MEASURED_LENGTH = 384


def _check_work(max_seq_length: int) -> float:
    length = min(max_seq_length, CHECK_LENGTH_CAP)
    return SHORT_CHECK_TOKENS + LONG_CHECK_ROWS * length * (1 + length / QUADRATIC_FROM)


def estimated_seconds(step: str, weight_bytes: int, cores: int = MEASURED_CORES, gpu: bool = False,
                      max_seq_length: int = MEASURED_LENGTH, slowdown: float = 1.0) -> float:
    """About how long a step takes, for a model of weight_bytes of fp32 weights and its max_seq_length, on `cores`
    CPU cores (and a GPU), on a machine `slowdown` times as slow as STEP_SECONDS' now (engine/speed.py measures
    it: the table is one quiet machine's)."""
    fixed, per_gb = STEP_SECONDS[step]
    scale = MEASURED_CORES / max(1, cores) / (GPU_SPEEDUP if gpu else 1.0)
    if step != "quantization":  # every other step verifies its graph on the check rows
        scale *= _check_work(max_seq_length) / _check_work(MEASURED_LENGTH)
    return (fixed + per_gb * weight_bytes / 1e9 * scale) * slowdown


# The default graph of each precision (engine/engine.py runs it where nothing else is chosen).
EMBEDDINGS_DEFAULT = {"fp32": "embeddings_fused", "int8": "embeddings_int8", "fp16": "embeddings_fp16",
                      "bf16": "embeddings_bf16"}
SCORES_DEFAULT = {"fp32": "scores_fused", "int8": "scores_int8", "fp16": "scores_fp16"}
# The graph a run of each precision builds first, where none of that precision is built yet: what runs without
# the optimizer's pass. The plain fp32 graph is the trace itself; onnxruntime applies its own fusions when a
# session opens (the fused graph, with attention fused, was 6% faster on MiniLM: `export --all` builds it, and
# calibration then times both).
EMBEDDINGS_FIRST = {"fp32": "embeddings", "int8": "embeddings_int8", "fp16": "embeddings_fp16",
                    "bf16": "embeddings_bf16"}
SCORES_FIRST = {"fp32": "scores", "int8": "scores_int8", "fp16": "scores_fp16"}


def variants_of(kind: str) -> dict[str, Variant]:
    """Every variant a directory of this kind ("embedder" or "reranker") can hold."""
    return RERANKER_VARIANTS if kind == "reranker" else EMBEDDER_VARIANTS


def defaults_of(kind: str) -> dict[str, str]:
    """precision -> its default graph's name."""
    return SCORES_DEFAULT if kind == "reranker" else EMBEDDINGS_DEFAULT


def first_of(kind: str) -> dict[str, str]:
    """precision -> the graph a run builds first."""
    return SCORES_FIRST if kind == "reranker" else EMBEDDINGS_FIRST


def trace_precision(precision: str) -> str:
    """The dtype a new directory is traced in for a run of `precision`: fp16 for the half-precision runs (CUDA's
    fp16, OpenVINO's bf16), so that no fp32 copy of the weights is held; fp32 otherwise."""
    return "fp16" if precision in ("fp16", "bf16") else "fp32"


def step_variants(kind: str, step: str) -> list[str]:
    return [name for name, v in variants_of(kind).items() if v.step == step]


def run_variants(kind: str, precision: str, provider: str) -> list[str]:
    """The variants a run of `precision` ("auto" or one) on `provider` needs first, where none of its graphs is
    built (EMBEDDINGS_FIRST): the precision's first graph; for auto, fp32's on the CPU and
    fp16's on CUDA, and on a CPU with native bf16 where OpenVINO is installed, the bf16 graph beside fp32's (it
    reads the same file: calibration times both)."""
    cuda = provider != CPU
    chosen = precision if precision != "auto" else "fp16" if cuda else "fp32"
    names = [first_of(kind)[chosen]]
    if (precision == "auto" and not cuda and kind == "embedder" and openvino_version() is not None
            and this_machine().native_bf16):
        names.append("embeddings_bf16")
    return names
