"""Which nodes cost the most accuracy in int8, measured: each quantizable node is quantized alone and the cosine of
the sentence embeddings against fp32 is taken on calibration texts. The worst few are the ones to keep in fp32.

A dynamic recipe quantizes each node on its own (the activations' scales are taken at run time), so the graph with
one node quantized is the fp32 graph with that node's part of the whole int8 graph put in its place: the whole graph
is quantized once and each probe is cut from it, instead of running the quantizer over the whole model once per node
(all-mpnet-base-v2: 72 nodes; 6.7 s a probe before, 3.8 s now, most of it the run over the calibration texts).
tests/test_int8_probes.py checks that both give the same outputs bit for bit.

Export's search was still most of an export's time (all-mpnet-base-v2: 823 of 1,820 s on 2 busy shared cores,
72 probes and 6 trials, to end in the fallback recipe; 128 s after these changes, the same 6 nodes found), so the
probes are cheaper: the fp32 weights are written once as external data that every probe's graph names (a probe
writes its graph and its node's int8 weights, not the model), the probes rank the nodes on a quarter of the
calibration rows (PROBE_ROWS_EVERY; the chosen graph is still measured on all of them), and the most nodes allowed
are tried first, so that a model the recipe cannot reach fails over to the fallback after one trial, not `most`.
"""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx

from attnserve.engine.machine import this_machine
from attnserve.engine.session import CHECK_SPIN, CPU, open_session

from . import external_data
from .int8_recipes import ERF_GELU_OPS, Int8Recipe, build, quantizable_nodes

OUTPUT = "sentence_embedding"
# The probes rank the nodes on every 4th row of the calibration feeds (16 of 64 texts): the ranking is all they
# give, and the chosen graph is measured on every row.
PROBE_ROWS_EVERY = 4
# Probes run at once, one onnxruntime thread each, on as many cores, this many at most: each session holds the
# fp32 weights, and issue 20 bounds export's memory at 3x them.
PROBE_THREADS = 2


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(N, D), (N, D) -> (N,), in float64: a drop of 1e-7 is below float32's resolution near 1."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-12)


def sentence_embeddings(path: Path, feeds: list[dict[str, np.ndarray]], threads: int = 0) -> np.ndarray:
    """The graph's sentence embeddings for every row of every feed, in feed order: (rows, D). threads: onnxruntime's
    intra-op threads (0: one per core)."""
    session = open_session(path, CPU, threads, spin=CHECK_SPIN)
    # Graphs of models with token types take token_type_ids: zeros, as the engine feeds single texts.
    types = "token_type_ids" in {i.name for i in session.get_inputs()}
    return np.concatenate([session.run([OUTPUT], {**feed, "token_type_ids": np.zeros_like(feed["input_ids"])}
                                       if types else feed)[0] for feed in feeds])


def one_node_quantized(fp32: onnx.ModelProto, quantized: onnx.ModelProto, node: str) -> onnx.ModelProto:
    """fp32 with `node` replaced by the nodes and initializers that compute its outputs in `quantized` (the same graph
    with every node quantized by a dynamic recipe): the graph quantize_dynamic gives with only that node quantized.
    Walks back from the node's outputs in `quantized` to tensors fp32 computes by itself."""
    target = next(n for n in fp32.graph.node if n.name == node)
    available = ({i.name for i in fp32.graph.input} | {t.name for t in fp32.graph.initializer}
                 | {o for n in fp32.graph.node if n is not target for o in n.output})
    producer = {o: n for n in quantized.graph.node for o in n.output}
    weights = {t.name: t for t in quantized.graph.initializer}
    nodes: dict[str, onnx.NodeProto] = {}
    initializers: dict[str, onnx.TensorProto] = {}
    pending = list(target.output)
    while pending:
        tensor = pending.pop()
        if tensor in available or tensor in initializers or not tensor:
            continue
        if tensor in weights:
            initializers[tensor] = weights[tensor]
            continue
        part = producer[tensor]
        if part.name not in nodes:
            nodes[part.name] = part
            pending.extend(part.input)
    probe = onnx.ModelProto()
    probe.CopyFrom(fp32)
    at = [n.name for n in probe.graph.node].index(node)
    del probe.graph.node[at]
    order = [n for n in quantized.graph.node if n.name in nodes]  # quantized's order is topological
    for offset, part in enumerate(order):
        probe.graph.node.insert(at + offset, part)
    probe.graph.initializer.extend(initializers.values())
    used = {i for n in probe.graph.node for i in n.input}
    kept = [t for t in probe.graph.initializer if t.name in used]  # the node's fp32 weight is gone
    del probe.graph.initializer[:]
    probe.graph.initializer.extend(kept)
    for opset in quantized.opset_import:  # the quantizer's ops (com.microsoft)
        if opset.domain not in {o.domain for o in probe.opset_import}:
            probe.opset_import.append(opset)
    # The tensor types the quantizer records: onnxruntime's graph optimizations at load read them, and without
    # them the probe's outputs differ from the quantizer's graph in the last bits.
    tensors = {o for n in probe.graph.node for o in n.output}
    del probe.graph.value_info[:]
    probe.graph.value_info.extend(v for v in quantized.graph.value_info if v.name in tensors)
    return probe


def _with_recipe_gelu(recipe: Int8Recipe, model: onnx.ModelProto) -> onnx.ModelProto:
    """The fp32 graph as the recipe leaves its unquantized nodes: erf GELUs as FastGelu where it asks (build())."""
    if recipe.fast_gelu:
        for node in model.graph.node:
            if node.op_type in ERF_GELU_OPS and node.domain == "com.microsoft":
                node.op_type = "FastGelu"
    return model


