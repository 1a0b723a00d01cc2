"""manifest.json: what an artifact directory holds, checked file by file before use."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnserve.errors import ArtifactError

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
# The poolings a request may choose instead of the model's own (the server pools the token embeddings itself).
REQUEST_POOLINGS = ("mean", "cls")


@dataclass(frozen=True)
class GraphVariant:
    name: str  # "embeddings", "embeddings_fused", "embeddings_int8", "embeddings_fp16", "attention"
    file: str
    sha256: str
    precision: str  # "fp32", "int8", "fp16" or "bf16"
    fused: bool  # attention fused into onnxruntime's Attention op
    outputs: tuple[str, ...]
    parity: dict = field(default_factory=dict)  # errors against PyTorch measured at export
    # onnxruntime graph transformers the session must not apply: two variants may share one file and differ only
    # in these (export verifies each). Optional on read, omitted from manifest.json when empty.
    disabled_optimizers: tuple[str, ...] = ()
    # The files the graph reads its weights from (ONNX external data, beside it) -> their sha256: a graph past
    # protobuf's 2 GB keeps its weights apart (export/external_data.py). Optional on read, omitted when empty.
    data_files: dict[str, str] = field(default_factory=dict)
    # What runs the graph (engine/session.py): onnxruntime, or OpenVINO for the bf16 variant and OpenVINO's fp32
    # one, which read the plain embeddings graph. Optional on read, omitted from manifest.json for onnxruntime.
    backend: str = "onnxruntime"

    @property
    def runs_as(self) -> str:
        """What identifies the computation: the file's sha256 (and its data files': the graph file names their
        weights, not holds them), and the optimizers its session leaves out."""
        return (self.sha256 + "".join(f" {sha}" for _, sha in sorted(self.data_files.items()))
                + "".join(f" without {o}" for o in self.disabled_optimizers)
                + (f" on {self.backend} {self.precision}" if self.backend != "onnxruntime" else ""))


@dataclass(frozen=True)
class Manifest:
    directory: Path
    model: str
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    vocab_size: int
    max_seq_length: int
    pooling: str  # the graph's pooling: a mode of engine/pooling.py's POOLING_MODES, or several joined by "+"
    normalize: bool  # the checkpoint's own pipeline L2-normalises
    tokenizer: str
    tokenizer_sha256: str
    variants: dict[str, GraphVariant]
    tools: dict
    # The size of sentence_embedding: hidden_size, unless a Dense module or several pooling modes change it.
    embedding_size: int
    # The fields below came later: optional on read (load_manifest), so that older artifact directories load.
    modules: tuple[str, ...] = ()  # the pipeline in short words: ("Transformer(bert)", "Pooling(mean)", "Normalize")
    prompts: dict[str, str] = field(default_factory=dict)  # the checkpoint's named prompts
    default_prompt_name: str | None = None  # the prompt put before a text that a caller gives none for

    @property
    def poolable_at_request_time(self) -> bool:
        """Whether pooling the token embeddings at request time (mean or cls) gives what the graph would with
        that pooling: its sentence embedding is one such pooling, with nothing after it but normalisation."""
        after = [m for m in self.modules if not m.startswith(("Transformer(", "StaticEmbedding(", "Pooling("))]
        # A pooling that leaves the prompt out needs the prompt's tokens marked: only the graph's does.
        return self.pooling in REQUEST_POOLINGS and all(m == "Normalize" for m in after) and self.include_prompt

    @property
    def late_chunkable(self) -> bool:
        """Whether late chunking applies (engine/late_chunking.py): a dense embedder whose embedding is a pooling of
        its token embeddings, which late chunking mean-pools per chunk."""
        return self.kind != "reranker" and not self.sparse and self.multi_vector is None and \
            self.poolable_at_request_time
    # Also optional: "embedder", or "reranker" (a cross-encoder whose graphs
    # take token_type_ids and output scores (B, num_labels)
    # of raw logits, model/cross_encoder.py).
    kind: str = "embedder"
    num_labels: int = 0  # a reranker's classifier outputs
    score_activation: str | None = None  # a reranker's CrossEncoder activation: "sigmoid" or "identity"
    # config.json's model_type; absent from manifests written before families were added: those are BERT.
    family: str = "bert"
    # Per-task adapters (jina-embeddings-v3): the tasks exported merged, each under tasks/<task>/ (engine/tasks.py),
    # and in such a task directory's own manifest, its task. Optional on read, omitted from manifest.json if unset.
    tasks: tuple[str, ...] = ()
    task: str | None = None
    # An LLM reranker's template (model/llm_reranker.py): "{prefix}{body}{suffix}" per pair (Qwen3-Reranker), the
    # body's {instruction}, {query} and {document} filled in, only the body truncated; or, with style
    # "query_document", the query and the document tokenized and cut apart (mxbai-rerank-v2). None: the tokenizer's
    # pair.
    pair_template: dict[str, Any] | None = None
    # The longest inputs export verified the graphs at, and the attention graph runs at: max_seq_length but for
    # long-context models, whose attention maps (layers x heads x T^2 a row) would not fit in memory
    # (export/verify.py). 0: max_seq_length (manifests written before the caps, read by load_manifest as such).
    verified_max_length: int = 0
    attention_max_length: int = 0
    # The sentence embeddings of export's verification texts, the int8 / uint8 ranges of quantized embeddings
    # (engine/quantize.py): {"file", "sha256", "texts"}. None: exported before them, or a reranker.
    quantization: dict | None = None
    # A classifier's (a reranker's) label names in output order, and its problem_type (model/cross_encoder.py);
    # optional on read: transformers' LABEL_i and None.
    labels: tuple[str, ...] = ()
    problem_type: str | None = None
    # A ColBERT model's (model/colbert.py serving_settings; engine/multi_vector.py reads it): its vectors' dimension,
    # query and document lengths, query expansion, skip-list ids and similarity. None: not a multi-vector model.
    multi_vector: dict | None = None
    # bge-m3's sparse and ColBERT heads (model/bge_m3.py; engine/bge_m3.py reads them): {"file", "sha256",
    # "colbert_dim", "unused_ids"}. None: a model without them.
    bge_m3: dict | None = None
    # What builds the variants a directory does not hold yet (export/artifacts.py add_variants); None, {}, None for
    # a directory exported whole before variants were built as needed:
    # - source: the checkpoint exported, {"checkpoint": its absolute path, "fingerprint": its files' names, sizes
    #   and times}, loaded again by the steps that need PyTorch;
    # - traces: the plain graphs traced, by dtype ("fp32", "fp16") -> {"file", "sha256", "data_files"}: what the
    #   other graphs are built from;
    # - reference: PyTorch's outputs on the check inputs, {"file", "sha256"} (export/verify.py Reference).
    source: dict | None = None
    traces: dict[str, dict] = field(default_factory=dict)
    reference: dict | None = None
    # Variants a build made and left out, with why: an int8 graph off its bar, OpenVINO's bf16 off its. A run that
    # asks for one is told why, and nothing builds it again.
    refused: dict[str, str] = field(default_factory=dict)
    # An image-text model's image tower (CLIP, SigLIP: export/image_tower.py; engine/image_encoder.py reads it), the
    # text tower being the model above: {"graphs": {name: {"file", "sha256", "precision", "data_files", "parity",
    # "outputs"}}, "processor": {"file", "sha256"}, "image_size", "patch_size", "num_channels", "class_token",
    # "hidden_size", "num_layers", "num_heads", "embedding_size", "logit_scale" (exp'd), "logit_bias" (or None),
    # "zero_shot" ("softmax" or "sigmoid"), "max_patches" (SigLIP 2's NaFlex: each image at its own size, up to
    # this many patches; 0: a fixed-size tower)}. None: a text model.
    images: dict | None = None
    # A model whose texts are padded to a fixed length with pad_id, the pads attended to (SigLIP's text tower:
    # engine/tokenizer.py); 0: none. Optional on read, omitted from manifest.json when 0.
    pad_to_length: int = 0
    pad_id: int = 0
    # Which keys each layer's queries may attend to (model/attention_reach.py): per layer [behind, ahead], None no
    # bound; what a client draws as masked. None: exported before it was written (clients then mark nothing).
    attention_reach: tuple[tuple[int | None, int | None], ...] | None = None
    # Pooling's include_prompt (model/pipeline.py): False, the prompt's first prompt_tokens(prompt) tokens are left
    # out of the pooling (NV-Embed's instruction), marked PROMPT_TOKEN in the graph's mask (engine/prompts.py).
    # Optional on read, omitted from manifest.json when true.
    include_prompt: bool = True
    # A static model's (model/static_embedding.py: a token table and a mean): {"library": "model2vec" or
    # "sentence-transformers", "char_limit" (model2vec's cut of each text before tokenizing; 0: none),
    # "dropped_ids" (model2vec's unknown token, left out of the mean)}, read by engine/tokenizer.py. None: not one.
    static: dict | None = None

    def quantization_ranges(self, dimensions: int | None, normalize: bool):
        """(2, D) int8 / uint8 ranges for embeddings cut to `dimensions` and normalised or not; None where the
        artifacts hold no calibration embeddings."""
        if self.quantization is None:
            return None
        from .quantize import calibration_ranges

        return calibration_ranges(self.path(self.quantization["file"]), self.quantization["sha256"], dimensions,
                                  normalize)

    @property
    def has_value_norms(self) -> bool:
        """Whether the attention graph gives each head's value norms (model/value_norms.py): exported since they
        were added, or to be built as needed by this version (which adds them)."""
        attention = self.variants.get("attention")
        if attention is None:
            return self.source is not None
        return "value_norms" in attention.outputs

    @property
    def sparse(self) -> bool:
        """A SPLADE model (model/splade.py): its sentence embedding is a weight per vocabulary entry, almost all
        zero, served as (index, value) pairs."""
        return self.pooling.startswith("splade_")

    @property
    def label_names(self) -> tuple[str, ...]:
        """A reranker's labels in output order; transformers' LABEL_i where the manifest names none."""
        return self.labels or tuple(f"LABEL_{i}" for i in range(self.num_labels))

    @property
    def served_max_length(self) -> int:
        """The longest input served: max_seq_length, but for long-context models the length export verified the
        graphs at, which memory allows (one row's attention scores, export/verify.py: Qwen3 at 32,768 positions
        would need 68 GB a layer). Longer inputs are truncated or refused as past max_seq_length."""
        return min(self.max_seq_length, self.verified_max_length or self.max_seq_length)

    @property
    def attention_cap(self) -> int:
        """The longest input an attention request may have."""
        return self.attention_max_length or self.max_seq_length

    def path(self, name: str) -> Path:
        return self.directory / name

    def to_json(self) -> dict:
        return {
            "format_version": FORMAT_VERSION, "model": self.model, "family": self.family,
            "hidden_size": self.hidden_size,
            "num_layers": self.num_layers, "num_heads": self.num_heads,
            "intermediate_size": self.intermediate_size, "vocab_size": self.vocab_size,
            "max_seq_length": self.max_seq_length,
            "verified_max_length": self.verified_max_length or self.max_seq_length,
            "attention_max_length": self.attention_cap,
            "pooling": self.pooling, "normalize": self.normalize,
            "tokenizer": {"file": self.tokenizer, "sha256": self.tokenizer_sha256},
            "variants": {name: {"file": v.file, "sha256": v.sha256, "precision": v.precision, "fused": v.fused,
                                "outputs": list(v.outputs), "parity": v.parity,
                                **({"disabled_optimizers": list(v.disabled_optimizers)}
                                   if v.disabled_optimizers else {}),
                                **({"data_files": dict(v.data_files)} if v.data_files else {}),
                                **({"backend": v.backend} if v.backend != "onnxruntime" else {})}
                         for name, v in self.variants.items()},
            "tools": self.tools, "embedding_size": self.embedding_size, "modules": list(self.modules),
            "prompts": self.prompts, "default_prompt_name": self.default_prompt_name,
            "kind": self.kind,
            **({"num_labels": self.num_labels, "score_activation": self.score_activation,
                "labels": list(self.label_names), "problem_type": self.problem_type}
               if self.kind == "reranker" else {}),
            **({"tasks": list(self.tasks)} if self.tasks else {}),
            **({"task": self.task} if self.task is not None else {}),
            **({"pair_template": self.pair_template} if self.pair_template is not None else {}),
            **({"quantization": self.quantization} if self.quantization is not None else {}),
            **({"multi_vector": self.multi_vector} if self.multi_vector is not None else {}),
            **({"bge_m3": self.bge_m3} if self.bge_m3 is not None else {}),
            **({"source": self.source} if self.source is not None else {}),
            **({"traces": self.traces} if self.traces else {}),
            **({"reference": self.reference} if self.reference is not None else {}),
            **({"refused": self.refused} if self.refused else {}),
            **({"images": self.images} if self.images is not None else {}),
            **({"pad_to_length": self.pad_to_length, "pad_id": self.pad_id} if self.pad_to_length else {}),
            **({"attention_reach": [list(r) for r in self.attention_reach]}
               if self.attention_reach is not None else {}),
            **({} if self.include_prompt else {"include_prompt": False}),
            **({"static": self.static} if self.static is not None else {}),
        }


def write_manifest(manifest: Manifest) -> None:
    """manifest.json written whole, atomically: a reader (a server starting, a build in another process) sees the
    old manifest or the new one, never a mixture."""
    path = manifest.path(MANIFEST)
    tmp = path.with_name(f".{MANIFEST}.{os.getpid()}.{secrets.token_hex(4)}.tmp")  # open() keeps the umask's mode
    try:
        with open(tmp, "x", encoding="utf-8") as f:
            f.write(json.dumps(manifest.to_json(), indent=2) + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_file(directory: Path, name: str, expected: str) -> None:
    path = directory / name
    if not path.is_file():
        raise ArtifactError(f"artifact file missing: {path} (re-run `attnserve export`)")
    if sha256_of(path) != expected:
        raise ArtifactError(f"artifact file changed since export (sha256 mismatch): {path}")


def load_manifest(directory: str | Path, check_hashes: bool = True) -> Manifest:
    """Read manifest.json and (by default) check the sha256 of every file it lists."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        raise ArtifactError(f"no {MANIFEST} in {directory}: not an artifact directory "
                            "(make one with `attnserve export`)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if raw.get("format_version") != FORMAT_VERSION:
            raise ArtifactError(f"{path}: format_version {raw.get('format_version')} is not {FORMAT_VERSION}; "
                                "re-export")
        variants = _variants(raw)
        manifest = Manifest(directory=directory, **_model_fields(raw), variants=variants, **_other_fields(raw))
        if manifest.kind not in ("embedder", "reranker"):
            raise ArtifactError(f"{path}: kind {manifest.kind!r} is not embedder or reranker; re-export")
        if manifest.attention_reach is not None and len(manifest.attention_reach) != manifest.num_layers:
            raise ArtifactError(f"{path}: attention_reach has {len(manifest.attention_reach)} layers, not "
                                f"{manifest.num_layers}; re-export")
    except ArtifactError:
        raise
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise ArtifactError(f"{path} is unreadable or incomplete: {type(e).__name__}: {e}") from None
    if check_hashes:
        _check_hashes(directory, manifest)
    return manifest


