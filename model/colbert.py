"""ColBERT: multi-vector (late-interaction) embeddings, one small vector per token (sentence-transformers 6.2's
MultiVectorEncoder).

A MultiVectorEncoder's pipeline is Transformer -> Dense* over token_embeddings -> MultiVectorMask -> Normalize over
token_embeddings. The graph runs the first two and the normalisation, per token:

  v = normalize(Dense_k(... Dense_1(h)))        (B, T, H) -> (B, T, d)

and outputs v as its last_hidden_state: a ColBERT model's token embeddings are its vectors. Everything else is
the tokenizer's and the replies' (engine/multi_vector.py): the query and document markers (the checkpoint's
"query" and "document" prompts, put before the text as sentence-transformers does), the per-task lengths, query
expansion ([MASK] tokens the encoder does not attend to, which score nonetheless), and MultiVectorMask's skip-list
(punctuation left out of a document's vectors). The graph's sentence_embedding (the mean of a row's vectors) is
what its shape requires; no door serves it: a ColBERT model answers multi-vector requests and rerank (MaxSim).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from tokenizers import Tokenizer

from attnserve.errors import CheckpointError

from .dense import Dense

SIMILARITIES = ("maxsim", "meanmaxsim")
EXPANSION_STRATEGIES = ("fixed", "min")


@dataclass(frozen=True)
class Expansion:
    """sentence-transformers' QueryExpansionConfig: queries padded to `length` with `token` (None: the tokenizer's
    mask token), which the encoder attends to only if `attend`; "fixed" also truncates queries at `length`."""

    strategy: str
    attend: bool
    token: str | None
    length: int


@dataclass(frozen=True)
class MultiVector:
    dense: tuple[Dense, ...]  # over each token's hidden state, in order
    normalize: bool  # each token's vector L2-normalised last
    dimension: int  # d: the size of each vector
    query_length: int  # where a query is truncated (its prompt and special tokens included)
    document_length: int  # where a document is
    expansion: Expansion | None
    skiplist_words: tuple[str, ...]  # MultiVectorMask's: tokens left out of the vectors of skiplist_tasks
    skiplist_tasks: tuple[str, ...]  # "query" and / or "document" (an input without a task is a document)
    similarity: str  # one of SIMILARITIES: MaxSim, or MaxSim over the query's token count
    # PyLate's ways (model/pylate_colbert.py), where sentence-transformers 6.2 puts a prompt before the text:
    # the query's and the document's marker token (its query_prefix / document_prefix), inserted after the first
    # token (None: no marker), the length counting it.
    query_marker: str | None = None
    document_marker: str | None = None
    strip: bool = False  # each text stripped of surrounding whitespace first (sentence-transformers 5 did)
    # A skip-list word that is no token: dropped (MultiVectorMask), or the unknown token's id (PyLate resolves
    # its words with convert_tokens_to_ids, so that it skips unknown tokens then).
    skiplist_unknown_as_unk: bool = False

    def describe(self) -> str:
        return f"MultiVector({self.dimension}, {self.similarity})"


class TokenVectors(nn.Module):
    """The encoder, then the Dense layers and the normalisation on each token: the module export traces as the
    encoder of a ColBERT model. (B, T) ids -> ((B, T, d) vectors, attentions)."""

    def __init__(self, encoder: nn.Module, layers: list[nn.Module], output_size: int, normalize: bool):
        super().__init__()
        self.encoder, self.layers, self.normalize = encoder, nn.ModuleList(layers), normalize
        self.config = encoder.config  # the encoder's: export and verification read its layers, heads, vocabulary
        self.output_size = output_size  # d

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, output_attentions: bool = False,
                token_type_ids: torch.Tensor | None = None):
        hidden, attentions = self.encoder(input_ids, attention_mask, output_attentions, token_type_ids)  # (B, T, H)
        for layer in self.layers:
            hidden = layer(hidden)  # (B, T, out)
        if self.normalize:
            hidden = F.normalize(hidden, p=2.0, dim=-1)  # eps 1e-12, as sentence-transformers' Normalize
        return hidden, attentions  # (B, T, d)


def serving_settings(multi_vector: MultiVector, directory: Path, tokenizer: Tokenizer) -> dict:
    """The manifest's "multi_vector": what the engine needs to tokenize and cut as sentence-transformers does, with
    every token resolved to its id here, as sentence-transformers resolves it (convert_tokens_to_ids)."""
    # MultiVectorMask drops a skip-list word that is no single token of the vocabulary (with a warning); PyLate
    # gives it the unknown token's id.
    unk = _special_id(directory, tokenizer, "unk_token") if multi_vector.skiplist_unknown_as_unk else None
    ids = (tokenizer.token_to_id(w) for w in multi_vector.skiplist_words)
    skiplist = sorted({i for i in (unk if i is None else i for i in ids) if i is not None})
    markers = {kind: _marker_id(directory, tokenizer, kind, token) for kind, token in
               (("query", multi_vector.query_marker), ("document", multi_vector.document_marker))}
    expansion = None
    if multi_vector.expansion is not None:
        e = multi_vector.expansion
        if e.token is not None:
            token_id = tokenizer.token_to_id(e.token)
            if token_id is None:  # transformers gives the unknown token's id
                token_id = _special_id(directory, tokenizer, "unk_token")
        else:  # PyLate's order: the mask token, else the end-of-sequence token
            token_id = _special_id(directory, tokenizer, "mask_token")
            if token_id is None:
                token_id = _special_id(directory, tokenizer, "eos_token")
        if token_id is None:
            raise CheckpointError(f"{directory}: query_expansion names no token and the tokenizer has neither a mask "
                                  "nor an end-of-sequence token to expand queries with")
        expansion = {"strategy": e.strategy, "attend": e.attend, "token_id": token_id, "length": e.length}
    return {"dimension": multi_vector.dimension,
            "query_length": multi_vector.query_length, "document_length": multi_vector.document_length,
            "expansion": expansion, "skiplist_ids": skiplist, "skiplist_tasks": list(multi_vector.skiplist_tasks),
            "similarity": multi_vector.similarity, "markers": markers, "strip": multi_vector.strip}


def _marker_id(directory: Path, tokenizer: Tokenizer, kind: str, token: str | None) -> int | None:
    """A PyLate marker's id: a token of the tokenizer (its vocabulary or its added tokens), or refused: PyLate would
    add it to the tokenizer with a new, untrained row of the embeddings."""
    if token is None:
        return None
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise CheckpointError(f"{directory}: the {kind} marker {token!r} is no token of tokenizer.json (PyLate would "
                              "add it with an untrained embedding)")
    return token_id


def _special_id(directory: Path, tokenizer: Tokenizer, name: str) -> int | None:
    """tokenizer_config.json's special token `name` (a string or an AddedToken object), as an id; None if unset."""
    path = directory / "tokenizer_config.json"
    try:
        token = json.loads(path.read_text(encoding="utf-8")).get(name) if path.is_file() else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint file unreadable: {path}: {e}") from None
    if isinstance(token, dict):
        token = token.get("content")
    return tokenizer.token_to_id(token) if isinstance(token, str) else None