def probe_rows(feeds: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """Every PROBE_ROWS_EVERY-th row of each feed (the feeds are sorted by length: the rows keep its spread)."""
    return [{name: x[::PROBE_ROWS_EVERY] for name, x in feed.items()} for feed in feeds]


class _Probes:
    """The graphs a dynamic recipe's probes are cut from: the whole graph quantized once, and the fp32 graph with
    its weights in a data file beside the probes (module docstring). drop(nodes): 1 - mean cosine against fp32
    with those nodes alone quantized. Probes run PROBE_THREADS at a time, each session on one thread: a probe is
    a session's start and a run over a few short rows, which one thread each does faster than two threads one
    after the other (all-mpnet-base-v2's 72 probes on 2 cores: 67.8 s one at a time, 47.5 s two at a time)."""

    def __init__(self, recipe: Int8Recipe, src: Path, feeds: list[dict[str, np.ndarray]], tmp: Path):
        self.feeds, self.tmp = feeds, tmp
        self.reference = sentence_embeddings(src, feeds, threads=1)  # as the probes run
        build(recipe, src, tmp / "whole.onnx")  # every probed node quantized, once
        self.quantized = onnx.load(str(tmp / "whole.onnx"))
        # Its weights streamed from src's data files (onnx's own loader would hold them all, and refuses a data
        # file with more than one link).
        external_data.save_streamed(_with_recipe_gelu(recipe, onnx.load(str(src), load_external_data=False)),
                                    tmp / "fp32.onnx", src.parent)
        self.fp32 = onnx.load(str(tmp / "fp32.onnx"), load_external_data=False)

    def drop(self, nodes: list[str]) -> float:
        probe = self.fp32
        for node in nodes:  # each cut walks back to what the probe computes already (a shared activation quantizer)
            probe = one_node_quantized(probe, self.quantized, node)
        with tempfile.NamedTemporaryFile(dir=self.tmp, suffix=".onnx") as path:  # beside fp32.onnx.data
            onnx.save(probe, path.name)
            got = sentence_embeddings(Path(path.name), self.feeds, threads=1)
        return float(1.0 - cosine(got, self.reference).mean())

    def drops(self, nodes: list[str]) -> list[float]:
        """drop([node]) for each node, in order."""
        # onnxruntime lets go of the GIL as it runs
        with ThreadPoolExecutor(max_workers=min(PROBE_THREADS, this_machine().usable_cpus)) as pool:
            return list(pool.map(lambda node: self.drop([node]), nodes))


def node_drops(recipe: Int8Recipe, src: Path, feeds: list[dict[str, np.ndarray]],
               calibration: list[dict[str, np.ndarray]] | None = None) -> dict[str, float]:
    """node -> 1 - mean cosine vs fp32 when only that node is quantized by the recipe, worst first (the nodes the
    recipe keeps in fp32 are not probed)."""
    model = onnx.load(str(src), load_external_data=False)
    nodes = [n for n in quantizable_nodes(model) if n not in recipe.keep_fp32]
    drops = {}
    with tempfile.TemporaryDirectory() as tmp:
        if not recipe.static:
            probes = _Probes(recipe, src, feeds, Path(tmp))
            drops = dict(zip(nodes, probes.drops(nodes), strict=True))
        else:  # static ranges and Q/DQ placement are the quantizer's to make per probe
            reference = sentence_embeddings(src, feeds)
            for node in nodes:
                build(recipe, src, Path(tmp) / "probe.onnx", calibration, only=[node])
                drops[node] = float(1.0 - cosine(sentence_embeddings(Path(tmp) / "probe.onnx", feeds),
                                                 reference).mean())
    return dict(sorted(drops.items(), key=lambda kv: -kv[1]))


def fewest_fp32_nodes(recipe: Int8Recipe, src: Path, feeds: list[dict[str, np.ndarray]], mean_bar: float,
                      p1_bar: float, most: int) -> tuple[list[str], dict[str, float]]:
    """The shortest worst-first prefix of node_drops() whose fp32 keeps the whole int8 graph at cosine mean >=
    mean_bar and p1 >= p1_bar against fp32 on feeds, and those measures. The whole graph in int8 is tried first;
    the nodes are probed (on probe_rows(feeds)) only if it misses. Raises ValueError when `most` nodes do not
    suffice, which is tried right after the probes (module docstring); then one node, two, ..."""
    reference = sentence_embeddings(src, feeds)
    with tempfile.TemporaryDirectory() as tmp:
        trial = Path(tmp) / "trial.onnx"

        def measured(kept: list[str]) -> dict[str, float]:
            build(recipe.excluding(kept, f"{recipe.name}, {len(kept)} kept"), src, trial)
            cos = cosine(sentence_embeddings(trial, feeds), reference)
            return {"mean": float(cos.mean()), "p1": float(np.percentile(cos, 1))}

        def holds(measures: dict[str, float]) -> bool:
            return measures["mean"] >= mean_bar and measures["p1"] >= p1_bar

        measures = measured([])
        if holds(measures):
            return [], measures
        worst = list(node_drops(recipe, src, probe_rows(feeds)))
        most = min(most, len(worst))
        with_most = measured(worst[:most])
        if holds(with_most):
            for k in range(1, most):
                measures = measured(worst[:k])
                if holds(measures):
                    return worst[:k], measures
            return worst[:most], with_most
        measures = with_most
    raise ValueError(f"int8 ({recipe.name}) misses cosine mean {mean_bar} / p1 {p1_bar} against fp32 even with "
                     f"its {most} most sensitive nodes in fp32 (mean {measures['mean']:.4f}, p1 {measures['p1']:.4f})")
