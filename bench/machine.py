"""What a bench measured on: the CPU, and onnxruntime's own matrix-multiplication ceilings on it.

Shared by bench_encode.py and bench_serve.py. A tokens/s figure means little without the machine: the same
graph ran at 0.945 of the fp32 MatMul peak on an AVX2 EPYC and at 0.73 on an AVX-512 Xeon, and int8 gained 1.84x
on the first and 1.53x on the second. So every report starts with the CPU model and the instruction sets that
decide onnxruntime's kernels (attnserve/engine/machine.py, which graph calibration uses too), and the ceilings
measured here, each a one-node ONNX graph on the CPU provider with default threads, best of several runs:

  fp32 MatMul 2048x2048      the peak that MFU has always been measured against (both inputs fed).
  fp32 MatMul, model shapes  the encoder's projections as they run: tokens x hidden times a constant weight of
                             hidden x hidden (Q, K, V, output: 4 a layer), hidden x intermediate and
                             intermediate x hidden (the feed-forward pair), at the batch's 2048 tokens.
  int8 DynamicQuantizeMatMul the same shapes through the op the int8 graph runs once onnxruntime has fused it
                             (fp32 activations quantized per batch, int8 weights with per-channel scales): the
                             ceiling of int8 encode, quantization of the activations included.
  int8 MatMulInteger         the same shapes as a bare uint8 x int8 -> int32 product: the integer kernel alone
                             (VNNI or AMX where the CPU has them).

A model-shapes ceiling is FLOP over time summed over the shapes with their counts a layer, at 2 FLOP a
multiply-add as for fp32, so the int8 figure reads as fp32-equivalent FLOP/s and divides the same FLOP count.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from attnserve.engine.machine import Machine, this_machine

MATMUL_N = 2048
MODEL_TOKENS = 2048  # the engine's default max_batch_tokens: the M of its GEMMs in a full batch
CEILINGS = ("fp32_2048", "fp32_model", "int8_dynamic", "int8_integer")


def model_flop(lengths: np.ndarray, layers: int, hidden: int, ffn: int) -> float:
    """FLOP of the encoder's matrix products over texts of these lengths: the Q, K, V and output projections, the
    two feed-forward matmuls, and QK^T and PV, at 2 FLOP a multiply-add (embeddings, norms and softmax left out)."""
    lengths = lengths.astype(np.float64)
    return float(np.sum(lengths * layers * (8 * hidden**2 + 4 * hidden * ffn + 4 * lengths * hidden)))


def model_shapes(hidden: int, ffn: int, tokens: int = MODEL_TOKENS) -> list[tuple[int, int, int, int]]:
    """(M, K, N, count a layer) of the encoder's projections on a batch of `tokens` tokens."""
    return [(tokens, hidden, hidden, 4), (tokens, hidden, ffn, 1), (tokens, ffn, hidden, 1)]


def _session(nodes, inputs, outputs, initializers, domains=()):
    import onnxruntime as ort
    from onnx import helper

    graph = helper.make_graph(nodes, "ceiling", inputs, outputs, initializers)
    # onnxruntime rejects the IR version that the newest onnx writes by default.
    opsets = [helper.make_opsetid("", 13)] + [helper.make_opsetid(d, 1) for d in domains]
    model = helper.make_model(graph, ir_version=8, opset_imports=opsets)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _gemm(kind: str, m: int, k: int, n: int, rng: np.random.Generator):
    """(session, feed) of one product (m, k) x (k, n) of the kind."""
    from onnx import TensorProto, helper, numpy_helper

    value = helper.make_tensor_value_info
    if kind == "fp32_2048":
        inputs = [value("a", TensorProto.FLOAT, [m, k]), value("b", TensorProto.FLOAT, [k, n])]
        session = _session([helper.make_node("MatMul", ["a", "b"], ["y"])], inputs,
                           [value("y", TensorProto.FLOAT, [m, n])], [])
        return session, {"a": rng.standard_normal((m, k), dtype=np.float32),
                         "b": rng.standard_normal((k, n), dtype=np.float32)}
    if kind == "fp32_model":
        weight = numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32), "w")
        session = _session([helper.make_node("MatMul", ["a", "w"], ["y"])], [value("a", TensorProto.FLOAT, [m, k])],
                           [value("y", TensorProto.FLOAT, [m, n])], [weight])
        return session, {"a": rng.standard_normal((m, k), dtype=np.float32)}
    weight = numpy_helper.from_array(rng.integers(-127, 128, (k, n), dtype=np.int8), "w")
    if kind == "int8_dynamic":
        scale = numpy_helper.from_array(np.full(n, 0.01, dtype=np.float32), "w_scale")
        zero = numpy_helper.from_array(np.zeros(n, dtype=np.int8), "w_zero")
        node = helper.make_node("DynamicQuantizeMatMul", ["a", "w", "w_scale", "w_zero"], ["y"],
                                domain="com.microsoft")
        session = _session([node], [value("a", TensorProto.FLOAT, [m, k])], [value("y", TensorProto.FLOAT, [m, n])],
                           [weight, scale, zero], domains=("com.microsoft",))
        return session, {"a": rng.standard_normal((m, k), dtype=np.float32)}
    if kind == "int8_integer":
        session = _session([helper.make_node("MatMulInteger", ["a", "w"], ["y"])],
                           [value("a", TensorProto.UINT8, [m, k])], [value("y", TensorProto.INT32, [m, n])], [weight])
        return session, {"a": rng.integers(0, 256, (m, k), dtype=np.uint8)}
    raise ValueError(f"unknown ceiling {kind!r}")


