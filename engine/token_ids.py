"""The token ids of made-up inputs: export's tracing input and verification's random batches, and the engine's
calibration feeds and the server's warm-up input (here, so that serving takes them without importing export)."""

from __future__ import annotations

# BERT vocabularies keep [PAD], [unusedN] and the special tokens below id 1000, so made-up inputs
# are ordinary word pieces from there up. A vocabulary of 1000 or fewer has no such range: any id
# of it will do, since the graph's arithmetic does not depend on which ids it looks up.
ORDINARY_FROM = 1000


def made_up_token_ids(vocab_size: int) -> range:
    """The ids made-up inputs are drawn from; never empty for a vocabulary of at least one token."""
    return range(ORDINARY_FROM if vocab_size > ORDINARY_FROM else 0, vocab_size)