def _variants(raw: dict) -> dict[str, GraphVariant]:
    """The manifest's graph variants, their types checked (KeyError, TypeError, ValueError: unreadable)."""
    return {
        name: GraphVariant(name, v["file"], v["sha256"], v["precision"], bool(v["fused"]),
                           tuple(v["outputs"]), dict(v.get("parity", {})),
                           tuple(str(o) for o in v.get("disabled_optimizers", ())),
                           {str(f): str(h) for f, h in v.get("data_files", {}).items()},
                           str(v.get("backend", "onnxruntime")))
        for name, v in raw["variants"].items()
    }


def _model_fields(raw: dict) -> dict[str, Any]:
    """The model's shape, pooling and tokenizer: Manifest's fields before its variants, read in their order."""
    return dict(
        model=str(raw["model"]), hidden_size=int(raw["hidden_size"]),
        num_layers=int(raw["num_layers"]), num_heads=int(raw["num_heads"]),
        intermediate_size=int(raw["intermediate_size"]), vocab_size=int(raw["vocab_size"]),
        max_seq_length=int(raw["max_seq_length"]), pooling=str(raw["pooling"]), normalize=bool(raw["normalize"]),
        tokenizer=str(raw["tokenizer"]["file"]), tokenizer_sha256=str(raw["tokenizer"]["sha256"]))


