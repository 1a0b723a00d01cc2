"""A checkpoint's tokenizer.json, which everything after the checkpoint reads: its own, or, for a checkpoint saved with
only a slow tokenizer's files (BERT's vocab.txt and tokenizer_config.json, a SentencePiece model), the one
transformers builds from them when sentence-transformers loads the folder (AutoTokenizer's fast tokenizer,
converted from the slow one), written once into the attnserve cache, never into the checkpoint's folder.

SigLIP's SentencePiece tokenizer, which transformers has no fast form of, is rebuilt as one (siglip_tokenizer.py).
A checkpoint whose transformers tokenizer class changes its tokenizer.json as it loads it gets the one transformers
builds too: SigLIP 2's (Siglip2Tokenizer puts a Lowercase normalizer in front of Gemma's, as SigLIP 2 was trained).

The export then checks that tokenizer.json against transformers' own tokenizer on real and awkward texts
(export/tokenizer_parity.py), as it checks a checkpoint's own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from attnserve.cache import cache_root, checkpoint_fingerprint
from attnserve.errors import CheckpointError

from .checkpoint_files import read_json
from .siglip_tokenizer import siglip_tokenizer

TOKENIZER_JSON = "tokenizer.json"
# The files a slow tokenizer of transformers is built from: WordPiece's vocabulary, a SentencePiece model
# (XLM-R's, T5's, Llama's), byte-level BPE's vocabulary and merges.
SLOW_TOKENIZER_FILES = ("vocab.txt", "sentencepiece.bpe.model", "spiece.model", "tokenizer.model", "vocab.json")
# config.json model types whose tokenizer class changes tokenizer.json as it loads it (module docstring).
CHANGED_ON_LOAD = ("siglip2",)


def tokenizer_json(directory: Path) -> Path:
    """The checkpoint's tokenizer.json, or the one transformers builds from its slow tokenizer's files (cached);
    CheckpointError, saying what would do, where there is neither."""
    own = directory / TOKENIZER_JSON
    changed = _model_type(directory) in CHANGED_ON_LOAD
    if own.is_file() and not changed:
        return own
    slow = [TOKENIZER_JSON] if changed and own.is_file() else [
        name for name in SLOW_TOKENIZER_FILES if (directory / name).is_file()]
    if not slow:
        raise CheckpointError(f"checkpoint file missing: {own} (and no vocabulary to build it from: one of "
                              f"{', '.join(SLOW_TOKENIZER_FILES)})")
    built = cache_root() / "tokenizers" / checkpoint_fingerprint(directory) / TOKENIZER_JSON
    if built.is_file():
        return built
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise CheckpointError(f"{directory} has no {TOKENIZER_JSON}, only {', '.join(slow)}: building one needs "
                              "transformers (pip install 'attnserve[export]'), or save it with "
                              "AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)") from None
    why = f"'s {_model_type(directory)} tokenizer changes {TOKENIZER_JSON} on loading" if changed else \
        f" has no {TOKENIZER_JSON}"
    print(f"attnserve: {directory}{why}: building it from {', '.join(slow)} as transformers does (once, into "
          f"{built.parent})", file=sys.stderr, flush=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory), use_fast=True)
    except Exception as e:  # noqa: BLE001 (transformers raises many kinds; the message is what helps)
        raise CheckpointError(f"{directory} has no {TOKENIZER_JSON}, and transformers could not build one from "
                              f"{', '.join(slow)}: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from None
    backend = tokenizer.backend_tokenizer if tokenizer.is_fast else None
    if type(tokenizer).__name__ == "SiglipTokenizer":  # no fast form in transformers: rebuilt here
        try:
            backend = siglip_tokenizer(tokenizer)
        except Exception as e:  # noqa: BLE001 (a SentencePiece model tokenizers cannot take: the message helps)
            raise CheckpointError(f"{directory}: cannot rebuild SiglipTokenizer's SentencePiece model as a tokenizers "
                                  f"pipeline: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from None
    if backend is None:
        raise CheckpointError(f"{directory} has no {TOKENIZER_JSON}, and transformers has no fast tokenizer for "
                              f"{type(tokenizer).__name__} to build one from")
    built.parent.mkdir(parents=True, exist_ok=True)
    partial = built.with_name(f".{TOKENIZER_JSON}.{os.getpid()}")
    backend.save(str(partial))
    os.replace(partial, built)  # whole or not at all, for processes building it together
    return built


def _model_type(directory: Path) -> object:
    """config.json's model_type, or None where there is no readable one (the checkpoint's reader says why)."""
    try:
        raw = read_json(directory / "config.json")
    except CheckpointError:
        return None
    return raw.get("model_type") if isinstance(raw, dict) else None
