"""Build an artifact directory: graphs, tokenizer and a manifest that serving checks before use.

The directory is assembled beside its destination and renamed into place only
after every variant has passed verification, so a failed or interrupted
export never leaves a half-built directory under the final name.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from attnserve import __version__
from attnserve.engine.machine import this_machine
from attnserve.engine.manifest import MANIFEST, GraphVariant, Manifest, sha256_of
from attnserve.engine.openvino_session import openvino_version
from attnserve.engine.quantize import CALIBRATION_FILE
from attnserve.engine.session import ONNXRUNTIME, OPENVINO
from attnserve.engine.tokenizer import TextTokenizer
from attnserve.errors import ArtifactError, ExportVerificationError
from attnserve.model.checkpoint import Checkpoint, load_encoder
from attnserve.model.colbert import serving_settings
from attnserve.model.encoder import SentenceEncoder
from attnserve.model.sentence_head import load_head
from attnserve.progress import Progress

from . import external_data
from .attention_last import LAST_MAPS, ROLLOUT, build_attention_last
from .memory import release_freed_memory
from .optimize import (
    convert_fp16,
    describe_fusions,
    fuse_attention,
    fused_attention_nodes,
    quantize_int8,
    quantize_int8_measured,
)
from .reranker import reranker_variants
from .task_graphs import build_task_artifacts
from .tokenizer_parity import check_tokenizer
from .torch_to_onnx import MAPS, export_graph, without_output
from .verify import TOLERANCES, GraphCheck, Reference, calibration_feeds, check, measure_all

# name -> (file, precision, fused, outputs)
VARIANTS = {
    "embeddings": ("embeddings.onnx", "fp32", False, ("last_hidden_state", "sentence_embedding")),
    "embeddings_fused": ("embeddings_fused.onnx", "fp32", True, ("last_hidden_state", "sentence_embedding")),
    "embeddings_int8": ("embeddings_int8.onnx", "int8", True, ("last_hidden_state", "sentence_embedding")),
    "embeddings_int8_skip_layer_norm": ("embeddings_int8.onnx", "int8", True,
                                        ("last_hidden_state", "sentence_embedding")),
    "embeddings_fp16": ("embeddings_fp16.onnx", "fp16", True, ("last_hidden_state", "sentence_embedding")),
    "attention": ("attention.onnx", "fp32", False, ("last_hidden_state", "sentence_embedding", "attentions",
                                                    "value_norms")),
    # The last layer's maps and rollout alone, at about the embeddings graph's cost (attention_last.py).
    "attention_last": ("attention_last.onnx", "fp32", False, ("last_hidden_state", "sentence_embedding", LAST_MAPS,
                                                              ROLLOUT)),
}
# Variants that differ from another only in the onnxruntime optimizers their sessions must not apply. At load,
# onnxruntime fuses the int8 graph's residual Add + LayerNormalization into SkipLayerNormalization, whose CPU kernel
# is slower than the two ops it replaces: on 2 AVX-512 VNNI cores, 1,000 mixed-length texts, it took 19% of the
# int8 graph's kernel time (796 ms against 311 ms for Add + LayerNormalization in the fp32 graph), and the graph ran
# 1.23x faster without it; with the shipped int8 recipe, 2.50x fp32 without it and 1.95x with it
# (bench/int8_candidates.md). The default int8 variant runs without it; the fused one stays a candidate that the
# engine times on the CPU that runs (engine/calibration.py). The fp32 graphs' sessions make no such fusion.
DISABLED_OPTIMIZERS = {"embeddings_int8": ("SkipLayerNormFusion",)}
# Variants OpenVINO runs (engine/openvino_session.py), written where the export's environment has it
# (attnserve[openvino]): the plain embeddings graph, as it is, compiled by OpenVINO in fp32 and, on a CPU with
# native bf16, in bf16. Each is verified here like the others and is one more candidate the engine times
# (engine/calibration.py); bf16 is chosen by default where it is the fastest.
OPENVINO_VARIANTS = {
    "embeddings_openvino": ("embeddings.onnx", "fp32", False, ("last_hidden_state", "sentence_embedding")),
    "embeddings_bf16": ("embeddings.onnx", "bf16", False, ("last_hidden_state", "sentence_embedding")),
}


def openvino_variants(log: Callable[[str], None]) -> dict[str, tuple[str, str, bool, tuple[str, ...]]]:
    """The OPENVINO_VARIANTS this export can verify: none without OpenVINO, no bf16 on a CPU without native bf16
    (each said in a line)."""
    if openvino_version() is None:
        log("no OpenVINO graphs (bf16): OpenVINO is not installed (pip install 'attnserve[openvino]')")
        return {}
    if not this_machine().native_bf16:
        log("no bf16 graph: this CPU has no native bf16 (AVX512-BF16 or AMX) to verify it on; OpenVINO fp32 only")
        return {"embeddings_openvino": OPENVINO_VARIANTS["embeddings_openvino"]}
    return dict(OPENVINO_VARIANTS)


def _tool_versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import tokenizers
    import torch

    versions = {"attnserve": __version__, "torch": torch.__version__, "onnx": onnx.__version__,
                "onnxruntime": onnxruntime.__version__, "tokenizers": tokenizers.__version__,
                "python": platform.python_version()}
    if openvino_version():  # the OpenVINO that verified the OpenVINO variants
        versions["openvino"] = openvino_version()
    return versions


def _claim_destination(out: Path) -> None:
    """Refuse to replace anything that is not an artifact directory (or empty)."""
    if out.exists() and not (out.is_dir() and ((out / MANIFEST).exists() or not any(out.iterdir()))):
        raise ArtifactError(f"{out} exists and is not an artifact directory; refusing to overwrite it")


def _on_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class _ExportProgress(Progress):
    """Progress whose every step starts with the memory the last one freed handed back (export/memory.py)."""

    def step(self, what: str) -> None:
        release_freed_memory()
        super().step(what)


def build_artifacts(ckpt: Checkpoint, out: Path, log: Callable[[str], None] = _on_stderr) -> Manifest:
    """log: each step's line as it starts, its results, and a heartbeat while one runs long (attnserve/progress.py)."""
    with _ExportProgress(log) as progress:
        return _build(ckpt, Path(out), progress)


