"""A ColBERT model's inputs and vectors, as sentence-transformers 6.2's MultiVectorEncoder makes them (model/colbert.py
has the graph's side).

- An input is a query or a document (encode_query / encode_document): the checkpoint's "query" or "document"
  prompt goes before its text ("[Q] ", "[D] "), and it is truncated at the query's or the document's length.
  A PyLate model's (model/pylate_colbert.py) instead has its text stripped, truncated one token short, and its
  marker token inserted after the first token ([CLS] [Q] ...), as PyLate's ColBERT.tokenize does.
- Query expansion: a query shorter than the expansion's length is filled up to it with the expansion token
  ([MASK]), which the encoder does not attend to unless `attend`; those positions score all the same.
- The vectors kept are the input's tokens (its expansion included), less MultiVectorMask's skip-list tokens
  (punctuation) for the input types the checkpoint lists (documents).
- MaxSim: for each of the query's vectors, its largest dot product with the document's vectors, summed (and
  divided by the query's vector count for "meanmaxsim").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .manifest import Manifest
from .tokenizer import TextTokenizer, TokenizedInput, check_texts

INPUT_TYPES = ("query", "document")


@dataclass(frozen=True)
class MultiVectorSettings:
    dimension: int
    query_length: int
    document_length: int
    expansion: dict | None  # {"strategy", "attend", "token_id", "length"}
    skiplist_ids: np.ndarray  # (S,) int64
    skiplist_tasks: tuple[str, ...]
    similarity: str  # "maxsim" or "meanmaxsim"
    markers: dict[str, int | None]  # each input type's marker id, inserted after the first token; None: none
    strip: bool  # texts stripped of surrounding whitespace first

    @classmethod
    def of(cls, manifest: Manifest) -> MultiVectorSettings:
        raw = manifest.multi_vector
        assert raw is not None, f"{manifest.model} is not a multi-vector model"
        return cls(int(raw["dimension"]), int(raw["query_length"]), int(raw["document_length"]), raw["expansion"],
                   np.asarray(raw["skiplist_ids"], dtype=np.int64), tuple(raw["skiplist_tasks"]),
                   str(raw["similarity"]), {kind: (raw.get("markers") or {}).get(kind) for kind in INPUT_TYPES},
                   bool(raw.get("strip", False)))


class MultiVectorTokenizer:
    """Texts -> a ColBERT model's inputs for one input type; which of each input's vectors it keeps."""

    def __init__(self, manifest: Manifest, path: Path):
        self.settings = settings = MultiVectorSettings.of(manifest)
        self.prompts = {kind: manifest.prompts.get(kind, "") for kind in INPUT_TYPES}
        # A marker takes one of the input's positions: the tokenizer leaves it room.
        lengths = {"query": settings.query_length, "document": settings.document_length}
        self._tokenizers = {kind: TextTokenizer(path, lengths[kind] - (settings.markers[kind] is not None),
                                                manifest.vocab_size) for kind in INPUT_TYPES}
        for kind in INPUT_TYPES:
            if settings.markers[kind] is not None:  # a refusal of a too long input names the length, marker included
                self._tokenizers[kind].limit = f"{kind}_length {lengths[kind]}"

    def tokenizer(self, input_type: str) -> TextTokenizer:
        return self._tokenizers[input_type]

    def encode(self, texts: Sequence[str], input_type: str, truncate: bool = True,
               labels: Sequence[str] | None = None) -> list[TokenizedInput]:
        """Each text with its type's prompt before it, truncated at its type's length, a query expanded."""
        prompt = self.prompts[input_type]
        labels = labels or [f"input {i}" for i in range(len(texts))]
        check_texts(texts, labels)  # before the prompt is joined: a non-string is named as the caller gave it
        texts = [prompt + t for t in texts]
        if self.settings.strip:
            texts = [t.strip() for t in texts]
        inputs = self._tokenizers[input_type].encode_texts(texts, truncate, labels)
        marker = self.settings.markers[input_type]
        if marker is not None:
            inputs = [self._marked(x, marker) for x in inputs]
        expansion = self.settings.expansion
        if input_type != "query" or expansion is None:
            return inputs
        return [self._expanded(x, expansion) for x in inputs]

    @staticmethod
    def _marked(x: TokenizedInput, marker: int) -> TokenizedInput:
        """(T,) -> (T + 1,): the marker after the first token, of token type 0 (PyLate's insert_prefix_token)."""
        ids = np.concatenate([x.ids[:1], np.array([marker], dtype=np.int64), x.ids[1:]])
        types = None if x.type_ids is None else np.concatenate([x.type_ids[:1], np.zeros(1, np.int64), x.type_ids[1:]])
        return replace(x, ids=ids, type_ids=types)

    @staticmethod
    def _expanded(x: TokenizedInput, expansion: dict) -> TokenizedInput:
        """(T,) -> (max(T, length),): the expansion token after the query's tokens, attended to only if `attend`."""
        missing = expansion["length"] - len(x.ids)
        if missing <= 0:
            return x
        ids = np.concatenate([x.ids, np.full(missing, expansion["token_id"], dtype=np.int64)])
        return replace(x, ids=ids, attended=None if expansion["attend"] else len(x.ids))

    def kept(self, ids: np.ndarray, input_type: str) -> np.ndarray:
        """(T,) ids -> (T,) bool: the tokens whose vectors the input keeps (MultiVectorMask's)."""
        if input_type in self.settings.skiplist_tasks and len(self.settings.skiplist_ids):
            return ~np.isin(ids, self.settings.skiplist_ids)
        return np.ones(len(ids), dtype=bool)


# What sentence-transformers' maxsim gives a document without a single vector (every token skip-listed): below
# every real document.
EMPTY_DOCUMENT_SCORE = -1e9


def maxsim(query: np.ndarray, documents: Sequence[np.ndarray], similarity: str) -> np.ndarray:
    """(Q, d) query vectors, each document's (T_i, d) -> (N,) float32 scores, as sentence-transformers' maxsim
    (or mean_maxsim) scores them."""
    scores = np.zeros(len(documents), dtype=np.float32)
    for i, doc in enumerate(documents):
        if not len(doc):
            scores[i] = EMPTY_DOCUMENT_SCORE
        elif len(query):
            scores[i] = (query @ doc.T).max(axis=1).sum(dtype=np.float32)  # (Q, T_i) -> (Q,) -> ()
    if similarity == "meanmaxsim" and len(query):
        scores /= np.float32(len(query))
    return scores