# A "query_document" pair_template's fields and their JSON types (model/llm_reranker.py QueryDocumentTemplate).
QUERY_DOCUMENT_KEYS: dict[str, type | tuple[type, ...]] = {
    "prefix": list, "query": str, "sep": str, "document": str, "suffix": list, "max_length": int,
    "document_budget": (int, type(None)), "pair_extra": int, "prefix_in_pair": bool, "longest": int}


def _pair_template(raw: Any) -> dict[str, Any] | None:
    """The manifest's pair_template: Qwen3-Reranker's four texts, or a "query_document" template's fields, each of
    its type (a KeyError or TypeError names what is missing or mistyped, as the other fields')."""
    if raw is None:
        return None
    if raw.get("style") != "query_document":
        return {key: str(raw[key]) for key in ("prefix", "body", "suffix", "instruction")}
    for key, kind in QUERY_DOCUMENT_KEYS.items():
        if not isinstance(raw[key], kind) or (kind is int and isinstance(raw[key], bool)):
            raise TypeError(f"pair_template {key} {raw[key]!r}")
    return {"style": "query_document", **{key: raw[key] for key in QUERY_DOCUMENT_KEYS}}


def _other_fields(raw: dict) -> dict[str, Any]:
    """Manifest's fields after its variants, each as the keyword Manifest takes, read in their order (the first
    missing or mistyped one is the one an unreadable manifest's error names)."""
    return dict(
        tools=dict(raw.get("tools", {})),
        embedding_size=int(raw.get("embedding_size") or raw["hidden_size"]),
        modules=tuple(str(m) for m in raw.get("modules", ())),
        prompts={str(k): str(v) for k, v in raw.get("prompts", {}).items()},
        default_prompt_name=None if raw.get("default_prompt_name") is None else str(raw["default_prompt_name"]),
        kind=str(raw.get("kind", "embedder")),
        num_labels=int(raw.get("num_labels", 0)), score_activation=raw.get("score_activation"),
        family=str(raw.get("family", "bert")),
        tasks=tuple(str(t) for t in raw.get("tasks", ())),
        task=None if raw.get("task") is None else str(raw["task"]),
        pair_template=_pair_template(raw.get("pair_template")),
        verified_max_length=int(raw.get("verified_max_length", raw["max_seq_length"])),
        attention_max_length=int(raw.get("attention_max_length", raw["max_seq_length"])),
        labels=tuple(str(label) for label in raw.get("labels", ())),
        problem_type=None if raw.get("problem_type") is None else str(raw["problem_type"]),
        multi_vector=None if raw.get("multi_vector") is None else dict(raw["multi_vector"]),
        bge_m3=None if raw.get("bge_m3") is None else {
            "file": str(raw["bge_m3"]["file"]), "sha256": str(raw["bge_m3"]["sha256"]),
            "colbert_dim": int(raw["bge_m3"]["colbert_dim"]),
            "unused_ids": [int(i) for i in raw["bge_m3"]["unused_ids"]]},
        quantization=None if raw.get("quantization") is None else {
            "file": str(raw["quantization"]["file"]), "sha256": str(raw["quantization"]["sha256"]),
            "texts": int(raw["quantization"]["texts"])},
        source=None if raw.get("source") is None else {
            "checkpoint": str(raw["source"]["checkpoint"]), "fingerprint": str(raw["source"]["fingerprint"])},
        traces={str(dtype): {"file": str(t["file"]), "sha256": str(t["sha256"]),
                             "data_files": {str(f): str(h) for f, h in t["data_files"].items()}}
                for dtype, t in raw.get("traces", {}).items()},
        reference=None if raw.get("reference") is None else {
            "file": str(raw["reference"]["file"]), "sha256": str(raw["reference"]["sha256"])},
        refused={str(name): str(why) for name, why in raw.get("refused", {}).items()},
        images=None if raw.get("images") is None else _images(raw["images"]),
        pad_to_length=int(raw.get("pad_to_length", 0)), pad_id=int(raw.get("pad_id", 0)),
        attention_reach=None if raw.get("attention_reach") is None else _reach(raw["attention_reach"]),
        include_prompt=raw.get("include_prompt", True) is not False,
        static=None if raw.get("static") is None else {
            "library": str(raw["static"]["library"]), "char_limit": int(raw["static"]["char_limit"]),
            "dropped_ids": [int(i) for i in raw["static"]["dropped_ids"]]},
    )


