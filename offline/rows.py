"""Records -> output rows: the one function that local, Ray and server-backed encoding all go through."""

from __future__ import annotations

import json

import pyarrow as pa

from attnserve.engine.engine import EncodeStats, Engine

from .readers import Record


def output_schema(id_type: type, hidden_size: int, metadata: dict) -> pa.Schema:
    return pa.schema(
        [
            pa.field("id", pa.int64() if id_type is int else pa.string(), nullable=False),
            pa.field("embedding", pa.list_(pa.float32(), hidden_size), nullable=False),
            pa.field("num_tokens", pa.int32(), nullable=False),
            pa.field("truncated", pa.bool_(), nullable=False),
        ],
        metadata={"attnserve": json.dumps(metadata)},
    )


def tokenize(engine: Engine, source_label: str, records: list[Record]):
    """Text and token-id rows through their own paths, back in row order; errors name the file and line."""
    labels = [f"{source_label}: {r.where}" for r in records]
    if all(r.text is not None for r in records):
        return engine.tokenizer.encode_texts([r.text for r in records], labels=labels)
    by_row = {}
    for kind in ("text", "token_ids"):
        idx = [i for i, r in enumerate(records) if getattr(r, kind) is not None]
        if not idx:
            continue
        encode = engine.tokenizer.encode_texts if kind == "text" else engine.tokenizer.encode_ids
        for i, tokenized in zip(idx, encode([getattr(records[i], kind) for i in idx], labels=[labels[i] for i in idx])):
            by_row[i] = tokenized
    return [by_row[i] for i in range(len(records))]


def encode_records(engine: Engine, source_label: str, records: list[Record], normalize: bool, schema: pa.Schema
                   ) -> tuple[pa.Table, EncodeStats]:
    """One chunk of records -> its output rows, in record order. Same chunk in, same bytes out."""
    encoded = engine.encode_tokenized(tokenize(engine, source_label, records), normalize=normalize)
    table = pa.Table.from_arrays(
        [pa.array([r.id for r in records], type=schema.field("id").type),
         pa.FixedSizeListArray.from_arrays(encoded.embeddings.reshape(-1), engine.manifest.hidden_size),
         pa.array(encoded.num_tokens), pa.array(encoded.truncated)],
        schema=schema)
    return table, encoded.stats