def _build(ckpt: Checkpoint, out: Path, progress: Progress) -> Manifest:
    log = progress.log
    _claim_destination(out)
    start = time.perf_counter()
    task = getattr(ckpt.config, "task", None)  # jina v3's adapter merged into this directory's graphs
    named = f"{ckpt.name} with task {task}" if task else ckpt.name
    log(f"exporting {named} ({ckpt.config.num_layers} layers, hidden {ckpt.config.hidden_size}; "
        f"{' -> '.join(ckpt.modules)}) to ONNX")
    progress.step("checking the tokenizer")
    check_tokenizer(ckpt)  # before any weight is loaded or graph traced: a refusal is quick
    progress.step("loading the weights")
    # In a list so that the embedders' path can take it: the encoder is freed after tracing there, while the
    # optimizer's child processes run, and loaded again for verification (_embedder_variants).
    loaded = [load_encoder(ckpt)]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        work = out.parent / f".{out.name}.building-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
    except OSError as e:
        raise ArtifactError(f"cannot write artifacts under {out.parent}: {e.strerror}") from None
    try:
        shutil.copyfile(ckpt.tokenizer_file, work / "tokenizer.json")
        tokenizer = TextTokenizer(work / "tokenizer.json", ckpt.max_seq_length, ckpt.config.vocab_size)
        caps = {"verified_max_length": ckpt.max_seq_length, "attention_max_length": ckpt.max_seq_length}
        if ckpt.kind == "reranker":
            progress.step("reranker graphs: tracing, optimizing, verifying each")
            variants = reranker_variants(ckpt, loaded.pop(), tokenizer, work, log, caps)
        else:
            variants = _embedder_variants(ckpt, loaded.pop(), tokenizer, work, progress, caps)
        quantization = None
        if (work / CALIBRATION_FILE).is_file():
            quantization = {"file": CALIBRATION_FILE, "sha256": sha256_of(work / CALIBRATION_FILE),
                            "texts": int(np.load(work / CALIBRATION_FILE, mmap_mode="r").shape[0])}
        # jina v3: each task's adapter merged, a whole artifact directory of its own under tasks/<task>/.
        tasks = build_task_artifacts(ckpt, work, lambda task_ckpt, task_out: _build(task_ckpt, task_out, progress))
        manifest = Manifest(
            directory=out, model=ckpt.name, hidden_size=ckpt.config.hidden_size, num_layers=ckpt.config.num_layers,
            num_heads=ckpt.config.num_heads, intermediate_size=ckpt.config.intermediate_size,
            vocab_size=ckpt.config.vocab_size, max_seq_length=ckpt.max_seq_length, pooling=ckpt.pooling,
            normalize=ckpt.normalize, tokenizer="tokenizer.json", tokenizer_sha256=sha256_of(work / "tokenizer.json"),
            variants=variants, tools=_tool_versions(), embedding_size=ckpt.embedding_size,
            modules=tuple(ckpt.modules), prompts=dict(ckpt.pipeline.prompts),
            default_prompt_name=ckpt.pipeline.default_prompt_name, kind=ckpt.kind,
            num_labels=ckpt.num_labels, score_activation=ckpt.score_activation, family=ckpt.config.family,
            tasks=tasks, task=task,
            pair_template=ckpt.pair_template.to_json() if ckpt.pair_template is not None else None,
            quantization=quantization, labels=ckpt.labels, problem_type=ckpt.problem_type,
            multi_vector=None if ckpt.pipeline.multi_vector is None else serving_settings(
                ckpt.pipeline.multi_vector, ckpt.directory, Tokenizer.from_file(str(work / "tokenizer.json"))),
            **caps,
        )
        (work / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=2) + "\n", encoding="utf-8")
        _claim_destination(out)
        if out.exists():
            shutil.rmtree(out)
        os.replace(work, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"wrote {out} in {time.perf_counter() - start:.1f}s")
    return manifest