def _check_hashes(directory: Path, manifest: Manifest) -> None:
    """The sha256 of every file the manifest lists, each file once however many graphs share it."""
    _check_file(directory, manifest.tokenizer, manifest.tokenizer_sha256)
    checked: set[str] = set()  # a file several variants share is hashed once
    for v in manifest.variants.values():
        for name, sha in ((v.file, v.sha256), *v.data_files.items()):
            if name not in checked:
                _check_file(directory, name, sha)
                checked.add(name)
    if manifest.quantization is not None:
        _check_file(directory, manifest.quantization["file"], manifest.quantization["sha256"])
    if manifest.images is not None:
        _check_file(directory, manifest.images["processor"]["file"], manifest.images["processor"]["sha256"])
        for graph in manifest.images["graphs"].values():
            for name, sha in ((graph["file"], graph["sha256"]), *graph["data_files"].items()):
                if name not in checked:
                    _check_file(directory, name, sha)
                    checked.add(name)


def _images(raw: dict) -> dict:
    """The manifest's images entry, its types checked (KeyError, TypeError, ValueError: unreadable)."""
    return {
        "graphs": {str(name): {"file": str(g["file"]), "sha256": str(g["sha256"]), "precision": str(g["precision"]),
                               "data_files": {str(f): str(h) for f, h in g.get("data_files", {}).items()},
                               "outputs": [str(o) for o in g["outputs"]], "parity": dict(g.get("parity", {})),
                               "backend": str(g.get("backend", "onnxruntime"))}
                   for name, g in raw["graphs"].items()},
        "processor": {"file": str(raw["processor"]["file"]), "sha256": str(raw["processor"]["sha256"])},
        **{key: int(raw[key]) for key in ("image_size", "patch_size", "num_channels", "hidden_size", "num_layers",
                                          "num_heads", "embedding_size")},
        "class_token": bool(raw["class_token"]), "logit_scale": float(raw["logit_scale"]),
        "logit_bias": None if raw.get("logit_bias") is None else float(raw["logit_bias"]),
        "zero_shot": str(raw["zero_shot"]), "max_patches": int(raw.get("max_patches", 0)),
    }


def _reach(raw: Any) -> tuple[tuple[int | None, int | None], ...]:
    """attention_reach: a list of [behind, ahead] per layer, each a non-negative integer or null (ValueError)."""
    def bound(value: Any) -> int | None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"attention_reach bounds are non-negative integers or null, not {value!r}")
        return value

    return tuple((bound(behind), bound(ahead)) for behind, ahead in raw)
