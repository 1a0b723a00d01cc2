"""What the outputs of a run are assembled from, besides its rows (engine/rows.py): the options asked (a server's
request, or `attnserve encode`'s flags), the inputs as the batches ran them, and the model's output heads."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .bge_m3 import BgeM3Heads
from .image_encoder import ImageInput
from .late_chunking import TextChunks
from .multi_vector import MultiVectorTokenizer
from .tokenizer import TextTokenizer, TokenizedInput
from .windows import Windows


@dataclass(frozen=True)
class SparseOptions:
    top_k: int | None = None  # keep the k largest weights of each input (sentence-transformers' max_active_dims)
    return_tokens: bool = False  # name each index's vocabulary token, for inspection


@dataclass(frozen=True)
class OutputOptions:
    pooling: str | None  # None: the model's own, as the graph computes it
    normalize: bool
    dimensions: int | None  # None: all of them
    token_embeddings: bool
    attention_layers: tuple[int, ...] | None  # non-negative indices, in the order asked; None: no attention
    attention_heads: tuple[int, ...] | None = None  # non-negative indices, every head when none was asked
    every_head: bool = True  # attention_heads are all the model's heads in order: nothing to select
    average_heads: bool = False
    attention_analyses: tuple[str, ...] = ()  # attnserve/attention_analyses.py's, in ANALYSES order
    attention_weights: bool = True  # the chosen layers' and heads' weights; False: only the analyses
    # What was asked needs no map but the last layer's, and rollout: the last-layer graph answers it (engine.py
    # LAST_LAYER_VARIANT), at about the embeddings graph's cost.
    last_layer_only: bool = False
    # The chosen layers' reach, in attention_layers' order (manifest.attention_reach: [behind, ahead], None no bound):
    # which cells of a map are masked by the model's structure. None: unknown (older artifacts, an image tower's).
    attention_reach: tuple[tuple[int | None, int | None], ...] | None = None
    embedding_types: tuple[str, ...] = ("float",)  # the sentence embedding's types, in the order asked
    ranges: np.ndarray | None = None  # (2, D) int8 / uint8 ranges, where one of them was asked
    sparse: SparseOptions | None = None  # (index, value) pairs of a SPLADE model's weights, instead of its vector
    multi_vector: str | None = None  # a ColBERT model's vectors of inputs of this type, instead of its embedding
    dense: bool = True  # the sentence embedding is in the reply (not where sparse or multi_vector replace it)

    @property
    def attention(self) -> bool:
        return self.attention_layers is not None

    @property
    def tokens(self) -> bool:
        """Word pieces label token embeddings and attention maps; plain embeddings go without."""
        return self.token_embeddings or self.attention

    @property
    def sentences_only(self) -> bool:
        """Nothing is asked of an input but its sentence embedding as the graph pools it: a batch's outputs can be
        made from its (B, D) array at once, without cutting it into rows (engine/batch_outputs.py)."""
        return (self.pooling is None and not self.tokens and self.sparse is None and self.multi_vector is None
                and self.dense)


@dataclass(frozen=True)
class PreparedRequest:
    """A request to the engine, prepared: a server's (server/embed_requests.py prepare()), or a batch of an offline
    run's (Engine.encode_tokenized and its siblings)."""

    # What the batches run: an input, or each window of a windowed one, in order; an image as its ImageInput.
    inputs: list[TokenizedInput | ImageInput]
    options: OutputOptions
    # Per request input: its windows (--long-inputs chunk, late chunking), or None where it is inputs' one row.
    # None: no input is windowed (inputs are the request's, one each).
    windows: list[Windows | None] | None = None
    # Per request input, with late chunking: its chunks' character spans and their token ranges in the text.
    chunks: list[TextChunks] | None = None
    # The outputs need the rows' token states (the last hidden state), not only their sentence embeddings: token
    # embeddings, pooling at request time, attention, multi-vector or bge-m3's sparse output, late chunking.
    token_states: bool = True

    @property
    def tokens(self) -> int:
        return sum(len(x) for x in self.inputs)


@dataclass(frozen=True)
class OutputHeads:
    """A model's host-side output parts (Engine.heads, and a front-door worker's of `serve --workers`): its
    tokenizer, which names tokens; a ColBERT model's query and document inputs (engine/multi_vector.py), which say
    which vectors it keeps; bge-m3's sparse and ColBERT heads (engine/bge_m3.py), applied to the last hidden
    state. None where the model has none."""

    tokenizer: TextTokenizer
    multi_vector: MultiVectorTokenizer | None = None
    bge_m3: BgeM3Heads | None = None
