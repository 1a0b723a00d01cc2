"""Rows from the batcher -> a serialized EmbedResponse (built off the event loop)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attnserve.engine.pooling import l2_normalize, pool
from attnserve.engine.tokenizer import TextTokenizer, TokenizedInput
from attnserve.v1 import encoder_pb2 as pb

from .batcher import RowOutput
from .requests import ReplyOptions


def tensor(array: np.ndarray) -> pb.Tensor:
    """Row-major little-endian float32, as numpy's tobytes() gives it."""
    a = np.ascontiguousarray(array, dtype="<f4")
    return pb.Tensor(shape=a.shape, dtype=pb.FLOAT32, data=a.tobytes())


def embedding(row: RowOutput, item: TokenizedInput, options: ReplyOptions, tokenizer: TextTokenizer
              ) -> pb.Embedding:
    if options.pooling is None:
        sentence = row.sentence_embedding  # (H,) pooled in the graph, the model's own way
    else:  # the row's padding is cut off already: all T tokens are real
        T = len(row.token_embeddings)
        sentence = pool(row.token_embeddings[None], np.array([T]), options.pooling)[0]  # (1, T, H) -> (H,)
    if options.normalize:
        sentence = l2_normalize(sentence)
    out = pb.Embedding(sentence_embedding=tensor(sentence), num_tokens=len(item), truncated=item.truncated)
    if options.token_embeddings:
        out.token_embeddings.CopyFrom(tensor(row.token_embeddings))
    if options.attention:
        maps = row.attentions[list(options.attention_layers)]  # (layers, nh, T, T)
        if options.average_heads:
            maps = maps.mean(axis=1, keepdims=True)  # (layers, 1, T, T)
        out.attentions.CopyFrom(tensor(maps))
    if options.tokens:
        out.tokens.extend(tokenizer.tokens(item.ids))
    return out


def serialize_reply(rows: Sequence[RowOutput], inputs: Sequence[TokenizedInput], options: ReplyOptions,
                    tokenizer: TextTokenizer, model: str) -> bytes:
    reply = pb.EmbedResponse(model=model)
    reply.embeddings.extend(embedding(r, x, options, tokenizer) for r, x in zip(rows, inputs, strict=True))
    return reply.SerializeToString()
