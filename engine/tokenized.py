"""A text or pair as token ids, what the batcher queues and the engine runs: made by tokenizer.py and windows.py."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


# Not frozen: a frozen dataclass's __init__ sets each field through object.__setattr__ (0.74 us against 0.15), paid
# for every input of every request. Nothing mutates one: a changed input is a dataclasses.replace.
@dataclass(slots=True)
class TokenizedInput:
    ids: np.ndarray  # (T,) int64, special tokens included
    truncated: bool
    type_ids: np.ndarray | None = None  # (T,) int64 token types (segment b is 1 for BERT); None: all zeros
    pair_start: int | None = None  # a pair's index of the first token of segment b; None: not a pair
    # The encoder attends to the first `attended` tokens only; None: to all. A ColBERT query's expansion tokens
    # after them are encoded, and score, unattended (engine/multi_vector.py).
    attended: int | None = None
    # The first `unpooled` tokens are the prompt's, attended to but left out of the pooling (Pooling include_prompt
    # false: NV-Embed's instruction); the engine marks them PROMPT_TOKEN in the graph's mask. 0: every token pooled.
    unpooled: int = 0

    def __len__(self) -> int:
        return len(self.ids)
