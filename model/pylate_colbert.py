"""PyLate's ColBERT folders (pylate.models.ColBERT, pylate 1.6), read into the one ColBERT machinery
(model/colbert.py's MultiVector; engine/multi_vector.py serves it) as PyLate runs them.

A PyLate folder is a sentence-transformers 5 save: modules.json lists a Transformer at the root and Dense modules
(pylate.models.Dense.Dense: linear, activation, residual, over every token), and config_sentence_transformers.json
(model_type "ColBERT") holds PyLate's own settings. What ColBERT.encode / ColBERT.tokenize then do:

- query_prefix / document_prefix ("[Q] " / "[D] " when unset; "" for none) are TOKENS, not text: each is looked up
  in the tokenizer (PyLate adds it to the tokenizer first, with a new embedding row, if it is not there) and its id
  inserted after the first token: [CLS] [Q] tokens... [SEP]. The text is cut one token short to leave it room.
- each text is stripped of surrounding whitespace (sentence-transformers 5's Transformer.tokenize) and lowercased
  with do_lower_case; config_sentence_transformers.json's default prompt (if any) goes before queries and documents
  alike (encode reads no "query" / "document" prompt);
- queries are cut at query_length (32) and, with do_query_expansion (true), padded to it with the tokenizer's mask
  token (else its end-of-sequence token): every position gives a vector, the pads attended to only with
  attend_to_expansion_tokens (false). Without expansion a query keeps its own tokens;
- documents are cut at document_length (180) and lose the vectors of skiplist_words' tokens (string.punctuation),
  each word resolved by convert_tokens_to_ids, so a word that is no token stands for the unknown token;
- every vector is L2-normalised (encode's normalize_embeddings), scored by MaxSim.

A Stanford-NLP ColBERT folder (config.json's architectures ["HF_ColBERT"], no modules.json; answerai-colbert-small,
colbertv2.0) PyLate reads as the encoder plus the checkpoint's own linear.weight (no bias), with markers, lengths and
attend_to_mask_tokens from artifact.metadata ([unused0] / [unused1] where it names none).
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

from attnserve.errors import CheckpointError

from .checkpoint_files import read_json, read_object
from .colbert import Expansion, MultiVector
from .dense import Dense
from .tokenizer_files import tokenizer_json
from .weights_files import Weights

MODEL_TYPE = "ColBERT"  # config_sentence_transformers.json's model_type of a PyLate save
STANFORD_ARCHITECTURE = "HF_ColBERT"
STANFORD_METADATA = "artifact.metadata"
# PyLate's settings in config_sentence_transformers.json; any of them marks an older PyLate save without model_type.
SETTINGS = ("query_prefix", "document_prefix", "query_length", "document_length", "attend_to_expansion_tokens",
            "skiplist_words", "do_query_expansion")
DENSE_TYPES = ("pylate.models.Dense.Dense", "Dense")  # PyLate's, or sentence-transformers' (converted on load)
# ColBERT.__init__'s defaults for what a folder leaves unset.
DEFAULTS = {"query_prefix": "[Q] ", "document_prefix": "[D] ", "query_length": 32, "document_length": 180,
            "do_query_expansion": True, "attend_to_expansion_tokens": False}
STANFORD_DEFAULTS = {"query_prefix": "[unused0]", "document_prefix": "[unused1]"}


def is_pylate(model_config: dict) -> bool:
    """config_sentence_transformers.json is a PyLate save's: model_type ColBERT, or none and PyLate's settings."""
    model_type = model_config.get("model_type")
    return model_type == MODEL_TYPE or (model_type is None and any(k in model_config for k in SETTINGS))


def lists_pylate_module(modules: Any) -> bool:
    """modules.json names one of PyLate's own classes (pylate.models.Dense.Dense)."""
    return isinstance(modules, list) and any(isinstance(m, dict) and str(m.get("type", "")).startswith("pylate.")
                                             for m in modules)


def is_stanford(directory: Path) -> bool:
    """A Stanford-NLP ColBERT folder: no modules.json, config.json's architectures ["HF_ColBERT"]."""
    if (directory / "modules.json").exists():
        return False
    raw = read_json(directory / "config.json")
    return isinstance(raw, dict) and raw.get("architectures") == [STANFORD_ARCHITECTURE]


