"""Scores -> their replies: a reranker's ranking (or a ColBERT model's MaxSim), a classifier's labels, the cosine
similarity of sentences; assembled here for every door."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .multi_vector import MultiVectorTokenizer, maxsim
from .outputs import EncodeReply
from .rows import RowOutput
from .tokenizer import TokenizedInput

# A reranker's CrossEncoder activations (model/cross_encoder.py names them in the manifest), on (N,) float32 logits.
SCORE_ACTIVATIONS = {
    "sigmoid": lambda logits: 1.0 / (1.0 + np.exp(-logits)),
    "identity": lambda logits: logits,
}


class Scored(Protocol):
    """A scored request, prepared (server/score_requests.py PreparedPredict): its inputs and what it asks."""

    @property
    def inputs(self) -> list[TokenizedInput]: ...

    @property
    def raw_scores(self) -> bool: ...

    @property
    def tokens(self) -> int: ...


class Ranked(Scored, Protocol):
    """A rerank request, prepared (server/score_requests.py PreparedRerank)."""

    @property
    def texts(self) -> Sequence[str]: ...

    @property
    def return_text(self) -> bool: ...

    @property
    def top_n(self) -> int: ...


@dataclass
class RerankResult:
    index: int  # the text's position in the request
    score: float
    text: str | None  # the text, when the request asked for it


@dataclass
class RerankReply:
    results: list[RerankResult]  # best first: sorted by score descending (ties in request order), top_n of them
    tokens: int  # all pairs' tokens: what the request cost
    model: str  # the name of the model that answered


def build_rerank_reply(rows: Sequence[RowOutput], prepared: Ranked, activation: str | None, model: str
                       ) -> RerankReply:
    logits = np.array([row.scores[0] for row in rows if row.scores is not None], dtype=np.float32)  # (N,)
    scores = logits if prepared.raw_scores else SCORE_ACTIVATIONS[activation or "identity"](logits)
    order = np.argsort(-scores, kind="stable")[: prepared.top_n]
    return RerankReply([RerankResult(int(i), float(scores[i]), prepared.texts[i] if prepared.return_text else None)
                        for i in order], prepared.tokens, model)


def build_multi_vector_rerank_reply(rows: Sequence[RowOutput], prepared: Ranked,
                                    multi_vector: MultiVectorTokenizer, model: str) -> RerankReply:
    """A ColBERT model's rows, the query's first (prepare_multi_vector_rerank), ranked by MaxSim (or MeanMaxSim)."""
    vectors = [row.token_embeddings[multi_vector.kept(item.ids, kind)]  # (K_i, d)
               for row, item, kind in zip(rows, prepared.inputs, ["query"] + ["document"] * (len(rows) - 1),
                                          strict=True) if row.token_embeddings is not None]
    assert len(vectors) == len(rows), "a ColBERT model's rows have vectors"
    scores = maxsim(vectors[0], vectors[1:], multi_vector.settings.similarity)  # (N,)
    order = np.argsort(-scores, kind="stable")[: prepared.top_n]
    return RerankReply([RerankResult(int(i), float(scores[i]), prepared.texts[i] if prepared.return_text else None)
                        for i in order], prepared.tokens, model)


@dataclass
class SimilarityReply:
    scores: np.ndarray  # (N,) float32: the cosine of each sentence with the source sentence, in request order
    tokens: int  # the source's and the sentences' tokens: what the request cost
    model: str


def build_similarity_reply(reply: EncodeReply) -> SimilarityReply:
    """The encode reply of [source, *sentences] (normalised: SimilarityRequest.to_encode) -> their cosines."""
    embeddings = reply.embeddings  # (1 + N, D), unit length
    return SimilarityReply(embeddings[1:] @ embeddings[0], reply.tokens, reply.model)  # (N,)


@dataclass
class PredictReply:
    predictions: list[list[tuple[str, float]]]  # per input, in request order: every (label, score), best first
    tokens: int
    model: str


def classifier_scores(logits: np.ndarray, problem_type: str | None) -> np.ndarray:
    """(N, labels) logits -> scores as transformers' text-classification pipeline gives them: a sigmoid for one
    label or multi-label classification, else a softmax over the labels."""
    if problem_type == "multi_label_classification" or logits.shape[1] == 1:
        return 1.0 / (1.0 + np.exp(-logits))
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def build_predict_reply(rows: Sequence[RowOutput], prepared: Scored, labels: Sequence[str],
                        problem_type: str | None, model: str) -> PredictReply:
    logits = np.stack([row.scores for row in rows if row.scores is not None]).astype(np.float32)  # (N, labels)
    scores = logits if prepared.raw_scores else classifier_scores(logits, problem_type)
    predictions = []
    for row in scores:
        order = np.argsort(-row, kind="stable")  # best first; ties in label order
        predictions.append([(labels[i], float(row[i])) for i in order])
    return PredictReply(predictions, prepared.tokens, model)
