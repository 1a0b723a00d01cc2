"""A cross-encoder's graphs (model/cross_encoder.py): exported, fused, converted and verified against PyTorch.

Inputs input_ids, attention_mask and token_type_ids, all (B, T) int64 with dynamic axes; output scores
(B, num_labels) of raw logits, and for the attention graph attentions (L, B, nh, T, T) too. Verification runs
every variant on random pairs (rows of random lengths, a random split into segment a of type 0 and b of type 1)
over the shape grid, and on real text pairs tokenized as the server tokenizes them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from attnserve.engine.batching import pad, pad_types
from attnserve.engine.manifest import GraphVariant, sha256_of
from attnserve.engine.session import CPU, open_session
from attnserve.engine.tokenizer import TextTokenizer
from attnserve.errors import ExportVerificationError
from attnserve.model.checkpoint import Checkpoint
from attnserve.model.cross_encoder import Reranker, load_reranker
from attnserve.model.encoder import Encoder

from .optimize import convert_fp16, fuse_attention
from .token_ids import made_up_token_ids
from .torch_to_onnx import OPSET
from .verify import SAMPLE_TEXTS, shape_grid

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# name -> (file, precision, fused, outputs). No int8 graph: its tolerance is stated for embeddings' cosine, and
# a reranker's order can turn on small score differences; precision int8 is refused for rerankers.
VARIANTS = {
    "scores": ("scores.onnx", "fp32", False, ("scores",)),
    "scores_fused": ("scores_fused.onnx", "fp32", True, ("scores",)),
    "scores_fp16": ("scores_fp16.onnx", "fp16", True, ("scores",)),
    "attention": ("attention.onnx", "fp32", False, ("scores", "attentions")),
}
# Largest error of the raw logits allowed against PyTorch, per precision, relative to the largest logit checked
# (at least 1, so that for logits within +-1 it is absolute): rounding grows with the logits' scale. Measured on
# the tests' cross-encoder (logits up to about 8.5): fp32 5.5e-5 absolute, 6.5e-6 relative; fp16 0.09 absolute,
# 0.011 relative (fp16 keeps about three significant digits), 0.0215 once the embeddings' sum and LayerNorm were
# fused into one node in fp16 too (SkipLayerNormalization, export/optimize.py). That test model's weights are drawn
# 25x wider than transformers' initialisation, which the fp16 rounding error grows with.
SCORE_TOLERANCE = {"fp32": ("max_rel_scores", 1e-4), "fp16": ("max_rel_scores", 3e-2)}
TEXT_PAIRS = 256


def export_reranker_graph(module: Reranker, path: Path) -> None:
    outputs = ["scores"] + (["attentions"] if module.output_attentions else [])
    axes = {name: {0: "batch", 1: "sequence"} for name in INPUTS}
    axes |= {"scores": {0: "batch"}, "attentions": {1: "batch", 3: "sequence", 4: "sequence"}}
    ids = torch.full((2, 8), made_up_token_ids(module.encoder.config.vocab_size)[0], dtype=torch.int64)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    types = torch.zeros_like(ids)
    types[:, 3:] = 1  # a live token-type path in the trace
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (ids, mask, types), str(path), dynamo=False, opset_version=OPSET,
                          input_names=list(INPUTS), output_names=outputs,
                          dynamic_axes={k: v for k, v in axes.items() if k in INPUTS or k in outputs})


class PairReference:
    """PyTorch scores (and attentions) on the check inputs, computed once for every variant."""

    def __init__(self, reranker: Reranker, tokenizer: TextTokenizer, seed: int = 0):
        rng = np.random.default_rng(seed)
        ids_from = made_up_token_ids(reranker.encoder.config.vocab_size)
        type_count = reranker.encoder.config.type_vocab_size
        self.cases = []  # (feed, scores, attentions)
        for batch, seq in shape_grid(tokenizer.max_seq_length):
            lengths = rng.integers(1, seq + 1, size=batch)
            lengths[rng.integers(batch)] = seq
            ids, mask = pad([rng.integers(ids_from.start, ids_from.stop, size=n) for n in lengths])
            types = pad_types([(np.arange(n) >= rng.integers(0, n + 1)).astype(np.int64) % type_count
                               for n in lengths], ids.shape[1])
            feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
            self.cases.append((feed, *self._torch(reranker, feed)))
        texts = [t for t in SAMPLE_TEXTS.read_text(encoding="utf-8").splitlines() if t.strip()][: 2 * TEXT_PAIRS]
        pairs = list(zip(texts[0::2], texts[1::2], strict=False))
        self.pairs = tokenizer.encode_pairs(pairs)
        for start in range(0, len(self.pairs), 32):
            chunk = self.pairs[start:start + 32]
            ids, mask = pad([x.ids for x in chunk])
            feed = {"input_ids": ids, "attention_mask": mask,
                    "token_type_ids": pad_types([x.type_ids for x in chunk], ids.shape[1])}
            self.cases.append((feed, self._torch(reranker, feed)[0], None))

    @staticmethod
    def _torch(reranker: Reranker, feed: dict[str, np.ndarray]):
        with torch.no_grad():
            scores, attentions = reranker.with_attentions()(
                *(torch.from_numpy(feed[name]) for name in INPUTS))
        return scores.numpy(), attentions.numpy()


def measure(path: Path, reference: PairReference, provider: str = CPU) -> dict[str, float]:
    session = open_session(path, provider)
    wants_attention = "attentions" in [o.name for o in session.get_outputs()]
    max_scores = max_attention = max_padded_key_weight = 0.0
    largest = 1.0
    for feed, scores, attentions in reference.cases:
        outputs = session.run(None, feed)
        max_scores = max(max_scores, float(np.abs(outputs[0] - scores).max()))
        largest = max(largest, float(np.abs(scores).max()))
        if wants_attention and attentions is not None:
            real = feed["attention_mask"].astype(bool)
            keys, queries = real[None, :, None, None, :], real[None, :, None, :, None]
            got = outputs[1]  # (L, B, nh, T, T)
            max_attention = max(max_attention, float(np.abs(got - attentions)[np.broadcast_to(
                keys & queries, got.shape)].max()))
            max_padded_key_weight = max(max_padded_key_weight, float(np.where(keys, 0.0, got).max()))
    metrics = {"max_abs_scores": max_scores, "max_rel_scores": max_scores / largest,
               "shapes_checked": len(reference.cases), "pairs_checked": len(reference.pairs)}
    if wants_attention:
        metrics |= {"max_abs_attentions": max_attention, "max_padded_key_weight": max_padded_key_weight}
    return metrics


def verify_reranker(path: Path, precision: str, reference: PairReference) -> dict[str, float]:
    metrics = measure(path, reference)
    metric, limit = SCORE_TOLERANCE[precision]
    if not metrics[metric] <= limit or metrics.get("max_padded_key_weight", 0.0) != 0:
        raise ExportVerificationError(
            f"{path.name} ({precision}) fails parity with PyTorch: {metric} {metrics[metric]:.3g} "
            f"<= {limit:g} does not hold" + (f"; padded keys got weight {metrics['max_padded_key_weight']:g}"
                                             if metrics.get("max_padded_key_weight") else ""))
    return metrics


def reranker_variants(ckpt: Checkpoint, encoder: Encoder, tokenizer: TextTokenizer, work: Path,
                      log: Callable[[str], None]) -> dict[str, GraphVariant]:
    reranker = load_reranker(ckpt.weights_file, encoder, ckpt.num_labels)
    log(f"reranker: classifier over {ckpt.num_labels} label(s), activation {ckpt.score_activation}")
    export_reranker_graph(reranker, work / VARIANTS["scores"][0])
    export_reranker_graph(reranker.with_attentions(), work / VARIANTS["attention"][0])
    counts = fuse_attention(work / VARIANTS["scores"][0], work / VARIANTS["scores_fused"][0], ckpt.config)
    log(f"fused attention: {counts.get('Attention', 0)} Attention nodes for {ckpt.config.num_layers} layers")
    convert_fp16(work / VARIANTS["scores"][0], work / VARIANTS["scores_fp16"][0], ckpt.config)
    reference = PairReference(reranker, tokenizer)
    variants = {}
    for name, (file, precision, fused, outputs) in VARIANTS.items():
        parity = verify_reranker(work / file, precision, reference)
        metric, limit = SCORE_TOLERANCE[precision]
        log(f"verified {file:24s} {metric} {parity[metric]:.3g} <= {limit:g}")
        variants[name] = GraphVariant(name, file, sha256_of(work / file), precision, fused, outputs, parity)
    return variants
