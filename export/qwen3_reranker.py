"""Qwen3-Reranker's graphs (model/qwen3_reranker.py): exported, optimized, converted and verified against PyTorch.

Inputs input_ids and attention_mask, (B, T) int64 with dynamic axes (no token types: the pair is one templated
text); output scores (B, 1), logit_yes - logit_no at the last real token, and for the attention graph
attentions (L, B, nh, T, T) too. The variants and their names are a cross-encoder's (export/reranker.py), so the
engine and server run them as any reranker's. Verification runs every variant on random ids over the shape grid
(rows of random lengths, right-padded as the engine pads) and on real text pairs through the model card's
template, tokenized as the server tokenizes them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from attnserve.engine.batching import pad
from attnserve.engine.manifest import GraphVariant, sha256_of
from attnserve.engine.session import CPU, open_session
from attnserve.engine.tokenizer import TextTokenizer
from attnserve.model.checkpoint import Checkpoint
from attnserve.model.pipeline import read_json
from attnserve.model.qwen3 import Qwen3Encoder
from attnserve.model.qwen3_reranker import Qwen3Reranker, load_reranker, tied_embeddings

from .optimize import convert_fp16, describe_fusions, fuse_attention
from .reranker import TEXT_PAIRS, VARIANTS, attention_errors, check_parity, describe
from .token_ids import made_up_token_ids
from .torch_to_onnx import OPSET
from .verify import SAMPLE_TEXTS, shape_grid

INPUTS = ("input_ids", "attention_mask")


def export_graph(module: Qwen3Reranker, path: Path) -> None:
    outputs = ["scores"] + (["attentions"] if module.output_attentions else [])
    axes = {name: {0: "batch", 1: "sequence"} for name in INPUTS}
    axes |= {"scores": {0: "batch"}, "attentions": {1: "batch", 3: "sequence", 4: "sequence"}}
    ids = torch.full((2, 8), made_up_token_ids(module.encoder.config.vocab_size)[0], dtype=torch.int64)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0  # a live padding path in the trace
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (ids, mask), str(path), dynamo=False, opset_version=OPSET,
                          input_names=list(INPUTS), output_names=outputs,
                          dynamic_axes={k: v for k, v in axes.items() if k in INPUTS or k in outputs})


class TemplatedPairReference:
    """PyTorch scores (and attentions, for the shape grid) on the check inputs, computed once for every variant."""

    def __init__(self, reranker: Qwen3Reranker, tokenizer: TextTokenizer, template: dict[str, str], seed: int = 0):
        rng = np.random.default_rng(seed)
        ids_from = made_up_token_ids(reranker.encoder.config.vocab_size)
        self.cases = []  # (feed, scores (B, 1), attentions or None)
        for batch, seq in shape_grid(tokenizer.max_seq_length):
            lengths = rng.integers(1, seq + 1, size=batch)
            lengths[rng.integers(batch)] = seq
            ids, mask = pad([rng.integers(ids_from.start, ids_from.stop, size=n) for n in lengths])
            feed = {"input_ids": ids, "attention_mask": mask}
            self.cases.append((feed, *self._torch(reranker, feed)))
        texts = [t for t in SAMPLE_TEXTS.read_text(encoding="utf-8").splitlines() if t.strip()][: 2 * TEXT_PAIRS]
        self.pairs = tokenizer.encode_templated_pairs(list(zip(texts[0::2], texts[1::2], strict=False)), template)
        for start in range(0, len(self.pairs), 32):
            ids, mask = pad([x.ids for x in self.pairs[start:start + 32]])
            feed = {"input_ids": ids, "attention_mask": mask}
            self.cases.append((feed, self._torch(reranker, feed)[0], None))

    @staticmethod
    def _torch(reranker: Qwen3Reranker, feed: dict[str, np.ndarray]):
        with torch.no_grad():
            scores, attentions = reranker.with_attentions()(*(torch.from_numpy(feed[name]) for name in INPUTS))
        return scores.numpy(), attentions.numpy()


def measure(path: Path, reference: TemplatedPairReference, provider: str = CPU) -> dict[str, float]:
    session = open_session(path, provider, arena=False)
    wants_attention = "attentions" in [o.name for o in session.get_outputs()]
    max_scores = max_attention = max_padded_key_weight = 0.0
    largest = 1.0
    for feed, scores, attentions in reference.cases:
        outputs = session.run(None, feed)
        max_scores = max(max_scores, float(np.abs(outputs[0] - scores).max()))
        largest = max(largest, float(np.abs(scores).max()))
        if wants_attention and attentions is not None:
            error, padded = attention_errors(feed["attention_mask"], outputs[1], attentions)
            max_attention, max_padded_key_weight = max(max_attention, error), max(max_padded_key_weight, padded)
    metrics = {"max_abs_scores": max_scores, "max_rel_scores": max_scores / largest,
               "shapes_checked": len(reference.cases), "pairs_checked": len(reference.pairs)}
    if wants_attention:
        metrics |= {"max_abs_attentions": max_attention, "max_padded_key_weight": max_padded_key_weight}
    return metrics


def verify(path: Path, precision: str, reference: TemplatedPairReference) -> dict[str, float]:
    return check_parity(path, precision, measure(path, reference))


def qwen3_reranker_variants(ckpt: Checkpoint, encoder: Qwen3Encoder, tokenizer: TextTokenizer, work: Path,
                            log: Callable[[str], None]) -> dict[str, GraphVariant]:
    assert ckpt.pair_template is not None, "read_checkpoint gives a Qwen3 reranker its template"
    config = ckpt.directory / "config.json"
    tied = tied_embeddings(read_json(config), config)
    reranker = load_reranker(ckpt.weights_file, ckpt.tokenizer_file, encoder, tied)
    log(f"reranker: logit(yes) - logit(no) at the last token, from "
        f"{'the tied input embeddings' if tied else 'lm_head'}; activation {ckpt.score_activation}")
    export_graph(reranker, work / VARIANTS["scores"][0])
    export_graph(reranker.with_attentions(), work / VARIANTS["attention"][0])
    counts = fuse_attention(work / VARIANTS["scores"][0], work / VARIANTS["scores_fused"][0], ckpt.config)
    log(f"attention left unfused; the fused graph holds {describe_fusions(counts)}")
    convert_fp16(work / VARIANTS["scores"][0], work / VARIANTS["scores_fp16"][0], ckpt.config)
    reference = TemplatedPairReference(reranker, tokenizer, ckpt.pair_template.to_json())
    variants = {}
    # No int8 graph yet: the int8 search (export/reranker_int8.py) calibrates on the tokenizer's pairs, not on
    # templated texts; precision int8 is refused for this reranker in one line, as where the search misses its bar.
    log("no int8 graph is written for a templated reranker")
    for name, (file, precision, _, outputs) in VARIANTS.items():
        if precision == "int8":
            continue
        parity = verify(work / file, precision, reference)
        log(f"verified {file:24s} {describe(precision, parity)}")
        # fused: False for every graph: the optimizer does not fuse rotary attention.
        variants[name] = GraphVariant(name, file, sha256_of(work / file), precision, False, outputs, parity)
    return variants
