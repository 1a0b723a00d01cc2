"""Build an artifact directory, or add variants to one: graphs, tokenizer, the PyTorch reference and a manifest that
serving checks before use.

A new directory (build_artifacts) is assembled beside its destination and renamed into place only once its graphs
have passed verification, so a failed or interrupted export never leaves a half-built directory under the final
name. It holds what was asked of it: every variant (`attnserve export --all`), or the graph a run needs first
(engine/variants.py). Variants added later (add_variants) are built inside the directory, under its lock: each
step writes files no manifest names, verifies them, and only then lists them in a new manifest, which replaces the
old whole (os.replace), so that no reader ever sees a variant that is not complete and verified.

Every graph reads its weights from data files stored once (export/external_data.py): the trace writes
weights.fp32.data (or weights.fp16.data), and a graph built from another keeps only what it changed in a file of
its own. PyTorch's outputs on the check inputs are kept beside the graphs (reference.npz), so that the graphs built
later from the first (fused, fp16, OpenVINO's, a reranker's int8) are verified against them without loading the
model again; the attention graphs and the embedders' int8 need it in PyTorch (their maps; 512 texts' embeddings).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from tokenizers import Tokenizer

from attnserve import __version__
from attnserve.cache import build_lock, checkpoint_fingerprint
from attnserve.engine.machine import this_machine
from attnserve.engine.manifest import MANIFEST, GraphVariant, Manifest, load_manifest, sha256_of, write_manifest
from attnserve.engine.openvino_session import openvino_version
from attnserve.engine.quantize import CALIBRATION_FILE
from attnserve.engine.session import CPU
from attnserve.engine.speed import learn, slowdown
from attnserve.engine.tokenizer import TextTokenizer
from attnserve.engine.variants import (
    OPENVINO,
    PLAIN,
    STEP_TITLES,
    STEPS,
    estimated_seconds,
    fp32_weight_bytes,
    variants_of,
)
from attnserve.errors import ArtifactError, ExportVerificationError
from attnserve.model.attention_reach import reach_of
from attnserve.model.bge_m3 import has_heads, save_heads
from attnserve.model.checkpoint import Checkpoint, load_encoder, read_checkpoint
from attnserve.model.clip import ImageTextConfig
from attnserve.model.colbert import serving_settings
from attnserve.model.encoder import SentenceEncoder
from attnserve.model.sentence_head import load_head
from attnserve.model.static_embedding import STATIC_REFUSED, StaticConfig, serving_tokenizer
from attnserve.progress import Progress

from . import reranker as rerank
from .attention_last import build_attention_last
from .external_data import SharedWeights, external_files, share, weights_file
from .half_precision import HALF, Float32Outputs, computed_in_fp32
from .image_tower import image_artifacts
from .memory import collections_of_its_own, release_freed_memory, small_heaps
from .optimize import (
    convert_fp16,
    describe_fusions,
    fuse_attention,
    fuse_half,
    fused_attention_nodes,
    quantize_int8,
    quantize_int8_measured,
)
from .reranker_int8 import quantize_reranker_int8
from .task_graphs import build_task_artifacts
from .tokenizer_parity import check_tokenizer
from .torch_to_onnx import export_graph
from .verify import REFERENCE, TOLERANCES, VERIFIED_TEXTS, GraphCheck, Reference, calibration_feeds, check, measure_all

REFERENCE_PAIRS = "reference_pairs.npz"  # a reranker's (export/reranker.py PairReference)
REFERENCE_HEAP_THRESHOLD = 4 * 2**20  # export/memory.py small_heaps, while PyTorch computes the reference
# And while torch.onnx.export traces: its passes copy weights (a transposed one, for shape inference) and free
# them, and in glibc's heaps what they freed stayed, 0.2 GB of all-mpnet-base-v2's trace at the export's peak
# (0.07 at 4 MiB, none at 2 MiB, for 2-3 s of the trace's page faults).
TRACE_HEAP_THRESHOLD = 2 * 2**20


def _on_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _tool_versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import tokenizers

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


class _ExportProgress(Progress):
    """Progress whose every step starts with the memory the last one freed handed back, the collection passing over
    the objects from before the export (export/memory.py)."""

    def __enter__(self) -> Progress:
        self._collections = collections_of_its_own()
        self._collections.__enter__()
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        self._collections.__exit__(*exc)

    def step(self, what: str) -> None:
        release_freed_memory()
        super().step(what)


def all_variants(ckpt: Checkpoint) -> list[str]:
    """Every variant `attnserve export --all` builds for the checkpoint: OpenVINO's where OpenVINO is installed,
    bf16 where this CPU computes it natively too."""
    names = list(variants_of(ckpt.kind))
    if ckpt.kind == "reranker":
        return names
    if openvino_version() is None:
        names = [n for n in names if variants_of(ckpt.kind)[n].backend != OPENVINO]
    elif not this_machine().native_bf16:
        names.remove("embeddings_bf16")
    return names


def build_artifacts(ckpt: Checkpoint, out: Path, log: Callable[[str], None] = _on_stderr,
                    variants: Iterable[str] | None = None, trace: str = "fp32", provider: str = CPU) -> Manifest:
    """A new artifact directory at out (replacing an artifact directory there): the checkpoint traced once, in
    `trace` ("fp32", or "fp16": straight into half precision, export/half_precision.py), and the `variants` named
    built and verified (None: all_variants, as `attnserve export --all`). provider: what runs verification.
    log: each step's line as it starts, its results, and a heartbeat while one runs long (attnserve/progress.py)."""
    out = Path(out).absolute()  # the optimizer's step changes the working directory (optimize.py)
    names = all_variants(ckpt) if variants is None else list(variants)
    unknown = [n for n in names if n != "quantization" and n not in variants_of(ckpt.kind)]
    if unknown:  # else silently not built: a reranker's directory asked for "embeddings" held no graph at all
        raise ArtifactError(f"no variant {unknown[0]!r} for a model of kind {ckpt.kind}; one of "
                            f"{', '.join(variants_of(ckpt.kind))}")
    with _ExportProgress(log) as progress:
        return _build_new(ckpt, out, names, trace, provider, progress)


