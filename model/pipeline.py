"""A checkpoint's sentence-transformers pipeline, read the way sentence-transformers (6.2) reads it, or refused.

The export reproduces exactly one pipeline: the BERT encoder (Transformer), mean or CLS pooling
(Pooling) and an optional L2 normalisation (Normalize), with the tokenizer truncating at
max_seq_length. Every file sentence-transformers reads is checked here: modules.json, each module's
config, config_sentence_transformers.json and the Transformer's sentence_bert_config.json. Anything
that would make sentence-transformers' output differ from that pipeline (another module such as
Dense, another pooling mode, a default prompt, truncate_dim, a Transformer setting the export does
not apply...) is refused with one line naming it, rather than exported silently wrong. Settings
that cannot change the output (similarity_fn_name, unpad_inputs, named prompts that only apply when
a caller asks for them) are accepted.

Without modules.json, sentence-transformers builds Transformer + mean pooling and reads none of
these files; so does this reader.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnserve.errors import CheckpointError

from .encoder import POOLING_MODES

# Pooling's legacy boolean keys, in the order sentence-transformers concatenates their outputs.
LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
POOLING_KEYS = {"embedding_dimension", "word_embedding_dimension", "pooling_mode", "include_prompt",
                *LEGACY_POOLING_KEYS}
# The Transformer config file names sentence-transformers tries, in its order.
TRANSFORMER_CONFIG_FILES = ("sentence_bert_config.json", "sentence_roberta_config.json",
                            "sentence_distilbert_config.json", "sentence_camembert_config.json",
                            "sentence_albert_config.json", "sentence_xlm-roberta_config.json",
                            "sentence_xlnet_config.json")
# sentence_bert_config.json keys and the only values the export reproduces (None: absent or null).
# The *_kwargs dicts are handed to transformers when the model, tokenizer or config is built.
FEATURE_EXTRACTION = {"text": {"method": "forward", "method_output_name": "last_hidden_state"}}
TRANSFORMER_FIXED = {
    "transformer_task": ("feature-extraction",),
    "modality_config": (FEATURE_EXTRACTION,),
    "module_output_name": ("token_embeddings",),
    "model_kwargs": ({},), "model_args": ({},), "processor_kwargs": ({},), "tokenizer_args": ({},),
    "config_kwargs": ({},), "config_args": ({},), "processing_kwargs": ({},),
    "query_length": (), "document_length": (), "query_expansion": (),
}
# Keys whose value cannot change the output, or that are checked on their own below.
TRANSFORMER_FREE = {"unpad_inputs", "max_seq_length", "do_lower_case"}
# A tokenizer with no model_max_length has transformers' "unlimited" one; the model's positions cap it.
UNLIMITED = 10**30


@dataclass(frozen=True)
class Pipeline:
    pooling: str  # one of POOLING_MODES: "mean" or "cls"
    normalize: bool  # the pipeline ends in L2 normalisation
    max_seq_length: int  # inputs are truncated to this many tokens, specials included
    max_seq_length_from: str  # "sentence_bert_config.json" or "tokenizer": the export checks the latter


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file missing: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint file unreadable: {path}: {e}") from None


def _read_object(path: Path) -> dict:
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    return raw


def _refuse(path: Path, what: str) -> CheckpointError:
    return CheckpointError(f"{path}: cannot reproduce {what}")


def read_pipeline(directory: Path, max_position_embeddings: int) -> Pipeline:
    modules_file = directory / "modules.json"
    if not modules_file.exists():
        return Pipeline("mean", False, _tokenizer_max_length(directory, max_position_embeddings), "tokenizer")
    _check_model_config(directory / "config_sentence_transformers.json")
    pooling, normalize = _modules(modules_file)
    max_seq_length, length_from = _transformer(directory, max_position_embeddings)
    mode = _pooling(directory / pooling / "config.json")
    if normalize is not None:
        _normalize(directory / normalize / "config.json")
    return Pipeline(mode, normalize is not None, max_seq_length, length_from)


def _check_model_config(path: Path) -> None:
    """config_sentence_transformers.json: only settings that leave `encode()`'s output alone."""
    if not path.exists():
        return
    raw = _read_object(path)
    model_type = raw.get("model_type", "SentenceTransformer")
    if model_type != "SentenceTransformer":
        raise _refuse(path, f"model_type {model_type!r} (only SentenceTransformer embedders are exported)")
    prompts = raw.get("prompts") or {}
    default = raw.get("default_prompt_name")
    if default is not None and (not isinstance(default, str) or not isinstance(prompts, dict)
                                or prompts.get(default) != ""):
        # encode() prepends the default prompt to every text (and fails if there is none by that
        # name); the export encodes texts as they come.
        raise _refuse(path, f"default_prompt_name {default!r}: encode() prepends its prompt to every text")
    if raw.get("truncate_dim") is not None:
        raise _refuse(path, f"truncate_dim {raw['truncate_dim']!r}: embeddings cut to fewer dimensions")