def pylate_multi_vector(directory: Path, model_config: dict, dense: list[Dense], max_position_embeddings: int
                        ) -> MultiVector:
    """A PyLate save's ColBERT settings (config_sentence_transformers.json), over its Dense modules."""
    path = directory / "config_sentence_transformers.json"
    settings = {**DEFAULTS, **{k: v for k, v in model_config.items() if k in SETTINGS and v is not None}}
    return _multi_vector(path, directory, settings, model_config.get("skiplist_words"), dense,
                         max_position_embeddings)


def stanford_multi_vector(directory: Path, hidden_size: int, max_position_embeddings: int) -> MultiVector:
    """A Stanford-NLP folder's: its checkpoint's linear.weight, and artifact.metadata's markers and lengths."""
    path = directory / STANFORD_METADATA
    metadata = read_object(path) if path.exists() else {}
    names = {"query_token_id": "query_prefix", "doc_token_id": "document_prefix", "query_maxlen": "query_length",
             "doc_maxlen": "document_length", "attend_to_mask_tokens": "attend_to_expansion_tokens"}
    settings = {**DEFAULTS, **STANFORD_DEFAULTS,
                **{ours: metadata[theirs] for theirs, ours in names.items() if metadata.get(theirs) is not None}}
    weights = Weights(directory)
    shape = weights.shape("linear.weight") if "linear.weight" in weights.keys() else None
    if shape is None or len(shape) != 2 or shape[1] != hidden_size:
        raise CheckpointError(f"{directory}: a {STANFORD_ARCHITECTURE} checkpoint needs linear.weight of shape "
                              f"(d, {hidden_size}), got {shape}")
    dense = Dense("", hidden_size, shape[0], False, "Identity", False, checkpoint_keys=("linear.weight",))
    return _multi_vector(path, directory, settings, None, [dense], max_position_embeddings)


def _multi_vector(path: Path, directory: Path, settings: dict[str, Any], skiplist: Any, dense: list[Dense],
                  max_position_embeddings: int) -> MultiVector:
    """settings (DEFAULTS' keys) checked as PyLate would use them; path: the file that set them."""
    markers = {}
    vocabulary = None
    for kind in ("query", "document"):
        marker = settings[f"{kind}_prefix"]
        if not isinstance(marker, str):
            raise CheckpointError(f"{path}: {kind}_prefix must be a string, got {marker!r}")
        if marker:
            vocabulary = vocabulary or _tokens(directory)
            if marker not in vocabulary:
                raise CheckpointError(f"{path}: the {kind} marker {marker!r} is no token of the tokenizer (PyLate "
                                      "would add it with an untrained embedding)")
        markers[kind] = marker or None
    lengths = {}
    for kind in ("query", "document"):
        length = settings[f"{kind}_length"]
        if not isinstance(length, int) or isinstance(length, bool) or length < 2 + (markers[kind] is not None):
            raise CheckpointError(f"{path}: {kind}_length must be an integer of at least "
                                  f"{2 + (markers[kind] is not None)}, got {length!r}")
        if length > max_position_embeddings:
            raise CheckpointError(f"{path}: cannot reproduce {kind}_length {length}: the model has only "
                                  f"{max_position_embeddings} positions")
        lengths[kind] = length
    expand, attend = settings["do_query_expansion"], settings["attend_to_expansion_tokens"]
    if not isinstance(expand, bool) or not isinstance(attend, bool):
        raise CheckpointError(f"{path}: do_query_expansion and attend_to_expansion_tokens must be true or false, got "
                              f"{expand!r} and {attend!r}")
    words = list(string.punctuation) if skiplist is None else skiplist
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise CheckpointError(f"{path}: skiplist_words must be a list of strings, got {words!r}")
    # The query padded to query_length, its pads attended to only with attend (PyLate forces it off without
    # expansion): sentence-transformers 6.2's "fixed" expansion with the mask token.
    expansion = Expansion("fixed", attend, None, lengths["query"]) if expand else None
    return MultiVector(tuple(dense), True, dense[-1].out_features, lengths["query"], lengths["document"], expansion,
                       tuple(words), ("document",), "maxsim", markers["query"], markers["document"], strip=True,
                       skiplist_unknown_as_unk=True)


def _tokens(directory: Path) -> set[str]:
    """Every token of the checkpoint's tokenizer: its model's vocabulary and its added tokens."""
    raw = read_object(tokenizer_json(directory))
    model = raw.get("model") or {}
    vocab = model.get("vocab") or {}
    tokens = set(vocab) if isinstance(vocab, dict) else {v[0] for v in vocab if isinstance(v, list) and v}
    added = [t.get("content") for t in raw.get("added_tokens") or [] if isinstance(t, dict)]
    return tokens | {t for t in added if isinstance(t, str)}