def _build_new(ckpt: Checkpoint, out: Path, names: list[str], trace: str, provider: str,
               progress: Progress) -> Manifest:
    _claim_destination(out)
    start = time.perf_counter()
    task = getattr(ckpt.config, "task", None)  # jina v3's adapter merged into this directory's graphs
    static = ckpt.config if isinstance(ckpt.config, StaticConfig) else None
    named = f"{ckpt.name} with task {task}" if task else ckpt.name
    progress.log(f"exporting {named} ({ckpt.config.num_layers} layers, hidden {ckpt.config.hidden_size}; "
                 f"{' -> '.join(ckpt.modules)}) to ONNX: {', '.join(names)}")
    progress.step("checking the tokenizer")
    if static is None:  # a static model's reference tokenizes with `tokenizers` itself, as serving does
        check_tokenizer(ckpt)  # before any weight is loaded or graph traced: a refusal is quick
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        work = out.parent / f".{out.name}.building-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
    except OSError as e:
        raise ArtifactError(f"cannot write artifacts under {out.parent}: {e.strerror}") from None
    try:
        if static is None:
            shutil.copyfile(ckpt.tokenizer_file, work / "tokenizer.json")
        else:  # without special tokens, as both static libraries tokenize
            serving_tokenizer(ckpt.tokenizer_file, work / "tokenizer.json")
        build = _Build(work, ckpt, progress, provider, None, trace)
        build.run(names)
        # jina v3: each task's adapter merged, a whole artifact directory of its own under tasks/<task>/.
        tasks = build_task_artifacts(ckpt, work, lambda task_ckpt, task_out: _build_new(
            task_ckpt, task_out, names, trace, provider, progress))
        manifest = build.manifest(tasks)
        write_manifest(manifest)
        _claim_destination(out)
        if out.exists():
            shutil.rmtree(out)
        os.replace(work, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    progress.log(f"wrote {out} in {time.perf_counter() - start:.1f}s")
    return dataclasses.replace(manifest, directory=out)


def add_variants(directory: Path, names: Iterable[str], log: Callable[[str], None] = _on_stderr,
                 provider: str = CPU) -> Manifest:
    """The variants of `names` that the directory's manifest lacks (and "quantization", the quantized embeddings'
    calibration texts), built from what it holds, verified, and listed in its manifest as each step passes. Under
    the directory's lock: a variant another process built meanwhile is read from its manifest, not built again.
    The steps that need PyTorch load the checkpoint the manifest's source names (ArtifactError where it is gone
    or changed). Returns the manifest as it then is."""
    directory = Path(directory).absolute()  # the optimizer's step changes the working directory (optimize.py)
    names = list(names)
    with build_lock(directory):
        manifest = load_manifest(directory, check_hashes=False)
        missing = [n for n in names if n not in manifest.variants and not (n == "quantization"
                                                                           and manifest.quantization is not None)]
        if not missing:
            return manifest
        unknown = [n for n in missing if n != "quantization" and n not in variants_of(manifest.kind)]
        if unknown:
            raise ArtifactError(f"{directory}: no variant {unknown[0]!r} for a model of kind {manifest.kind}; one of "
                                f"{', '.join(variants_of(manifest.kind))}")
        if manifest.source is None:
            raise ArtifactError(f"{directory} lacks {', '.join(missing)} and was exported before variants were built "
                                "as needed: export it again (attnserve export --all)")
        load_manifest(directory)  # what the build reads is what export wrote: every file's sha256
        with _ExportProgress(log) as progress:
            progress.log(f"building {', '.join(missing)} for {manifest.model} in {directory} (once: the artifact "
                         "directory keeps them)")
            build = _Build(directory, None, progress, provider, manifest, None)
            build.run(missing)
            return load_manifest(directory, check_hashes=False)


def same_source(directory: Path, ckpt: Checkpoint) -> bool:
    """Whether directory holds artifacts this version built from this very checkpoint (its files unchanged), so
    that variants are added to it rather than all rebuilt."""
    if not (directory / MANIFEST).is_file():
        return False
    try:
        manifest = load_manifest(directory, check_hashes=False)
    except ArtifactError:
        return False
    source = manifest.source or {}
    return (source.get("checkpoint") == str(ckpt.directory.resolve()) and manifest.model == ckpt.name
            and source.get("fingerprint") == checkpoint_fingerprint(ckpt.directory)
            and manifest.tools.get("attnserve") == __version__)


def source_checkpoint(manifest: Manifest) -> Checkpoint:
    """The checkpoint a directory was exported from (its manifest's source), if it is still there unchanged."""
    source = manifest.source or {}
    path = Path(str(source.get("checkpoint", "")))
    if not path.is_dir():
        raise ArtifactError(f"{manifest.directory}: building another graph needs the checkpoint it was exported "
                            f"from, {path}, which is gone: export again from the checkpoint (attnserve export --all)")
    if checkpoint_fingerprint(path) != source.get("fingerprint"):
        raise ArtifactError(f"{manifest.directory}: the checkpoint it was exported from, {path}, has changed since: "
                            "export again from it")
    ckpt = read_checkpoint(path, manifest.model)
    if manifest.task is not None:
        from attnserve.model.jina_v3 import with_task

        ckpt = dataclasses.replace(ckpt, config=with_task(ckpt.config, manifest.task))  # type: ignore[arg-type]
    return ckpt


class _Build:
    """One build into one directory: the first (a new directory; `trace`: the dtype its plain graph is traced in)
    or a later one (`manifest`: what the directory holds). Steps run in STEPS' order; each builds its files,
    verifies the variants asked of it and lists them (a later build writes the manifest after each step)."""

    def __init__(self, work: Path, ckpt: Checkpoint | None, progress: Progress, provider: str,
                 manifest: Manifest | None, trace: str | None):
        self.work, self.progress, self.log, self.provider = work, progress, progress.log, provider
        self._ckpt, self.existing = ckpt, manifest
        self.kind = ckpt.kind if ckpt is not None else manifest.kind  # type: ignore[union-attr]
        self.table = variants_of(self.kind)
        self.variants: dict[str, GraphVariant] = dict(manifest.variants) if manifest is not None else {}
        self.quantization = manifest.quantization if manifest is not None else None
        self.refused: dict[str, str] = dict(manifest.refused) if manifest is not None else {}
        # dtype -> {"file", "sha256", "data_files"}: the plain graphs traced, which later steps build from.
        self.traces: dict[str, dict] = dict(manifest.traces) if manifest is not None else {}
        self.first_trace = trace or "fp32"
        self.shape = ckpt.config if ckpt is not None else manifest  # what the optimizer reads of the model
        length = ckpt.max_seq_length if ckpt is not None else manifest.max_seq_length  # type: ignore[union-attr]
        vocab = ckpt.config.vocab_size if ckpt is not None else manifest.vocab_size  # type: ignore[union-attr]
        pad_to, pad_id = ((ckpt.pipeline.pad_to, ckpt.pipeline.pad_id) if ckpt is not None else
                          (manifest.pad_to_length, manifest.pad_id))  # type: ignore[union-attr]
        static = (ckpt.config.serving() if ckpt is not None and isinstance(ckpt.config, StaticConfig) else
                  manifest.static if manifest is not None else None)
        if static is not None:  # no attention graph, no int8 graph: said once, in the manifest
            self.refused.update(STATIC_REFUSED)
        self.tokenizer = TextTokenizer(work / "tokenizer.json", length, vocab, pad_to=pad_to, pad_id=pad_id,
                                       static=static)
        self._encoder: Any = None
        self._encoder_dtype: torch.dtype | None = None
        # Each layer's attention reach, the encoder's declaration (model/attention_reach.py), read when it loads.
        self.reach = manifest.attention_reach if manifest is not None else None
        self._head: Any = None
        self._module: Any = None  # a reranker's module over the encoder
        self._encode_pairs: Callable | None = None
        self._reference: Any = None
        self.caps: dict[str, int] = {} if manifest is None else {
            "verified_max_length": manifest.verified_max_length, "attention_max_length": manifest.attention_max_length}
        self.fully_fused: dict[str, bool] = {}  # a fused variant -> whether every layer's attention fused
        # Where PyTorch runs the reference and the trace: the GPU of a CUDA run where torch has one (an 8B model's
        # reference takes the CPU many minutes), else the CPU.
        self.device = "cuda" if provider != CPU and torch.cuda.is_available() else "cpu"

    # -- what the steps share --------------------------------------------------------------------------------------

    @property
    def ckpt(self) -> Checkpoint:
        if self._ckpt is None:
            assert self.existing is not None
            self._ckpt = source_checkpoint(self.existing)
        return self._ckpt

    def encoder(self, dtype: torch.dtype = torch.float32):
        """The checkpoint's encoder in PyTorch (and an embedder's head), loaded once per dtype asked."""
        if self._encoder is None or self._encoder_dtype != dtype:
            self._encoder = self._module = self._head = None
            if self._reference is not None:  # it holds the model too: one copy of the weights at a time
                self._detach(self._reference)
            release_freed_memory()
            self.progress.step(f"loading the weights{' in fp16' if dtype == HALF else ''}")
            self._encoder, self._encoder_dtype = cast(torch.nn.Module, load_encoder(self.ckpt, dtype)).to(
                self.device), dtype
            self.reach = reach_of(self._encoder)
            self._head = (load_head(self.ckpt.directory, self.ckpt.pipeline).to(self.device)
                          if self.kind == "embedder" else None)
            if self._reference is not None:
                self._attach(self._reference)
        return self._encoder

    def release_model(self) -> None:
        """Drop the model (the reference keeps its outputs, not the model) and hand its memory back."""
        self._encoder = self._module = self._head = None
        if self._reference is not None:
            self._detach(self._reference)
        release_freed_memory()
        if self.device == "cuda":  # the GPU's memory, for onnxruntime's sessions to verify with
            torch.cuda.empty_cache()

    def reranker_module(self):
        if self._module is None:
            module, self._encode_pairs = rerank.load_module(self.ckpt, self.encoder(), self.tokenizer, self.log)
            self._module = module.to(self.device)
        return self._module

    def _detach(self, reference) -> None:
        if self.kind == "embedder":
            reference.encoder = reference.head = None
        else:
            reference.reranker = None

    def _attach(self, reference) -> None:
        if self.kind == "embedder":
            reference.encoder, reference.head = self._encoder, self._head
        else:
            reference.reranker = self.reranker_module()

    def reference(self, with_torch: bool = False):
        """The PyTorch reference: the stored one, or the first build's, computed now and saved. with_torch: the
        model loaded beside it, for what a stored one cannot give (the maps, more texts)."""
        stored = self.work / (REFERENCE if self.kind == "embedder" else REFERENCE_PAIRS)
        if self._reference is None:
            self._reference = self._load_reference(stored) if stored.is_file() else self._make_reference(stored)
        if with_torch and (self._reference.encoder if self.kind == "embedder" else self._reference.reranker) is None:
            self.encoder()
            self._attach(self._reference)
        return self._reference

    def _load_reference(self, path: Path):
        assert self.existing is not None and self.existing.reference is not None
        if sha256_of(path) != self.existing.reference["sha256"]:
            raise ArtifactError(f"artifact file changed since export (sha256 mismatch): {path}")
        if self.kind == "embedder":
            return Reference.load(path, self.tokenizer, self.existing.embedding_size)
        return rerank.PairReference.load(path, self.existing.score_activation or "identity")

    def _make_reference(self, path: Path) -> Any:
        if self.existing is not None:  # a reference is made once, with the directory
            raise ArtifactError(f"{self.work}: its reference ({path.name}) is missing: export it again")
        if self.kind == "embedder":
            encoder = self.encoder(self._encoder_dtype or torch.float32)
            self.progress.step("PyTorch's outputs for the check inputs (the reference every graph is held to)")
            # small_heaps: what PyTorch frees of 4 MiB or more goes back at once: glibc kept 0.2 GB of
            # all-mpnet-base-v2's activations otherwise, at the export's peak (1 MiB cost the reference 35% more
            # time, 4 MiB nothing measurable).
            # A half-precision encoder computes in fp32 here.
            with computed_in_fp32(encoder, self._head), small_heaps(REFERENCE_HEAP_THRESHOLD):
                reference = Reference(encoder, self._head, self.ckpt.embedding_size, self.tokenizer)
        else:
            module = self.reranker_module()
            self.progress.step("PyTorch's scores for the check pairs (the reference every graph is held to)")
            assert self._encode_pairs is not None, "reranker_module() reads how its pairs are tokenized"
            reference = rerank.PairReference(module, self.tokenizer, self._encode_pairs,  # type: ignore[assignment]
                                             self.ckpt.score_activation or "identity")
        reference.save(path)
        self.caps = reference.caps.manifest_fields()
        note = reference.caps.note(self.ckpt.max_seq_length)
        if note:
            self.log(note)
        return reference

    def _verify(self, names: list[str], files: dict[str, str] | None = None) -> None:
        """Verify the variants against the reference, one session at a time, and list those that pass. files: a
        variant's file where it is not the table's (bf16 on the half trace's plain graph)."""
        files = files or {}
        paths = {name: self.work / files.get(name, self.table[name].file) for name in names}
        if self.kind == "reranker":
            for name, path in paths.items():
                v = self.table[name]
                reference = self.reference(with_torch=v.step == "attention")
                self.progress.step(f"verifying {name} against PyTorch")
                parity = rerank.verify_reranker(path, v.precision, reference, v.disabled_optimizers)
                self.log(f"verified {name:28s} {rerank.describe(v.precision, parity)}"
                         + (f" (session without {', '.join(v.disabled_optimizers)})" if v.disabled_optimizers else ""))
                self._list(name, path, parity)
            return
        reference = self.reference(with_torch=any(self.table[n].step == "attention" for n in names))
        checks = {name: GraphCheck(path, self.table[name].precision, self.table[name].disabled_optimizers,
                                   self.table[name].backend) for name, path in paths.items()}
        parities = measure_all(checks, reference, self.provider,
                               on_graph=lambda name: self.progress.step(f"verifying {name} against PyTorch"))
        for name, graph in checks.items():
            v = self.table[name]
            try:
                check(graph.path, v.precision, parities[name])
            except ExportVerificationError as e:
                # OpenVINO's variants are extra candidates read from the plain graph: one off its bar (bf16 on a
                # model whose activations bf16 rounds too coarsely) is left out in a line.
                if v.backend != OPENVINO:
                    raise
                self.log(f"{name} left out: {e}")
                self.refused[name] = str(e)
                continue
            tolerance = TOLERANCES[v.precision]
            self.log(f"verified {graph.path.name:24s} {tolerance.describe(parities[name][tolerance.metric])}"
                     + (f" (session without {', '.join(v.disabled_optimizers)})" if v.disabled_optimizers
                        else f" ({name})" if graph.path.name != f"{name}.onnx" else ""))
            self._list(name, graph.path, parities[name])

    def _list(self, name: str, path: Path, parity: dict) -> None:
        v = self.table[name]
        fused = v.fused and self.fully_fused.get(self.table[name].file, False)
        self.variants[name] = GraphVariant(name, path.name, sha256_of(path), v.precision, fused, v.outputs, parity,
                                           v.disabled_optimizers, self._data_files(path), v.backend)

    def _data_files(self, graph: Path) -> dict[str, str]:
        """The data files a graph reads -> their sha256, taken from a listed graph that reads one where there is
        (a data file can be gigabytes)."""
        known = {f: sha for v in self.variants.values() for f, sha in v.data_files.items()}
        known |= {f: sha for trace in self.traces.values() for f, sha in trace["data_files"].items()}
        return {f: known.get(f) or sha256_of(self.work / f) for f in external_files(graph)}

    def _commit(self) -> None:
        """A later build lists what it has verified so far (the first writes its manifest once, at the end)."""
        if self.existing is not None:
            write_manifest(dataclasses.replace(
                self.existing, variants=dict(self.variants), quantization=self.quantization,
                traces=dict(self.traces), refused=dict(self.refused), tools=self.existing.tools | _tool_versions()))

    def _claim(self, path: Path) -> Path:
        """path, which a step is about to write: never a file a listed variant or a recorded trace reads."""
        listed = {v.file for v in self.variants.values()} | {f for v in self.variants.values() for f in v.data_files}
        listed |= {t["file"] for t in self.traces.values()} | {f for t in self.traces.values() for f in t["data_files"]}
        if path.name in listed:
            raise ArtifactError(f"{path} is read by a graph the manifest lists; it is not written again")
        return path

    def plain(self, dtype: str) -> Path | None:
        """The plain graph traced in dtype, where this directory holds it (its file as recorded: checked)."""
        entry = self.traces.get(dtype)
        if entry is None:
            return None
        path = self.work / entry["file"]
        if self.existing is not None and entry is self.existing.traces.get(dtype) and (
                not path.is_file() or sha256_of(path) != entry["sha256"]):
            raise ArtifactError(f"artifact file changed since export (sha256 mismatch) or missing: {path}")
        return path

    def _needs_plain(self, dtype: str) -> Path:
        path = self.plain(dtype)
        if path is None:
            self._trace(dtype, [])
            path = self.plain(dtype)
            assert path is not None, "a trace records its plain graph"
        return path

    # -- the steps -------------------------------------------------------------------------------------------------

    def run(self, names: list[str]) -> None:
        wanted = set(names)
        fused = "embeddings_fused" if self.kind == "embedder" else "scores_fused"
        if any(self.table[n].step == "int8" for n in wanted if n in self.table):
            wanted.add(fused)  # the int8 graph is quantized from it
        wanted -= set(self.variants) | set(self.refused)  # a listed graph's files are never written again
        by_step = {step: [n for n in self.table if n in wanted and self.table[n].step == step] for step in STEPS}
        quantization = self.kind == "embedder" and self.quantization is None and (
            "quantization" in wanted or bool(by_step["int8"]))
        stages = (["trace"] if self.existing is None or by_step["trace"] else [])
        for step in STEPS[1:]:
            if step == "int8" and quantization:  # int8's bar needs them: made first
                stages.append("quantization")
            if by_step[step]:
                stages.append(step)
        if quantization and "quantization" not in stages:
            stages.append("quantization")
        weights = fp32_weight_bytes(self.shape.vocab_size, self.shape.hidden_size,  # type: ignore[union-attr]
                                    self.shape.num_layers, self.shape.intermediate_size)  # type: ignore[union-attr]
        cores = this_machine().usable_cpus
        length = self.tokenizer.max_seq_length  # the checkpoint's, or the directory's
        factor = slowdown()  # this machine now, against the table's (engine/speed.py)
        plan = [(STEP_TITLES[step], estimated_seconds(step, weights, cores, self.device == "cuda", length, factor))
                for step in stages]
        self.progress.plan(plan)
        if self.existing is None:
            # The first build traces in the run's dtype (engine/variants.py trace_precision), or in fp32 where a
            # variant asked for is built from the fp32 plain graph (a reranker's graphs all are).
            fp32 = self.kind == "reranker" or any(self.table[n].step in ("trace", "fuse", "int8", "attention")
                                                  or n == "embeddings_openvino" for n in wanted if n in self.table)
            self._trace("fp32" if fp32 else self.first_trace, by_step["trace"])
        elif by_step["trace"]:
            self._trace("fp32", by_step["trace"])
            self._commit()  # the trace's own graphs, verified over a trace an earlier build made, listed
        for step in STEPS[1:]:
            if by_step[step]:
                getattr(self, f"_{step}")(by_step[step])
                self._commit()
        if "quantization" in wanted and self.quantization is None and self.kind == "embedder":
            self._quantization()
            self._commit()
        # How far the stages ran from their estimates corrects the next build's (engine/speed.py).
        learn(sum(seconds for _, seconds in plan), self.progress.pace(running=True))

    def _trace(self, dtype: str, names: list[str]) -> None:
        """The model traced once in dtype into its plain graph and weights file (recorded in traces); the reference
        made by a first build, before the module is made half precision for the trace; the trace's own variants
        (the fp32 plain graph's) verified."""
        self.progress.stage(STEP_TITLES["trace"])
        if dtype not in self.traces:
            if dtype == "fp16" and self._encoder is None and self.kind == "embedder":
                # Loaded straight into fp16, once: the reference computes it in fp32 a layer at a time, then the
                # trace reads the same module. Loading fp32 for the reference first held 4x the fp16 weights
                # (the Qwen3-4B shape: 16 GB, then 8 GB more for the trace: out of memory on 24 GB).
                self.encoder(HALF)
            self.reference()  # PyTorch's outputs, by the model as it was loaded (a half one computes in fp32)
            self.progress.step(f"tracing the graph in {dtype} (torch.onnx.export), its weights written once")
            weights = self._claim(weights_file(self.work, dtype))
            path = self._claim(self.work / (PLAIN[dtype] if self.kind == "embedder" else "scores.onnx"))
            with small_heaps(TRACE_HEAP_THRESHOLD):
                self._trace_into(dtype, path, weights)
            # The model is not held past its trace: verification's sessions hold the weights meanwhile, and a
            # step that needs PyTorch again loads it again (the checkpoint is mapped, not read, until used). A
            # half-precision trace made the module half precision throughout, buffers too.
            self.release_model()
            self.traces[dtype] = {"file": path.name, "sha256": sha256_of(path),
                                  "data_files": {weights.name: sha256_of(weights)}}
        if names:
            self._verify(names)

    def _trace_into(self, dtype: str, path: Path, weights: Path) -> None:
        """The trace itself (its module is this function's alone: once it returns, release_model frees it)."""
        half = dtype == "fp16"
        if self.kind == "embedder":
            module = SentenceEncoder(self.encoder(HALF if half else torch.float32), self._head)
            export_graph(Float32Outputs(module.to(HALF)) if half else module, path, weights)  # type: ignore
        else:
            rerank.export_reranker_graph(self.reranker_module(), path, weights)

    def _fuse(self, names: list[str]) -> None:
        plain = self._needs_plain("fp32")
        self.progress.stage(STEP_TITLES["fuse"])
        self.progress.step("optimizing: onnxruntime's transformer optimizer fuses the plain graph")
        dst = self._claim(self.work / self.table[names[0]].file)
        self._note_fusions(dst, fuse_attention(plain, dst, self.shape))  # type: ignore[arg-type]
        self._verify(names)

    def _note_fusions(self, graph: Path, counts: dict[str, int]) -> None:
        """What the optimizer fused, in a line; whether it fused every layer's attention (the manifest's
        `fused`)."""
        layers = self.shape.num_layers  # type: ignore[union-attr]
        self.fully_fused[graph.name] = fused_attention_nodes(counts) == layers
        if self.fully_fused[graph.name]:
            self.log(f"{graph.name}: attention fused in all {layers} layers; {describe_fusions(counts)}")
        else:  # ModernBERT's rotary attention, MPNet's position bias: the optimizer's other fusions
            self.log(f"{graph.name}: {describe_fusions(counts)} (the optimizer fuses no attention of this family)")

    def _fp16(self, names: list[str]) -> None:
        dst = self._claim(self.work / self.table[names[0]].file)
        fp32 = self.plain("fp32")
        self.progress.stage(STEP_TITLES["fp16"])
        if fp32 is not None:
            self.progress.step("fp16: the fused graph in half precision (onnxruntime's optimizer and converter)")
            counts = convert_fp16(fp32, dst, self.shape)  # type: ignore[arg-type]
        else:
            half = self._needs_plain("fp16")
            self.progress.step("fp16: fusing the graph traced in fp16 (onnxruntime's optimizer)")
            counts = fuse_half(half, dst, self.shape)  # type: ignore[arg-type]
        self._note_fusions(dst, counts)
        self._verify(names)

    def _openvino(self, names: list[str]) -> None:
        if openvino_version() is None:
            raise ArtifactError(f"{', '.join(names)} run on OpenVINO, which is not installed: "
                                "pip install 'attnserve[openvino]'")
        if "embeddings_bf16" in names and not this_machine().native_bf16:
            raise ArtifactError("embeddings_bf16 needs a CPU with native bf16 (AVX512-BF16 or AMX) to verify it on; "
                                f"this one has none ({this_machine().describe()})")
        files = {}
        self.progress.stage(STEP_TITLES["openvino"])
        if "embeddings_openvino" in names:
            self._needs_plain("fp32")
        if "embeddings_bf16" in names:  # the fp32 plain graph where there is one, else the half trace's
            files["embeddings_bf16"] = (self.plain("fp32") or self._needs_plain("fp16")).name
        self._verify(names, files)

    def _int8(self, names: list[str]) -> None:
        fused = self.work / self.table["embeddings_fused" if self.kind == "embedder" else "scores_fused"].file
        dst = self._claim(self.work / self.table[names[0]].file)
        if self.kind == "reranker":
            reference = self.reference()
            self.progress.stage(STEP_TITLES["int8"])
            self.progress.step("int8: quantizing the scores graph, each sensitive node measured")
            try:
                quantize_reranker_int8(fused, dst, reference.calibration, reference.activation, self.log)
            except ValueError as e:  # int8 is a speed option: an fp32 reranker is still served
                self.log(f"{e}: no int8 graph is written")
                self.refused.update({name: f"its int8 scores missed the export's bar ({e})" for name in names})
                return
        else:
            self._quantization()  # int8's bar is the cosine on all 512 verification texts, against PyTorch
            self.progress.stage(STEP_TITLES["int8"])
            self._int8_embeddings(fused, dst)
        share(dst, SharedWeights.of_graphs([fused]))  # the tensors it kept in fp32, read from where they are
        self._verify(names)

    def _int8_embeddings(self, src: Path, dst: Path) -> None:
        """The measured int8 recipe; quantize_int8's by-name recipe where it cannot reach its accuracy bar."""
        try:
            _, kept, measures, split = quantize_int8_measured(src, dst, calibration_feeds(self.tokenizer),
                                                              self.progress.step)
        except ValueError as e:
            self.log(f"{e}; int8 falls back to dynamic per-channel with the family's projections kept in fp32")
            self.progress.step("int8: quantizing by the family's recipe")
            quantize_int8(src, dst, self.shape)  # type: ignore[arg-type]
            return
        units = sum(len(u) for u in split.values())
        self.log(f"int8: {units} outlier units of {len(split)} feed-forwards computed apart in fp32; {len(kept)} "
                 f"most sensitive nodes kept in fp32 ({', '.join(kept) or 'none'}); calibration texts cosine mean "
                 f"{measures['mean']:.4f}, p1 {measures['p1']:.4f} against fp32")

    def _quantization(self) -> None:
        """PyTorch's sentence embeddings of the 512 verification texts: int8's bar, and the ranges of int8 and
        uint8 embeddings (engine/quantize.py), kept in CALIBRATION_FILE."""
        if self.quantization is not None:
            return
        reference = self.reference()
        if len(reference.text_sentences) < VERIFIED_TEXTS:
            self.progress.stage(STEP_TITLES["quantization"])
            reference = self.reference(with_torch=True)
            self.progress.step(f"PyTorch's embeddings of the {VERIFIED_TEXTS} verification texts (int8's bar and "
                               "the quantized embeddings' ranges)")
            with computed_in_fp32(reference.encoder, reference.head):
                reference.with_texts(VERIFIED_TEXTS)
            self.release_model()  # not held while int8's search runs
        np.save(self.work / CALIBRATION_FILE, reference.text_sentences)
        self.quantization = {"file": CALIBRATION_FILE, "sha256": sha256_of(self.work / CALIBRATION_FILE),
                             "texts": int(len(reference.text_sentences))}

    def _attention(self, names: list[str]) -> None:
        """The attention graphs, traced with their maps, reading every weight the plain graph stores from its file;
        verified against PyTorch's maps."""
        graphs = [self.work / t["file"] for t in self.traces.values()] + [self.work / v.file
                                                                          for v in self.variants.values()]
        shared = SharedWeights.of_graphs(sorted(set(graphs)))
        self.progress.stage(STEP_TITLES["attention"])
        if "attention" in self.variants:  # listed (verified): attention_last is cut from it, not traced again
            path = self.work / self.variants["attention"].file
        else:
            path = self._claim(self.work / self.table["attention"].file)
            module = self.encoder() if self.kind == "embedder" else self.reranker_module()
            self.progress.step("tracing the attention graph (torch.onnx.export)")
            if self.kind == "embedder":
                export_graph(SentenceEncoder(module, self._head, output_attentions=True), path, shared=shared)
            else:
                rerank.export_reranker_graph(module.with_attentions(), path, shared=shared)
        if self.kind == "embedder" and "attention_last" in names:
            build_attention_last(path, self._claim(self.work / self.table["attention_last"].file))
        self._verify(names)

    # -- the manifest ----------------------------------------------------------------------------------------------

    def _bge_m3(self) -> dict | None:
        """bge-m3's heads, copied into the directory, where a dense embedder's checkpoint has them."""
        ckpt = self.ckpt
        if self.kind != "embedder" or ckpt.pipeline.splade is not None or ckpt.pipeline.multi_vector is not None \
                or not has_heads(ckpt.directory):
            return None
        settings = save_heads(ckpt.directory, self.work, ckpt.config.hidden_size)
        return {**settings, "sha256": sha256_of(self.work / settings["file"])}

    def _images(self) -> dict | None:
        """An image-text model's image tower (CLIP, SigLIP), exported beside the text tower's graphs."""
        if not isinstance(self.ckpt.config, ImageTextConfig):
            return None
        self.release_model()
        self.progress.step("the image tower")
        return image_artifacts(self.ckpt.directory, self.work, self.progress.log)

    def manifest(self, tasks: tuple[str, ...]) -> Manifest:
        """The first build's manifest (the caller writes it)."""
        ckpt, work = self.ckpt, self.work
        reference = work / (REFERENCE if self.kind == "embedder" else REFERENCE_PAIRS)
        return Manifest(
            directory=work, model=ckpt.name, hidden_size=ckpt.config.hidden_size, num_layers=ckpt.config.num_layers,
            num_heads=ckpt.config.num_heads, intermediate_size=ckpt.config.intermediate_size,
            vocab_size=ckpt.config.vocab_size, max_seq_length=ckpt.max_seq_length, pooling=ckpt.pooling,
            normalize=ckpt.normalize, tokenizer="tokenizer.json", tokenizer_sha256=sha256_of(work / "tokenizer.json"),
            variants=self.variants, tools=_tool_versions(), embedding_size=ckpt.embedding_size,
            modules=tuple(ckpt.modules), prompts=dict(ckpt.pipeline.prompts),
            default_prompt_name=ckpt.pipeline.default_prompt_name, kind=ckpt.kind,
            num_labels=ckpt.num_labels, score_activation=ckpt.score_activation, family=ckpt.config.family,
            tasks=tasks, task=getattr(ckpt.config, "task", None),
            pair_template=ckpt.pair_template.to_json() if ckpt.pair_template is not None else None,
            quantization=self.quantization, refused=dict(self.refused), labels=ckpt.labels,
            problem_type=ckpt.problem_type,
            multi_vector=None if ckpt.pipeline.multi_vector is None else serving_settings(
                ckpt.pipeline.multi_vector, ckpt.directory, Tokenizer.from_file(str(work / "tokenizer.json"))),
            bge_m3=self._bge_m3(),
            images=self._images(), pad_to_length=ckpt.pipeline.pad_to, pad_id=ckpt.pipeline.pad_id,
            attention_reach=self.reach if self.reach is not None else reach_of(self.encoder()),
            include_prompt=ckpt.pipeline.include_prompt,
            static=ckpt.config.serving() if isinstance(ckpt.config, StaticConfig) else None,
            source={"checkpoint": str(ckpt.directory.resolve()), "fingerprint": checkpoint_fingerprint(ckpt.directory)},
            reference={"file": reference.name, "sha256": sha256_of(reference)}, traces=dict(self.traces),
            **self.caps,
        )