def _module_kind(entry: Any, path: Path, position: int) -> tuple[str, str]:
    """(class name, folder) of one modules.json entry; only sentence-transformers' own classes count."""
    if not isinstance(entry, dict) or not isinstance(entry.get("type"), str) or not isinstance(entry.get("path"), str):
        raise CheckpointError(f"{path}: entry {position} needs a string 'type' and 'path'")
    class_ref, folder = entry["type"], entry["path"]
    name = class_ref.rsplit(".", 1)[-1] if class_ref.startswith("sentence_transformers.") else class_ref
    if Path(folder).is_absolute() or ".." in Path(folder).parts:
        raise CheckpointError(f"{path}: module path {folder!r} leaves the checkpoint directory")
    if entry.get("kwargs"):
        raise _refuse(path, f"module {folder or entry.get('name', position)!r} ({class_ref}) with forward "
                            f"kwargs {entry['kwargs']!r}")
    return name, folder


def _modules(path: Path) -> tuple[str, str | None]:
    """modules.json must be Transformer (at the root) -> Pooling [-> Normalize]; returns the last two's folders."""
    raw = read_json(path)
    if not isinstance(raw, list) or not raw:
        raise CheckpointError(f"{path}: expected a non-empty list of modules")
    kinds = [_module_kind(entry, path, i) for i, entry in enumerate(raw)]
    expected = ("Transformer", "Pooling", "Normalize")
    for i, (name, folder) in enumerate(kinds):
        if name not in expected:
            raise _refuse(path, f"module {folder or raw[i].get('name', i)!r} of type {raw[i]['type']} "
                                f"(only Transformer, Pooling and Normalize are exported)")
        if i >= len(expected) or name != expected[i]:
            order = " -> ".join(n for n, _ in kinds)
            raise _refuse(path, f"the module order {order} (only Transformer -> Pooling [-> Normalize])")
    if len(kinds) < 2:
        raise _refuse(path, "a pipeline without a Pooling module (it has no sentence embedding)")
    if kinds[0][1] != "":
        raise _refuse(path, f"a Transformer in the subfolder {kinds[0][1]!r} (only one at the checkpoint's root)")
    return kinds[1][1], (kinds[2][1] if len(kinds) == 3 else None)