def _embedder_variants(ckpt: Checkpoint, encoder, tokenizer: TextTokenizer, work: Path, progress: Progress,
                       caps: dict[str, int]) -> dict[str, GraphVariant]:
    """The graphs, verified; caps gets the lengths verification and the attention graph stop at.

    encoder: the only reference to it (it is freed after tracing and loaded again for verification)."""
    log = progress.log
    head = load_head(ckpt.directory, ckpt.pipeline)
    weights = sum(t.numel() * 4 for m in (encoder, head) for t in (*m.parameters(), *m.buffers()))
    external = external_data.wants_external_data(weights)
    if external:
        log(f"{weights / 2**30:.2f} GiB of fp32 weights: every graph keeps its weights in a data file beside it "
            f"(ONNX external data, above {external_data.threshold() / 2**30:.2f} GiB)")
    # One trace: the embeddings graph is the attention graph without its attention maps (the same nodes and
    # weights as a trace of its own gives, which cost as long again: all-mpnet-base-v2, 7 s of 12), and the
    # last-layer graph is it with the last layer's maps and rollout in their place.
    progress.step("tracing the graph (torch.onnx.export); the embeddings graph is it without the attention maps")
    export_graph(SentenceEncoder(encoder, head, output_attentions=True), work / VARIANTS["attention"][0], external)
    without_output(work / VARIANTS["attention"][0], work / VARIANTS["embeddings"][0], MAPS)
    build_attention_last(work / VARIANTS["attention"][0], work / VARIANTS["attention_last"][0])
    # Until verification the export's process holds no weights: the optimizer, int8 and fp16 steps run in child
    # processes (export/isolated.py), whose peaks add to this process's.
    del encoder
    progress.step("optimizing: fusing attention (onnxruntime's transformer optimizer)")
    counts = fuse_attention(work / VARIANTS["embeddings"][0], work / VARIANTS["embeddings_fused"][0], ckpt.config)
    log(f"fused attention: {fused_attention_nodes(counts)} Attention nodes for {ckpt.config.num_layers} layers")
    _int8(work / VARIANTS["embeddings_fused"][0], work / VARIANTS["embeddings_int8"][0], tokenizer, ckpt, progress)
    progress.step("fp16: converting the embeddings graph to half precision (with its fusions)")
    fp16_counts = convert_fp16(work / VARIANTS["embeddings"][0], work / VARIANTS["embeddings_fp16"][0], ckpt.config)
    # Whether the fp32 graphs (False) and the fp16 graph (True) have every layer's attention fused. Where the
    # optimizer cannot fuse it (ModernBERT's rotary attention, MPNet's position bias), the "fused" variants hold
    # its other fusions; the manifest then says fused: false for them, and the log what they hold.
    fully_fused = {False: fused_attention_nodes(counts) == ckpt.config.num_layers,
                   True: fused_attention_nodes(fp16_counts) == ckpt.config.num_layers}
    if not fully_fused[False]:
        log(f"attention left unfused; the fused graph holds {describe_fusions(counts)}, "
            f"the fp16 graph {describe_fusions(fp16_counts)}")
    progress.step("verification: PyTorch's outputs for the check texts (the reference)")
    reference = Reference(load_encoder(ckpt), head, ckpt.embedding_size, tokenizer)
    # PyTorch's sentence embeddings of the verification texts: the int8 / uint8 ranges of quantized embeddings.
    np.save(work / CALIBRATION_FILE, reference.text_sentences)
    caps.update(reference.caps.manifest_fields())
    note = reference.caps.note(ckpt.max_seq_length)
    if note:
        log(note)
    # PyTorch runs over the check inputs once, then each graph's session alone (verify.measure_all).
    openvino = openvino_variants(log)
    built = VARIANTS | openvino
    backend = {name: OPENVINO if name in openvino else ONNXRUNTIME for name in built}
    checks = {name: GraphCheck(work / file, precision, DISABLED_OPTIMIZERS.get(name, ()), backend[name])
              for name, (file, precision, _, _) in built.items()}
    parities = measure_all(checks, reference, on_graph=lambda name: progress.step(f"verifying {name} against PyTorch"),
                           release_encoder=True)
    for name, graph in checks.items():
        try:
            check(graph.path, graph.precision, parities[name])
        except ExportVerificationError as e:
            # The graphs onnxruntime runs must hold: the export fails. OpenVINO's variants are extra candidates read
            # from the plain graph: one off its bar (bf16 on a model whose activations bf16 rounds too coarsely) is
            # left out in a line, and the export goes on without it.
            if name not in openvino:
                raise
            log(f"{name} left out: {e}")
            del built[name]
    variants = {}
    hashes: dict[str, str] = {}  # each file's sha256, once (a data file is shared, and can be gigabytes)

    def sha256(file: str) -> str:
        if file not in hashes:
            hashes[file] = sha256_of(work / file)
        return hashes[file]

    for name, (file, precision, fused, outputs) in built.items():
        parity = parities[name]
        disabled = DISABLED_OPTIMIZERS.get(name, ())
        log(f"verified {file:24s} {TOLERANCES[precision].describe(parity[TOLERANCES[precision].metric])}"
            + (f" (session without {', '.join(disabled)})" if disabled else f" ({name})" if file != f"{name}.onnx"
               else ""))
        variants[name] = GraphVariant(name, file, sha256(file), precision,
                                      fused and fully_fused[precision == "fp16"], outputs, parity,
                                      DISABLED_OPTIMIZERS.get(name, ()),
                                      {data: sha256(data) for data in external_data.external_files(work / file)},
                                      backend[name])
    return variants


def _int8(src: Path, dst: Path, tokenizer: TextTokenizer, ckpt: Checkpoint, progress: Progress) -> None:
    """The measured int8 recipe; quantize_int8's by-name recipe where it cannot reach its accuracy bar."""
    log = progress.log
    try:
        _, kept, measures, split = quantize_int8_measured(src, dst, calibration_feeds(tokenizer), progress.step)
    except ValueError as e:
        log(f"{e}; int8 falls back to dynamic per-channel with the family's projections kept in fp32")
        progress.step("int8: quantizing by the family's recipe")
        quantize_int8(src, dst, ckpt.config)
        return
    units = sum(len(u) for u in split.values())
    log(f"int8: {units} outlier units of {len(split)} feed-forwards computed apart in fp32; {len(kept)} most "
        f"sensitive nodes kept in fp32 ({', '.join(kept) or 'none'}); calibration texts cosine mean "
        f"{measures['mean']:.4f}, p1 {measures['p1']:.4f} against fp32")
