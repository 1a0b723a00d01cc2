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

from attnserve import __version__
from attnserve.engine.manifest import MANIFEST, GraphVariant, Manifest, sha256_of
from attnserve.engine.tokenizer import TextTokenizer
from attnserve.errors import ArtifactError
from attnserve.model.checkpoint import Checkpoint, load_encoder
from attnserve.model.encoder import Encoder, SentenceEncoder
from attnserve.model.head import load_head

from .optimize import convert_fp16, describe_fusions, fuse_attention, fused_attention_nodes, quantize_int8
from .reranker import reranker_variants
from .tokenizer_parity import check_tokenizer
from .torch_to_onnx import export_graph
from .verify import TOLERANCES, Reference, verify_all

# name -> (file, precision, fused, outputs)
VARIANTS = {
    "embeddings": ("embeddings.onnx", "fp32", False, ("last_hidden_state", "sentence_embedding")),
    "embeddings_fused": ("embeddings_fused.onnx", "fp32", True, ("last_hidden_state", "sentence_embedding")),
    "embeddings_int8": ("embeddings_int8.onnx", "int8", True, ("last_hidden_state", "sentence_embedding")),
    "embeddings_fp16": ("embeddings_fp16.onnx", "fp16", True, ("last_hidden_state", "sentence_embedding")),
    "attention": ("attention.onnx", "fp32", False, ("last_hidden_state", "sentence_embedding", "attentions")),
}


def _tool_versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import tokenizers
    import torch

    return {"attnserve": __version__, "torch": torch.__version__, "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__, "tokenizers": tokenizers.__version__,
            "python": platform.python_version()}


def _claim_destination(out: Path) -> None:
    """Refuse to replace anything that is not an artifact directory (or empty)."""
    if out.exists() and not (out.is_dir() and ((out / MANIFEST).exists() or not any(out.iterdir()))):
        raise ArtifactError(f"{out} exists and is not an artifact directory; refusing to overwrite it")


def build_artifacts(ckpt: Checkpoint, out: Path, log: Callable[[str], None] = lambda m: print(m, file=sys.stderr)
                    ) -> Manifest:
    out = Path(out)
    _claim_destination(out)
    start = time.perf_counter()
    check_tokenizer(ckpt)  # before any weight is loaded or graph traced: a refusal is quick
    encoder = load_encoder(ckpt)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        work = out.parent / f".{out.name}.building-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
    except OSError as e:
        raise ArtifactError(f"cannot write artifacts under {out.parent}: {e.strerror}") from None
    try:
        log(f"exporting {ckpt.name} ({ckpt.config.num_layers} layers, hidden {ckpt.config.hidden_size}; "
            f"{' -> '.join(ckpt.modules)}) to ONNX")
        shutil.copyfile(ckpt.tokenizer_file, work / "tokenizer.json")
        tokenizer = TextTokenizer(work / "tokenizer.json", ckpt.max_seq_length, ckpt.config.vocab_size)
        if ckpt.kind == "reranker":
            assert isinstance(encoder, Encoder), "read_checkpoint reads cross-encoders of the BERT family only"
            variants = reranker_variants(ckpt, encoder, tokenizer, work, log)
        else:
            variants = _embedder_variants(ckpt, encoder, tokenizer, work, log)
        manifest = Manifest(
            directory=out, model=ckpt.name, hidden_size=ckpt.config.hidden_size, num_layers=ckpt.config.num_layers,
            num_heads=ckpt.config.num_heads, intermediate_size=ckpt.config.intermediate_size,
            vocab_size=ckpt.config.vocab_size, max_seq_length=ckpt.max_seq_length, pooling=ckpt.pooling,
            normalize=ckpt.normalize, tokenizer="tokenizer.json", tokenizer_sha256=sha256_of(work / "tokenizer.json"),
            variants=variants, tools=_tool_versions(), embedding_size=ckpt.embedding_size,
            modules=tuple(ckpt.modules), prompts=dict(ckpt.pipeline.prompts),
            default_prompt_name=ckpt.pipeline.default_prompt_name, kind=ckpt.kind,
            num_labels=ckpt.num_labels, score_activation=ckpt.score_activation, family=ckpt.config.family,
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


def _embedder_variants(ckpt: Checkpoint, encoder, tokenizer: TextTokenizer, work: Path, log: Callable[[str], None]
                       ) -> dict[str, GraphVariant]:
    head = load_head(ckpt.directory, ckpt.pipeline)
    export_graph(SentenceEncoder(encoder, head), work / VARIANTS["embeddings"][0])
    export_graph(SentenceEncoder(encoder, head, output_attentions=True), work / VARIANTS["attention"][0])
    counts = fuse_attention(work / VARIANTS["embeddings"][0], work / VARIANTS["embeddings_fused"][0], ckpt.config)
    log(f"fused attention: {fused_attention_nodes(counts)} Attention nodes for {ckpt.config.num_layers} layers")
    quantize_int8(work / VARIANTS["embeddings_fused"][0], work / VARIANTS["embeddings_int8"][0], ckpt.config)
    fp16_counts = convert_fp16(work / VARIANTS["embeddings"][0], work / VARIANTS["embeddings_fp16"][0], ckpt.config)
    # Whether the fp32 graphs (False) and the fp16 graph (True) have every layer's attention fused. Where the
    # optimizer cannot fuse it (ModernBERT's rotary attention, MPNet's position bias), the "fused" variants hold
    # its other fusions; the manifest then says fused: false for them, and the log what they hold.
    fully_fused = {False: fused_attention_nodes(counts) == ckpt.config.num_layers,
                   True: fused_attention_nodes(fp16_counts) == ckpt.config.num_layers}
    if not fully_fused[False]:
        log(f"attention left unfused; the fused graph holds {describe_fusions(counts)}, "
            f"the fp16 graph {describe_fusions(fp16_counts)}")
    reference = Reference(encoder, head, ckpt.embedding_size, tokenizer)
    # The attention graph first: PyTorch's one pass over the check inputs for it serves the others too.
    order = sorted(VARIANTS, key=lambda name: name != "attention")
    parities = verify_all({name: (work / VARIANTS[name][0], VARIANTS[name][1]) for name in order}, reference)
    variants = {}
    for name, (file, precision, fused, outputs) in VARIANTS.items():
        parity = parities[name]
        log(f"verified {file:24s} {TOLERANCES[precision].describe(parity[TOLERANCES[precision].metric])}")
        variants[name] = GraphVariant(name, file, sha256_of(work / file), precision,
                                      fused and fully_fused[precision == "fp16"], outputs, parity)
    return variants