def _transformer(directory: Path, max_position_embeddings: int) -> tuple[int, str]:
    """The Transformer's config file: returns (max_seq_length, where it came from)."""
    found = [directory / name for name in TRANSFORMER_CONFIG_FILES if (directory / name).exists()]
    if not found:
        return _tokenizer_max_length(directory, max_position_embeddings), "tokenizer"
    path = found[0]
    raw = _read_object(path)
    for key, value in raw.items():
        if key in TRANSFORMER_FREE:
            continue
        if key not in TRANSFORMER_FIXED:
            raise _refuse(path, f"the Transformer setting {key!r}")
        allowed = TRANSFORMER_FIXED[key]
        if value is not None and value not in allowed:
            raise _refuse(path, f"{key} {json.dumps(value)} (the export runs "
                                f"{json.dumps(allowed[0]) if allowed else 'without it'})")
    if raw.get("do_lower_case") and not _tokenizer_lowercases(directory / "tokenizer.json"):
        # sentence-transformers then puts a Lowercase normalizer in front of the tokenizer's own.
        raise _refuse(path, "do_lower_case true: sentence-transformers adds a Lowercase normalizer "
                            "that tokenizer.json does not have")
    length = raw.get("max_seq_length")
    if length is None:
        return _tokenizer_max_length(directory, max_position_embeddings), "tokenizer"
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        raise CheckpointError(f"{path}: max_seq_length must be a positive integer, got {length!r}")
    if length > max_position_embeddings:
        raise _refuse(path, f"max_seq_length {length}: the model has only {max_position_embeddings} positions")
    return length, path.name


def _tokenizer_lowercases(path: Path) -> bool:
    """sentence-transformers' own test: a Lowercase normalizer, alone or in a Sequence."""
    normalizer = _read_object(path).get("normalizer")
    if not isinstance(normalizer, dict):
        return False
    parts = normalizer.get("normalizers") if normalizer.get("type") == "Sequence" else [normalizer]
    return isinstance(parts, list) and any(isinstance(p, dict) and p.get("type") == "Lowercase" for p in parts)


def _tokenizer_max_length(directory: Path, max_position_embeddings: int) -> int:
    """What sentence-transformers truncates at when sentence_bert_config.json sets no max_seq_length:
    the tokenizer's model_max_length, capped at the model's positions."""
    config = directory / "tokenizer_config.json"
    length = _read_object(config).get("model_max_length", UNLIMITED) if config.exists() else UNLIMITED
    if not isinstance(length, (int, float)) or isinstance(length, bool) or length < 1:
        raise CheckpointError(f"{config}: model_max_length must be a positive number, got {length!r}")
    return int(min(length, max_position_embeddings))


def _pooling(path: Path) -> str:
    """Pooling's config, read as sentence-transformers 6 reads it (pooling_mode, else the legacy booleans)."""
    raw = _read_object(path)
    unknown = sorted(set(raw) - POOLING_KEYS)
    if unknown:
        raise _refuse(path, f"the Pooling setting {unknown[0]!r}")
    if "pooling_mode" in raw:
        mode = raw["pooling_mode"]
        modes = [mode] if isinstance(mode, str) else list(mode) if isinstance(mode, list) else None
        if not modes or not all(isinstance(m, str) for m in modes):
            raise CheckpointError(f"{path}: pooling_mode must be a mode name or a list of them, got {mode!r}")
    else:
        modes = [m for key, m in LEGACY_POOLING_KEYS.items() if raw.get(key)]
        if not modes:
            # sentence-transformers 6 falls back to mean here; earlier versions pooled nothing.
            raise _refuse(path, "a Pooling config with no pooling mode set")
    if len(modes) > 1:
        raise _refuse(path, f"pooling modes {' + '.join(modes)} concatenated (only one of mean or cls)")
    if modes[0] not in POOLING_MODES:
        raise _refuse(path, f"pooling mode {modes[0]!r} (only mean or cls)")
    if raw.get("include_prompt", True) is not True:
        raise _refuse(path, "include_prompt false (prompt tokens left out of the pooling)")
    return modes[0]


def _normalize(path: Path) -> None:
    """Normalize L2-normalises the sentence embedding unless its config points it elsewhere."""
    raw = _read_object(path) if path.exists() else {}
    source = raw.get("module_input_name", "sentence_embedding")
    target = raw.get("module_output_name", source)
    if (source, target) != ("sentence_embedding", "sentence_embedding"):
        raise _refuse(path, f"a Normalize from {source!r} to {target!r} (only the sentence embedding in place)")
