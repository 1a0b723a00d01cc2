"""Many inputs through the engine in length-sorted batches, each batch's rows assembled into their outputs as a
server's reply is (engine/outputs.py build_reply): what offline encoding runs (Engine.encode_tokenized and its
siblings). Each batch is assembled as it runs, so what is held is the outputs asked, never a chunk's token states."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .encoded_inputs import EncodedInput
from .image_encoder import ImageInput
from .output_options import OutputHeads, OutputOptions
from .outputs import EncodeReply, build_reply, sentence_outputs, unwindowed
from .rows import BatchOutput, normalized_rows, row_of
from .tokenizer import TokenizedInput


@dataclass
class Assembled:
    """Every input's outputs, in input order."""

    # Each input's own outputs (sparse, multi-vector, ...); None where nothing but the sentence embeddings was asked
    # (OutputOptions.sentences_only), which are all in `typed`.
    inputs: list[EncodedInput] | None
    typed: dict[str, np.ndarray]  # each embedding type asked -> (N, D) (or (N, ceil(D / 8))): the sentence embeddings
    lengths: np.ndarray  # (N,) int64 tokens
    cells: int  # token cells computed, padding included
    seconds: float

    @property
    def each(self) -> list[EncodedInput]:
        """Each input's own outputs: there are some wherever the options asked more than sentence embeddings."""
        assert self.inputs is not None, "only sentence embeddings were asked"
        return self.inputs


def assemble_batches(run: Callable[[list[TokenizedInput]], BatchOutput], inputs: Sequence[TokenizedInput],
                     options: OutputOptions, heads: OutputHeads, plan: Callable[[np.ndarray], list[np.ndarray]],
                     on_batch: Callable[[int], None] | None = None) -> Assembled:
    """run: one batch through a session (with the token states where the options need them). plan: the inputs'
    lengths cut into batches (Engine.plan). on_batch(n) is called after each batch of n inputs ran: progress for
    callers that show it."""
    start = time.perf_counter()
    lengths = np.fromiter((len(x) for x in inputs), dtype=np.int64, count=len(inputs))
    # Sentence embeddings alone (most offline runs): each batch's (B, H) array cut, normalised and typed at once by
    # what build_reply makes them with, its rows never cut out (a static model's 20,000 texts: 0.1 s less).
    whole = options.sentences_only
    encoded: list[EncodedInput | None] = [None] * len(inputs)
    parts: dict[str, list[tuple[Sequence[int] | np.ndarray, np.ndarray]]] = {k: [] for k in options.embedding_types}
    cells = 0
    for batch in plan(lengths):
        items = [inputs[i] for i in batch]
        out = run(items)
        if whole:
            assert out.sentence_embedding is not None, "an embedder's batch has its sentence embeddings"
            typed = sentence_outputs(out.sentence_embedding, options)[1]
        else:
            reply = assemble_batch(out, items, options, heads)
            for r, i in enumerate(batch):
                encoded[i] = reply.inputs[r]
            typed = reply.typed
        for kind, rows in typed.items():
            parts[kind].append((batch, rows))
        cells += int(lengths[batch].max()) * len(batch)
        if on_batch is not None:
            on_batch(len(batch))
    typed = {kind: in_order(batches, len(inputs)) for kind, batches in parts.items()}
    return Assembled(None if whole else encoded, typed, lengths, cells,  # type: ignore[arg-type]
                     time.perf_counter() - start)


def assemble_batch(out: BatchOutput, items: Sequence[TokenizedInput | ImageInput], options: OutputOptions,
                   heads: OutputHeads) -> EncodeReply:
    """One batch's outputs: its rows as a server's batcher cuts them (engine/rows.py), normalised with their batch,
    assembled as a server's reply is."""
    normalized = normalized_rows(out)  # (B, D)
    rows = [row_of(out, r, len(x), True, normalized) for r, x in enumerate(items)]
    return build_reply(rows, unwindowed(items, options), heads)


def object_array(arrays: Sequence[object]) -> np.ndarray:
    """(N,) object array of per-input arrays: filled one by one, as numpy would make arrays of one shape one."""
    out = np.empty(len(arrays), dtype=object)
    for i, array in enumerate(arrays):
        out[i] = array
    return out


def in_order(batches: Sequence[tuple[Sequence[int] | np.ndarray, np.ndarray]], n: int) -> np.ndarray:
    """Each batch's (b, ...) rows at their inputs' positions: (n, ...); a position no batch holds is left unset."""
    if not batches:
        return np.zeros((n, 0), np.float32)
    first = batches[0][1]
    out = np.empty((n, *first.shape[1:]), dtype=first.dtype)
    for positions, rows in batches:
        out[positions] = rows
    return out
