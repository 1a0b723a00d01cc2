"""Parity of every exported graph against the PyTorch encoder; used at export time and in tests.

Each variant is run at batch sizes 1..17 and sequence lengths 1..max_seq_length
(rows of random lengths, so padding is exercised) and on real texts, and
compared with the PyTorch encoder on the same inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from attnserve.engine.batching import pad, plan_batches
from attnserve.engine.session import CPU, open_session
from attnserve.engine.tokenizer import TextTokenizer
from attnserve.errors import ExportVerificationError
from attnserve.model.encoder import Encoder
from attnserve.model.head import SentenceHead
from attnserve.model.modernbert import ModernBertEncoder

from .token_ids import made_up_token_ids

SAMPLE_TEXTS = Path(__file__).parent / "data" / "sample_texts.txt"
BATCH_SIZES = (1, 2, 5, 17)


@dataclass(frozen=True)
class Tolerance:
    metric: str
    limit: float
    higher_is_better: bool

    def holds(self, value: float) -> bool:
        return value >= self.limit if self.higher_is_better else value <= self.limit

    def describe(self, value: float) -> str:
        return f"{self.metric} {value:.3g} {'>=' if self.higher_is_better else '<='} {self.limit:g}"


TOLERANCES = {
    "fp32": Tolerance("max_abs_last_hidden_state", 1e-4, higher_is_better=False),
    "fp16": Tolerance("min_cosine_sentence_embedding", 0.999, higher_is_better=True),
    "int8": Tolerance("mean_cosine_sentence_embedding_texts", 0.99, higher_is_better=True),
}


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-12)


def shape_grid(max_seq_length: int) -> list[tuple[int, int]]:
    seqs = sorted({1, 2, 13, 64, max_seq_length} & set(range(1, max_seq_length + 1)))
    return [(b, t) for b in BATCH_SIZES for t in seqs]


class Reference:
    """PyTorch outputs on the check inputs, computed once and shared by every variant."""

    def __init__(self, encoder: Encoder | ModernBertEncoder, head: SentenceHead, embedding_size: int,
                 tokenizer: TextTokenizer, n_texts: int = 512, seed: int = 0):
        rng = np.random.default_rng(seed)
        ids_from = made_up_token_ids(encoder.config.vocab_size)
        self.head = head
        self.cases = []  # (ids, mask, hidden, sentence, attentions)
        for batch, seq in shape_grid(tokenizer.max_seq_length):
            lengths = rng.integers(1, seq + 1, size=batch)
            lengths[rng.integers(batch)] = seq  # the batch really is `seq` long
            ids, mask = pad([rng.integers(ids_from.start, ids_from.stop, size=n) for n in lengths])
            self.cases.append((ids, mask, *self._torch(encoder, ids, mask, attentions=True)))
        texts = [t for t in SAMPLE_TEXTS.read_text(encoding="utf-8").splitlines() if t.strip()][:n_texts]
        self.text_inputs = tokenizer.encode_texts(texts)
        self.text_batches = plan_batches([len(x) for x in self.text_inputs], 4096, 64)
        self.text_sentences = np.empty((len(texts), embedding_size), dtype=np.float32)
        for rows in self.text_batches:
            ids, mask = pad([self.text_inputs[i].ids for i in rows])
            self.text_sentences[rows] = self._torch(encoder, ids, mask, attentions=False)[1]

    def _torch(self, encoder: Encoder | ModernBertEncoder, ids: np.ndarray, mask: np.ndarray, attentions: bool):
        with torch.no_grad():
            m = torch.from_numpy(mask)
            hidden, att = encoder(torch.from_numpy(ids), m, output_attentions=attentions)
            sentence = self.head(hidden, m)
        return hidden.numpy(), sentence.numpy(), (att.numpy() if attentions else None)


def measure(path: Path, precision: str, reference: Reference, provider: str = CPU) -> dict[str, float]:
    """Every parity metric of one graph, as floats for the manifest."""
    session = open_session(path, provider)
    wants_attention = "attentions" in [o.name for o in session.get_outputs()]
    max_hidden = max_sentence = max_attention = max_padded_key_weight = 0.0
    min_cos = 1.0
    for ids, mask, hidden, sentence, attentions in reference.cases:
        outputs = session.run(None, {"input_ids": ids, "attention_mask": mask})
        real = mask.astype(bool)  # (B, T): compare real token positions only
        max_hidden = max(max_hidden, float(np.abs(outputs[0] - hidden)[real].max()))
        max_sentence = max(max_sentence, float(np.abs(outputs[1] - sentence).max()))
        min_cos = min(min_cos, float(_cosine(outputs[1], sentence).min()))
        if wants_attention:
            got = outputs[2]  # (L, B, nh, T, T)
            keys = real[None, :, None, None, :]  # broadcast over layers, heads and queries
            queries = real[None, :, None, :, None]
            max_attention = max(max_attention, float(np.abs(got - attentions)[np.broadcast_to(
                keys & queries, got.shape)].max()))
            max_padded_key_weight = max(max_padded_key_weight, float(np.where(keys, 0.0, got).max()))
    text_cos = np.empty(len(reference.text_inputs), dtype=np.float32)
    for batch in reference.text_batches:
        ids, mask = pad([reference.text_inputs[i].ids for i in batch])
        got = session.run(["sentence_embedding"], {"input_ids": ids, "attention_mask": mask})[0]
        text_cos[batch] = _cosine(got, reference.text_sentences[batch])
    metrics = {
        "max_abs_last_hidden_state": max_hidden,
        "max_abs_sentence_embedding": max_sentence,
        "min_cosine_sentence_embedding": min_cos,
        "mean_cosine_sentence_embedding_texts": float(text_cos.mean()),
        "p1_cosine_sentence_embedding_texts": float(np.percentile(text_cos, 1)),
        "min_cosine_sentence_embedding_texts": float(text_cos.min()),
        "shapes_checked": len(reference.cases),
        "texts_checked": len(reference.text_inputs),
    }
    if wants_attention:
        metrics["max_abs_attentions"] = max_attention
        metrics["max_padded_key_weight"] = max_padded_key_weight
    return metrics


def verify(path: Path, precision: str, reference: Reference, provider: str = CPU) -> dict[str, float]:
    """measure(), then fail the export with a clear message if the variant's tolerance does not hold."""
    metrics = measure(path, precision, reference, provider)
    tolerance = TOLERANCES[precision]
    value = metrics[tolerance.metric]
    if not tolerance.holds(value) or ("max_padded_key_weight" in metrics and metrics["max_padded_key_weight"] != 0):
        raise ExportVerificationError(
            f"{path.name} ({precision}) fails parity with PyTorch: {tolerance.describe(value)} does not hold"
            + (f"; padded keys got weight {metrics['max_padded_key_weight']:g}"
               if metrics.get("max_padded_key_weight") else ""))
    return metrics