class Ceiling:
    """FLOP/s of one kind of product: sum of count x 2MKN over the shapes / sum of count x best seconds."""

    def __init__(self, kind: str, shapes: list[tuple[int, int, int, int]]):
        rng = np.random.default_rng(0)
        self.kind, self.shapes = kind, shapes
        self.gemms = [(*_gemm(kind, m, k, n, rng), count, 2.0 * m * k * n) for m, k, n, count in shapes]

    def measure(self, warmup: int = 1, repeats: int = 5) -> dict:
        seconds = flop = 0.0
        for session, feed, count, one_flop in self.gemms:
            for _ in range(warmup):
                session.run(None, feed)
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                session.run(None, feed)
                best = min(best, time.perf_counter() - start)
            seconds += count * best
            flop += count * one_flop
        return {"flop_per_s": flop / seconds, "seconds": seconds}


@dataclass
class Ceilings:
    """Every ceiling of CEILINGS, sampled together; the best sample of each is the ceiling."""

    hidden: int
    ffn: int

    def __post_init__(self) -> None:
        shapes = model_shapes(self.hidden, self.ffn)
        self.ceilings = {kind: Ceiling(kind, [(MATMUL_N, MATMUL_N, MATMUL_N, 1)] if kind == "fp32_2048" else shapes)
                         for kind in CEILINGS}
        self.samples: dict[str, list[dict]] = {kind: [] for kind in CEILINGS}

    def sample(self) -> dict[str, dict]:
        now = {kind: c.measure() for kind, c in self.ceilings.items()}
        for kind, result in now.items():
            self.samples[kind].append(result)
        return now

    def best(self) -> dict[str, float]:
        """FLOP/s of each kind: its best sample."""
        return {kind: max(s["flop_per_s"] for s in samples) for kind, samples in self.samples.items() if samples}


def machine_lines(machine: Machine | None = None) -> list[str]:
    import onnxruntime

    machine = machine or this_machine()
    return [f"machine: {machine.describe()}; onnxruntime {onnxruntime.__version__}, default threads, provider CPU"]


def ceiling_lines(best: dict[str, float], hidden: int, ffn: int) -> list[str]:
    g = {kind: flops / 1e9 for kind, flops in best.items()}
    return [
        f"ceilings (onnxruntime, one-op graphs, best sample): fp32 MatMul {MATMUL_N}x{MATMUL_N} "
        f"{g['fp32_2048']:.1f} GFLOP/s; at the model's shapes ({MODEL_TOKENS} tokens x H {hidden} x F {ffn}, "
        f"4 HxH + HxF + FxH a layer): fp32 MatMul {g['fp32_model']:.1f}, int8 DynamicQuantizeMatMul "
        f"{g['int8_dynamic']:.1f} ({g['int8_dynamic'] / g['fp32_model']:.2f}x fp32), int8 MatMulInteger "
        f"{g['int8_integer']:.1f} ({g['int8_integer'] / g['fp32_model']:.2f}x fp32) GFLOP/s (int8: fp32-equivalent)"]
