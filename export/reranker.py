"""A cross-encoder's graphs (model/cross_encoder.py): exported, fused, converted and verified against PyTorch.

Inputs input_ids, attention_mask and, for families with token types (BERT), token_type_ids, all (B, T) int64
with dynamic axes; output scores (B, num_labels) of raw logits, and for the attention graph attentions
(L, B, nh, T, T) too. Verification runs every variant on random pairs (rows of random lengths, a random split into
segment a of type 0 and b of type 1 where the family has token types) over the shape grid, and on real text pairs
tokenized as the server tokenizes them. The int8 graph (export/reranker_int8.py) is held to the scores a user gets
on the text pairs, as the embedders' int8 is held to the cosine on texts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnserve.engine.batching import pad, pad_types
from attnserve.engine.session import CHECK_SPIN, CPU, open_session
from attnserve.engine.token_ids import made_up_token_ids
from attnserve.engine.tokenizer import TextTokenizer, TokenizedInput
from attnserve.errors import ExportVerificationError
from attnserve.model.checkpoint import Checkpoint
from attnserve.model.cross_encoder import Reranker, load_reranker
from attnserve.model.family import EncoderModule
from attnserve.model.llm_reranker import LLMReranker

from .external_data import SharedWeights
from .memory import small_heaps
from .reranker_int8 import INT8_MEAN_SCORE_ERROR, INT8_MIN_SPEARMAN, score_agreement
from .torch_to_onnx import trace
from .verify import CALIBRATION_TEXTS, SAMPLE_TEXTS, TEXT_BATCHES, VALUE_NORMS_BAR, LengthCaps, Tolerance

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
AnyReranker = Reranker | LLMReranker  # a cross-encoder, or an LLM reranker (export/llm_reranker.py)
# Largest error of the raw logits allowed against PyTorch, per precision, relative to the largest logit checked
# (at least 1, so that for logits within +-1 it is absolute): rounding grows with the logits' scale. Measured on
# the tests' cross-encoder (logits up to about 8.5): fp32 5.5e-5 absolute, 6.5e-6 relative; fp16 0.09 absolute,
# 0.011 relative (fp16 keeps about three significant digits), 0.0215 once the embeddings' sum and LayerNorm were
# fused into one node in fp16 too (SkipLayerNormalization, export/optimize.py). That test model's weights are drawn
# 25x wider than transformers' initialisation, which the fp16 rounding error grows with.
# int8: on the real text pairs only (random token ids are no text), the largest error of the scores a user gets and
# the order of the pairs (export/reranker_int8.py), as the embedders' int8 is held to the cosine on texts.
SCORE_TOLERANCE: dict[str, tuple[Tolerance, ...]] = {
    "fp32": (Tolerance("max_rel_scores", 1e-4, higher_is_better=False),),
    "fp16": (Tolerance("max_rel_scores", 3e-2, higher_is_better=False),),
    "int8": (Tolerance("mean_score_error_texts", INT8_MEAN_SCORE_ERROR, higher_is_better=False),
             Tolerance("spearman_texts", INT8_MIN_SPEARMAN, higher_is_better=True)),
}
TEXT_PAIRS = 256


def graph_inputs(module: AnyReranker) -> tuple[str, ...]:
    """The graph's inputs: token types only for families that have them (the tokenizer's types of the others, all
    zeros or ignored by transformers, are not fed)."""
    return INPUTS if module.encoder.config.has_token_types else INPUTS[:2]


def export_reranker_graph(module: AnyReranker, path: Path, data: Path | None = None,
                          shared: SharedWeights | None = None) -> None:
    """The graph at path, its weights in `data` (default: data_file(path)) but for those `shared` stores
    (export/torch_to_onnx.py trace())."""
    outputs = ["scores"] + (["attentions", "value_norms"] if module.output_attentions else [])
    inputs = graph_inputs(module)
    axes = {name: {0: "batch", 1: "sequence"} for name in inputs}
    axes |= {"scores": {0: "batch"}, "attentions": {1: "batch", 3: "sequence", 4: "sequence"},
             "value_norms": {1: "batch", 3: "sequence"}}
    ids = torch.full((2, 8), made_up_token_ids(module.encoder.config.vocab_size)[0], dtype=torch.int64,
                     device=next(module.parameters()).device)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    types = torch.zeros_like(ids)
    types[:, 3:] = 1  # a live token-type path in the trace
    args = (ids, mask, types)[: len(inputs)]
    trace(module, args, inputs, outputs, {k: v for k, v in axes.items() if k in inputs or k in outputs}, path, data,
          shared)


class PairReference:
    """A reranker's check inputs and PyTorch's scores on them, computed once for every variant.

    Random pairs over the caps' grid (export/verify.py LengthCaps: rows of random lengths, right-padded, and a random
    split into segment a of type 0 and b of type 1 where the graph takes token types), and real text pairs as the
    server tokenizes them (encode: the tokenizer's pairs, or a template's). PyTorch's attention maps are computed as
    an attention graph's turn comes, in runs of rows of bounded size, and dropped at once; the scores in runs whose
    scores take at most SCORES_BYTES. Verification's memory is then bounded by the model's layers and heads, not by
    its max_seq_length (bge-reranker-v2-m3's 8,192, Qwen3-Reranker's 32,768)."""

    def __init__(self, reranker: AnyReranker | None, tokenizer: TextTokenizer,
                 encode: Callable[[list[tuple[str, str]]], list[TokenizedInput]], activation: str, seed: int = 0):
        self.reranker, self.activation = reranker, activation
        self.cases: list[tuple[dict[str, np.ndarray], np.ndarray]] = []  # (feed, PyTorch's scores (B, labels))
        self.calibration: list[dict[str, np.ndarray]] = []  # int8's calibration pairs, as the server feeds them
        if reranker is None:  # load(): the cases and scores come from the file
            return
        rng = np.random.default_rng(seed)
        cfg = reranker.encoder.config
        ids_from = made_up_token_ids(cfg.vocab_size)
        self.inputs = graph_inputs(reranker)
        self.caps = LengthCaps.of(cfg.num_layers, cfg.num_heads, tokenizer.max_seq_length)
        for batch, seq in self.caps.grid():
            lengths = rng.integers(1, seq + 1, size=batch)
            lengths[rng.integers(batch)] = seq
            ids, mask = pad([rng.integers(ids_from.start, ids_from.stop, size=n) for n in lengths])
            types = pad_types([(np.arange(n) >= rng.integers(0, n + 1)).astype(np.int64) for n in lengths],
                              ids.shape[1])
            feed = self._feed(ids, mask, types)
            self.cases.append((feed, self.scores(feed)))
        self.random_cases = len(self.cases)  # the cases after these are the text pairs'
        texts = [t for t in SAMPLE_TEXTS.read_text(encoding="utf-8").splitlines() if t.strip()]
        verified = texts[: 2 * TEXT_PAIRS]
        pairs = encode(list(zip(verified[0::2], verified[1::2], strict=False)))
        self.pairs_checked = len(pairs)
        for feed in self.pair_feeds(pairs):
            self.cases.append((feed, self.scores(feed)))
        # int8's calibration pairs: the texts after the verified ones, as the embedders' (export/verify.py).
        calibration = texts[2 * TEXT_PAIRS: 2 * TEXT_PAIRS + 2 * CALIBRATION_TEXTS]
        self.calibration = self.pair_feeds(encode(list(zip(calibration[0::2], calibration[1::2], strict=False))))

    def save(self, path: Path) -> None:
        """The cases, PyTorch's scores and the calibration pairs, in one .npz file (export/verify.py Reference's
        role for rerankers: later graphs are verified against it without PyTorch)."""
        arrays: dict[str, Any] = {
            "caps": np.array([self.caps.num_layers, self.caps.num_heads, self.caps.verified_max_length,
                              self.caps.attention_max_length], dtype=np.int64),
            "inputs": np.array(self.inputs), "counts": np.array([self.random_cases, self.pairs_checked])}
        for i, (feed, scores) in enumerate(self.cases):
            arrays |= {f"case/{i}/{name}": x for name, x in feed.items()} | {f"case/{i}/scores": scores}
        for i, feed in enumerate(self.calibration):
            arrays |= {f"calibration/{i}/{name}": x for name, x in feed.items()}
        with open(path, "wb") as f:
            np.savez(f, **arrays)

    @classmethod
    def load(cls, path: Path, activation: str, reranker: AnyReranker | None = None) -> PairReference:
        """A reference save() wrote; with the reranker where the build needs PyTorch (the attention maps)."""
        stored = cls(None, None, None, activation)  # type: ignore[arg-type]
        with np.load(path) as saved:
            layers, heads, verified, attention = (int(x) for x in saved["caps"])
            stored.caps = LengthCaps(layers, heads, verified, attention)
            stored.inputs = tuple(str(x) for x in saved["inputs"])
            stored.random_cases, stored.pairs_checked = (int(x) for x in saved["counts"])
            for group, out in (("case", stored.cases), ("calibration", stored.calibration)):
                keys = [k.split("/") for k in saved.files if k.startswith(f"{group}/")]
                for i in range(len({k[1] for k in keys})):
                    feed = {name: saved[f"{group}/{i}/{name}"] for name in stored.inputs}
                    out.append((feed, saved[f"{group}/{i}/scores"]) if group == "case" else feed)  # type: ignore
        stored.reranker = reranker
        return stored

    def _feed(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> dict[str, np.ndarray]:
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return {name: feed[name] for name in self.inputs}

    def pair_feeds(self, pairs: list[TokenizedInput]) -> list[dict[str, np.ndarray]]:
        """Tokenized pairs in engine-style batches, in order."""
        feeds = []
        for start in range(0, len(pairs), TEXT_BATCHES[1] // 2):
            chunk = pairs[start:start + TEXT_BATCHES[1] // 2]
            ids, mask = pad([x.ids for x in chunk])
            feeds.append(self._feed(ids, mask, pad_types([x.type_ids for x in chunk], ids.shape[1])))
        return feeds

    def runs(self, feed: dict[str, np.ndarray], attentions: bool) -> list[dict[str, np.ndarray]]:
        """feed's rows in runs of bounded memory: by attention maps' size, or by one layer's scores'."""
        rows, seq = feed["input_ids"].shape
        runs = (self.caps.attention_runs if attentions else self.caps.score_runs)(rows, seq)
        return [{name: x[run] for name, x in feed.items()} for run in runs]

    def scores(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        """PyTorch's raw logits (B, labels)."""
        assert self.reranker is not None, "PyTorch's scores need the model"
        with torch.no_grad():
            return np.concatenate([self.reranker(*self._tensors(part)).float().cpu().numpy()
                                   for part in self.runs(feed, attentions=False)])

    def _tensors(self, feed: dict[str, np.ndarray]) -> list[torch.Tensor]:
        """The feed's inputs as tensors where the model is (a GPU's, for a CUDA run)."""
        device = next(self.reranker.parameters()).device  # type: ignore[union-attr]
        return [torch.from_numpy(feed[name]).to(device) for name in self.inputs]

    def attentions(self, feed: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """PyTorch's attention maps (L, B, nh, T, T) and value norms (L, B, nh, T) for a run of rows
        (runs(feed, attentions=True))."""
        if self.reranker is None:
            raise ValueError("the attention maps' verification needs the model in PyTorch; this reference is stored")
        with torch.no_grad():
            _, maps, norms = self.reranker.with_attentions()(*self._tensors(feed))
        return maps.float().cpu().numpy(), norms.float().cpu().numpy()


def measure(path: Path, reference: PairReference, provider: str = CPU,
            disabled_optimizers: tuple[str, ...] = ()) -> dict[str, float]:
    """Every parity metric of one graph. A graph with attention maps runs the random cases up to the caps'
    attention_max_length, its maps compared run by run; every graph runs the text pairs."""
    with small_heaps():  # the session's runs without an arena (memory.py)
        return _measure(path, reference, provider, disabled_optimizers)


def _measure(path: Path, reference: PairReference, provider: str, disabled_optimizers: tuple[str, ...]
             ) -> dict[str, float]:
    # An arena emptied after each run, and no prepacked second copy of the weights (export/verify.py).
    session = open_session(path, provider, arena="per_run", disabled_optimizers=disabled_optimizers, prepack=False,
                           spin=CHECK_SPIN)
    names = [o.name for o in session.get_outputs()]
    wants_attention, wants_norms = "attentions" in names, "value_norms" in names
    max_scores = max_attention = max_padded_key_weight = max_norms = 0.0
    largest, shapes = 1.0, 0
    text_scores, text_want = [], []
    for i, (feed, scores) in enumerate(reference.cases):
        maps = wants_attention and i < reference.random_cases
        if maps and feed["input_ids"].shape[1] > reference.caps.attention_max_length:
            continue
        got = []
        for part in reference.runs(feed, attentions=maps):
            outputs = session.run((["scores", "attentions"] + (["value_norms"] if wants_norms else [])) if maps
                                  else ["scores"], part)
            got.append(outputs[0])
            if maps:
                want_maps, want_norms = reference.attentions(part)
                error, padded = attention_errors(part["attention_mask"], outputs[1], want_maps)
                max_attention, max_padded_key_weight = max(max_attention, error), max(max_padded_key_weight, padded)
                if wants_norms:
                    max_norms = max(max_norms, value_norms_error(part["attention_mask"], outputs[2], want_norms))
            del outputs
        got_scores = np.concatenate(got)
        max_scores = max(max_scores, float(np.abs(got_scores - scores).max()))
        largest = max(largest, float(np.abs(scores).max()))
        if i >= reference.random_cases:
            text_scores.append(got_scores)
            text_want.append(scores)
        else:
            shapes += 1
    agreement = score_agreement(np.concatenate(text_scores), np.concatenate(text_want), reference.activation)
    metrics = {"max_abs_scores": max_scores, "max_rel_scores": max_scores / largest,
               "max_score_error_texts": agreement["max_score_error"],
               "mean_score_error_texts": agreement["mean_score_error"], "spearman_texts": agreement["spearman"],
               "shapes_checked": shapes, "pairs_checked": reference.pairs_checked}
    if wants_attention:
        metrics |= {"max_abs_attentions": max_attention, "max_padded_key_weight": max_padded_key_weight}
    if wants_norms:
        metrics["max_rel_value_norms"] = max_norms
    return metrics


def describe(precision: str, metrics: dict[str, float]) -> str:
    return ", ".join(t.describe(metrics[t.metric]) for t in SCORE_TOLERANCE[precision])


def attention_errors(attention_mask: np.ndarray, got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """attention_mask (B, T); got, want (L, B, nh, T, T): the largest error between real queries and real keys, and
    the largest weight a padded key got."""
    real = attention_mask.astype(bool)
    keys, queries = real[None, :, None, None, :], real[None, :, None, :, None]
    error = float(np.abs(got - want)[np.broadcast_to(keys & queries, got.shape)].max())
    return error, float(np.where(keys, 0.0, got).max())


def value_norms_error(attention_mask: np.ndarray, got: np.ndarray, want: np.ndarray) -> float:
    """attention_mask (B, T); got, want (L, B, nh, T): the largest error over the real tokens, relative to the
    largest norm (export/verify.py VALUE_NORMS_BAR)."""
    keys = attention_mask.astype(bool)[None, :, None, :]
    return float(np.where(keys, np.abs(got - want), 0.0).max()) / max(float(np.abs(want).max()), 1e-12)


def verify_reranker(path: Path, precision: str, reference: PairReference,
                    disabled_optimizers: tuple[str, ...] = ()) -> dict[str, float]:
    return check_parity(path, precision, measure(path, reference, disabled_optimizers=disabled_optimizers))


def check_parity(path: Path, precision: str, metrics: dict[str, float]) -> dict[str, float]:
    """metrics, if they meet precision's score tolerances and no padded key got weight; else the one-line
    refusal naming what does not hold."""
    failed = [t for t in SCORE_TOLERANCE[precision] if not t.holds(metrics[t.metric])]
    norms = metrics.get("max_rel_value_norms")
    if norms is not None and not norms <= VALUE_NORMS_BAR:
        raise ExportVerificationError(f"{path.name} ({precision}) fails parity with PyTorch: its value norms are "
                                      f"{norms:g} of the largest off, over {VALUE_NORMS_BAR:g}")
    if failed or metrics.get("max_padded_key_weight", 0.0) != 0:
        raise ExportVerificationError(
            f"{path.name} ({precision}) fails parity with PyTorch: "
            + "; ".join(f"{t.describe(metrics[t.metric])} does not hold" for t in failed)
            + (f"; padded keys got weight {metrics['max_padded_key_weight']:g}"
               if metrics.get("max_padded_key_weight") else ""))
    return metrics


def load_module(ckpt: Checkpoint, encoder: EncoderModule, tokenizer: TextTokenizer, log: Callable[[str], None]
                ) -> tuple[AnyReranker, Callable[[list[tuple[str, str]]], list[TokenizedInput]]]:
    """The reranker module over the loaded encoder (a cross-encoder, or an LLM reranker: a templated one,
    export/llm_reranker.py), and how its pairs are tokenized."""
    assert ckpt.score_activation is not None, "read_checkpoint reads a reranker's activation"
    if ckpt.pair_template is not None:
        from .llm_reranker import load_templated_reranker

        return load_templated_reranker(ckpt, encoder, tokenizer, log)
    assert ckpt.head is not None, "read_checkpoint reads a cross-encoder's head"
    log(f"reranker: {ckpt.head.architecture} over {ckpt.num_labels} label(s), activation {ckpt.score_activation}")
    return load_reranker(ckpt.weights, encoder, ckpt.head, ckpt.num_labels), tokenizer.encode_pairs
