"""A checkpoint's sentence-transformers pipeline, read the way sentence-transformers (6.2) reads it, or refused.

The export reproduces the pipelines Transformer -> Pooling -> (Dense | Normalize)*: the encoder, any of
Pooling's modes alone or several concatenated, then Dense layers (with their activation) and L2
normalisations in any order, with the tokenizer truncating at max_seq_length. The checkpoint's prompts
and default prompt are read and kept, to be put before texts as sentence-transformers' encode() does
(engine/prompts.py). Every file sentence-transformers reads is checked here: modules.json, each module's
config, config_sentence_transformers.json and the Transformer's sentence_bert_config.json. Anything that
would make sentence-transformers' output differ from what the export runs (another module, Pooling's
include_prompt false, truncate_dim, a custom activation, pickle weights, a Transformer setting the export
does not apply...) is refused with one line naming it, rather than exported silently wrong. Settings
that cannot change the output (similarity_fn_name, unpad_inputs) are accepted.

Without modules.json, sentence-transformers builds Transformer + mean pooling and reads none of
these files; so does this reader.

A SparseEncoder's pipeline (model_type "SparseEncoder": a fill-mask Transformer -> SpladePooling) is read here too,
and reproduced by model/splade.py; so is a MultiVectorEncoder's (Transformer -> Dense* -> MultiVectorMask ->
Normalize, over token_embeddings: ColBERT), reproduced by model/colbert.py and engine/multi_vector.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnserve.errors import CheckpointError
from attnserve.pooling_modes import POOLING_MODES

from . import pylate_colbert
from .checkpoint_files import read_json, read_object, tokenizer_lowercases
from .colbert import EXPANSION_STRATEGIES, SIMILARITIES, Expansion, MultiVector
from .dense import DENSE_ACTIVATIONS, DENSE_DEFAULT_ACTIVATION, DENSE_KEYS, DENSE_WEIGHTS, Dense, Normalize
from .splade import ACTIVATIONS as SPLADE_ACTIVATIONS
from .splade import STRATEGIES as SPLADE_STRATEGIES
from .splade import Splade
from .tokenizer_files import tokenizer_json

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
# A SparseEncoder's Transformer: the MLM head's logits over the vocabulary, per token.
FILL_MASK = {"transformer_task": ("fill-mask",),
             "modality_config": ({"text": {"method": "forward", "method_output_name": "logits"}},)}
SPLADE_KEYS = {"pooling_strategy", "activation_function", "embedding_dimension", "word_embedding_dimension",
               "chunk_size"}
TRANSFORMER_FIXED = {
    "transformer_task": ("feature-extraction",),
    "modality_config": (FEATURE_EXTRACTION,),
    "module_output_name": ("token_embeddings",),
    "model_kwargs": ({},), "model_args": ({},), "processor_kwargs": ({},), "tokenizer_args": ({},),
    "config_kwargs": ({},), "config_args": ({},), "processing_kwargs": ({},),
    "query_length": (), "document_length": (), "query_expansion": (),
}
# A MultiVectorEncoder's Transformer may set these; _multi_vector_pipeline checks them.
MULTI_VECTOR_TRANSFORMER = {"query_length": None, "document_length": None, "query_expansion": None}
MULTI_VECTOR_MASK_KEYS = {"skiplist_words", "skiplist_tasks", "keep_only_token_ids"}
# Keys whose value cannot change the output, or that are checked on their own below.
TRANSFORMER_FREE = {"unpad_inputs", "max_seq_length", "do_lower_case"}
# A tokenizer with no model_max_length has transformers' "unlimited" one; the model's positions cap it.
UNLIMITED = 10**30
@dataclass(frozen=True)
class Pipeline:
    pooling: tuple[str, ...]  # POOLING_MODES, concatenated in this order
    # The modules after Pooling that the graph runs, in order: Dense, and Normalize where a Dense follows it.
    after_pooling: tuple[Dense | Normalize, ...]
    normalize: bool  # the pipeline ends in L2 normalisation (left out of the graph: the engine applies it)
    max_seq_length: int  # inputs are truncated to this many tokens, specials included
    # "sentence_bert_config.json" or "tokenizer" (the export checks the latter), or "multi_vector" (a ColBERT
    # model's query and document lengths)
    max_seq_length_from: str
    prompts: dict[str, str]  # config_sentence_transformers.json's named prompts
    default_prompt_name: str | None  # the prompt put before every text a caller gives no prompt for
    splade: Splade | None = None  # a SparseEncoder's SpladePooling (pooling is then empty): model/splade.py
    multi_vector: MultiVector | None = None  # a MultiVectorEncoder's (pooling is then empty): model/colbert.py
    # Every text padded with pad_id to pad_to tokens that the model attends to (SigLIP's text tower: model/clip.py);
    # 0: none.
    pad_to: int = 0
    pad_id: int = 0
    # Pooling's include_prompt: False leaves the prompt's tokens out of the pooling (mean alone, and only for a family
    # whose published code counts them: nvembed.py). The engine marks them in the graph's attention mask (2: attended
    # to, not pooled: sentence_head.py).
    include_prompt: bool = True
    # The encoder's states are zeros at padding (a static model's: static_embedding.py), so the mean sums them as they
    # are, without multiplying by the mask: the same sums, one (B, T, H) pass less.
    pads_zeroed: bool = False

    @property
    def pooling_name(self) -> str:
        """The manifest's name of the pooling: "mean", or "cls+mean" for several modes concatenated; a SPLADE
        model's "splade_max" or "splade_sum"."""
        if self.splade is not None:
            return f"splade_{self.splade.strategy}"
        if self.multi_vector is not None:
            return "multi_vector"
        return "+".join(self.pooling)

    def embedding_size(self, hidden_size: int) -> int:
        """The size of the sentence embedding the pipeline gives (a SPLADE model's: its vocabulary)."""
        if self.splade is not None:
            return self.splade.vocab_size
        if self.multi_vector is not None:  # the graph's mean of the vectors, which no door serves
            return self.multi_vector.dimension
        dense = [m for m in self.after_pooling if isinstance(m, Dense)]
        return dense[-1].out_features if dense else len(self.pooling) * hidden_size

    def modules(self, family: str) -> list[str]:
        """The pipeline in short words, for the manifest: ["Transformer(bert)", "Pooling(mean)", "Normalize"]."""
        if self.splade is not None:
            return [f"Transformer({family}, fill-mask)", self.splade.describe()]
        if self.multi_vector is not None:
            return [f"Transformer({family})", *(d.describe() for d in self.multi_vector.dense), "MultiVectorMask",
                    *(["Normalize"] if self.multi_vector.normalize else [])]
        return ([f"Transformer({family})", f"Pooling({self.pooling_name})"] + [m.describe() for m in self.after_pooling]
                + (["Normalize"] if self.normalize else []))


def _refuse(path: Path, what: str) -> CheckpointError:
    return CheckpointError(f"{path}: cannot reproduce {what}")


def read_pipeline(directory: Path, max_position_embeddings: int, hidden_size: int, prompt_excludable: bool = False
                  ) -> Pipeline:
    """The folder's sentence-transformers pipeline. prompt_excludable: a Pooling with include_prompt false is taken
    (mean pooling alone), for a family whose code says how many tokens its prompt is (nvembed.py)."""
    modules_file = directory / "modules.json"
    if not modules_file.exists():
        if pylate_colbert.is_stanford(directory):
            multi_vector = pylate_colbert.stanford_multi_vector(directory, hidden_size, max_position_embeddings)
            return _colbert_pipeline(multi_vector, "")
        return Pipeline(("mean",), (), False, tokenizer_max_length(directory, max_position_embeddings),
                        "tokenizer", {}, None)
    model_config_file = directory / "config_sentence_transformers.json"
    prompts, default_prompt_name, model_type, similarity = _model_config(model_config_file)
    # PyLate loads a folder without config_sentence_transformers.json as a ColBERT too.
    if model_type == pylate_colbert.MODEL_TYPE or (not model_config_file.exists()
                                                   and pylate_colbert.lists_pylate_module(read_json(modules_file))):
        model_config = read_object(model_config_file) if model_config_file.exists() else {}
        return _pylate_pipeline(directory, modules_file, model_config, max_position_embeddings, hidden_size, prompts,
                                default_prompt_name, similarity)
    if model_type == "SparseEncoder":
        return _sparse_pipeline(directory, modules_file, max_position_embeddings, prompts, default_prompt_name)
    if model_type == "MultiVectorEncoder":
        return _multi_vector_pipeline(directory, modules_file, max_position_embeddings, hidden_size, prompts,
                                      similarity)
    pooling_folder, after = _modules(modules_file)
    max_seq_length, length_from, _ = _transformer(directory, max_position_embeddings)
    modes, include_prompt = _pooling(directory / pooling_folder / "config.json", prompt_excludable)
    size = len(modes) * hidden_size
    head: list[Dense | Normalize] = []
    for name, folder in after:
        if name == "Dense":
            dense = _dense(directory, folder, size)
            head.append(dense)
            size = dense.out_features
        else:
            _normalize(directory / folder / "config.json")
            head.append(Normalize())
    # Trailing normalisations are the engine's (it L2-normalises unless a request says otherwise).
    trailing = 0
    while trailing < len(head) and isinstance(head[len(head) - 1 - trailing], Normalize):
        trailing += 1
    return Pipeline(modes, tuple(head[:len(head) - trailing]), trailing > 0, max_seq_length, length_from,
                    prompts, default_prompt_name, include_prompt=include_prompt)


def _model_config(path: Path) -> tuple[dict[str, str], str | None, str, str | None]:
    """config_sentence_transformers.json: its prompts, default prompt, model_type and similarity_fn_name; refuses
    what changes encode()'s output otherwise."""
    if not path.exists():
        return {}, None, "SentenceTransformer", None
    raw = read_object(path)
    # A PyLate save (model/pylate_colbert.py) says model_type "ColBERT", or, before sentence-transformers 5, nothing.
    model_type = pylate_colbert.MODEL_TYPE if pylate_colbert.is_pylate(raw) else raw.get("model_type",
                                                                                         "SentenceTransformer")
    if model_type not in ("SentenceTransformer", "SparseEncoder", "MultiVectorEncoder", pylate_colbert.MODEL_TYPE):
        raise _refuse(path, f"model_type {model_type!r} (only SentenceTransformer embedders, SparseEncoder "
                            "SPLADE models, and MultiVectorEncoder and PyLate ColBERT models are exported)")
    if raw.get("truncate_dim") is not None:
        # encode() cuts the embeddings after the pipeline's Normalize, leaving them short of unit length.
        raise _refuse(path, f"truncate_dim {raw['truncate_dim']!r}: embeddings cut to fewer dimensions")
    prompts = raw.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and (v is None or isinstance(v, str))
                                                for k, v in prompts.items()):
        raise CheckpointError(f"{path}: prompts must map names to prompt strings, got {prompts!r}")
    prompts = {name: text or "" for name, text in prompts.items()}  # sentence-transformers reads null as ""
    default = raw.get("default_prompt_name")
    if default is not None and (not isinstance(default, str) or default not in prompts):
        raise CheckpointError(f"{path}: default_prompt_name {default!r} is not one of the prompts "
                              f"({', '.join(prompts) or 'there are none'})")
    similarity = raw.get("similarity_fn_name")
    return prompts, default, model_type, similarity if isinstance(similarity, str) else None


def _sparse_pipeline(directory: Path, modules_file: Path, max_position_embeddings: int, prompts: dict[str, str],
                     default_prompt_name: str | None) -> Pipeline:
    """A SparseEncoder: a fill-mask Transformer at the root, then SpladePooling, and nothing else."""
    raw = read_json(modules_file)
    if not isinstance(raw, list) or not raw:
        raise CheckpointError(f"{modules_file}: expected a non-empty list of modules")
    kinds = [_module_kind(entry, modules_file, i) for i, entry in enumerate(raw)]
    # MLMTransformer: sentence-transformers 5's name of the fill-mask Transformer, which SPLADE models keep.
    if [name for name, _ in kinds] not in (["Transformer", "SpladePooling"], ["MLMTransformer", "SpladePooling"]) \
            or kinds[0][1] != "":
        order = " -> ".join(name for name, _ in kinds)
        raise _refuse(modules_file, f"the SparseEncoder modules {order} (only a Transformer at the checkpoint's "
                                    "root -> SpladePooling: SPLADE)")
    max_seq_length, length_from, _ = _transformer(directory, max_position_embeddings, FILL_MASK)
    path = directory / kinds[1][1] / "config.json"
    config = read_object(path) if path.exists() else {}
    unknown = sorted(set(config) - SPLADE_KEYS)
    if unknown:
        raise _refuse(path, f"the SpladePooling setting {unknown[0]!r}")
    strategy = config.get("pooling_strategy", "max")
    activation = config.get("activation_function", "relu")
    if strategy not in SPLADE_STRATEGIES or activation not in SPLADE_ACTIVATIONS:
        raise _refuse(path, f"SpladePooling {strategy!r} with {activation!r} (only {' or '.join(SPLADE_STRATEGIES)}"
                            f" with {' or '.join(SPLADE_ACTIVATIONS)})")
    vocab_size = read_object(directory / "config.json").get("vocab_size")
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 1:
        raise CheckpointError(f"{directory / 'config.json'}: vocab_size must be a positive integer, got "
                              f"{vocab_size!r}")
    dimension = config.get("embedding_dimension") or config.get("word_embedding_dimension")
    if dimension not in (None, vocab_size):
        raise _refuse(path, f"embedding_dimension {dimension!r} (the vocabulary has {vocab_size})")
    return Pipeline((), (), False, max_seq_length, length_from, prompts, default_prompt_name,
                    Splade(strategy, activation, vocab_size))


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


def _modules(path: Path) -> tuple[str, list[tuple[str, str]]]:
    """modules.json must be Transformer (at the root) -> Pooling -> (Dense | Normalize)*: returns Pooling's
    folder and the (class name, folder) of each module after it."""
    raw = read_json(path)
    if not isinstance(raw, list) or not raw:
        raise CheckpointError(f"{path}: expected a non-empty list of modules")
    kinds = [_module_kind(entry, path, i) for i, entry in enumerate(raw)]
    for i, (name, folder) in enumerate(kinds):
        if name not in ("Transformer", "Pooling", "Dense", "Normalize"):
            raise _refuse(path, f"module {folder or raw[i].get('name', i)!r} of type {raw[i]['type']} "
                                f"(only Transformer, Pooling, Dense and Normalize are exported)")
        if (name == "Transformer") != (i == 0) or (name == "Pooling") != (i == 1):
            order = " -> ".join(n for n, _ in kinds)
            raise _refuse(path, f"the module order {order} (only Transformer -> Pooling, then Dense and Normalize)")
    if len(kinds) < 2:
        raise _refuse(path, "a pipeline without a Pooling module (it has no sentence embedding)")
    if kinds[0][1] != "":
        raise _refuse(path, f"a Transformer in the subfolder {kinds[0][1]!r} (only one at the checkpoint's root)")
    return kinds[1][1], kinds[2:]


def _transformer(directory: Path, max_position_embeddings: int, task: dict | None = None
                 ) -> tuple[int, str, dict]:
    """The Transformer's config file: returns (max_seq_length, where it came from, the file's settings). task:
    the settings a SparseEncoder's fill-mask Transformer has instead of feature extraction's (None values: keys
    its caller checks)."""
    fixed = TRANSFORMER_FIXED | (task or {})
    found = [directory / name for name in TRANSFORMER_CONFIG_FILES if (directory / name).exists()]
    if not found:
        return tokenizer_max_length(directory, max_position_embeddings), "tokenizer", {}
    path = found[0]
    raw = read_object(path)
    for key, value in raw.items():
        if key in TRANSFORMER_FREE or (key in fixed and fixed[key] is None):
            continue
        if key not in fixed:
            raise _refuse(path, f"the Transformer setting {key!r}")
        allowed = fixed[key]
        if value is not None and value not in allowed:
            raise _refuse(path, f"{key} {json.dumps(value)} (the export runs "
                                f"{json.dumps(allowed[0]) if allowed else 'without it'})")
    if raw.get("do_lower_case") and not tokenizer_lowercases(tokenizer_json(directory)):
        # sentence-transformers then puts a Lowercase normalizer in front of the tokenizer's own.
        raise _refuse(path, "do_lower_case true: sentence-transformers adds a Lowercase normalizer "
                            "that tokenizer.json does not have")
    length = raw.get("max_seq_length")
    if length is None:
        return tokenizer_max_length(directory, max_position_embeddings), "tokenizer", raw
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        raise CheckpointError(f"{path}: max_seq_length must be a positive integer, got {length!r}")
    if length > max_position_embeddings:
        raise _refuse(path, f"max_seq_length {length}: the model has only {max_position_embeddings} positions")
    return length, path.name, raw


def tokenizer_max_length(directory: Path, max_position_embeddings: int) -> int:
    """What sentence-transformers truncates at when sentence_bert_config.json sets no max_seq_length:
    the tokenizer's model_max_length, capped at the model's positions."""
    config = directory / "tokenizer_config.json"
    length = read_object(config).get("model_max_length", UNLIMITED) if config.exists() else UNLIMITED
    if not isinstance(length, (int, float)) or isinstance(length, bool) or length < 1:
        raise CheckpointError(f"{config}: model_max_length must be a positive number, got {length!r}")
    return int(min(length, max_position_embeddings))


def _pooling(path: Path, prompt_excludable: bool = False) -> tuple[tuple[str, ...], bool]:
    """Pooling's config, read as sentence-transformers 6 reads it (pooling_mode, else the legacy booleans): its modes
    and include_prompt."""
    raw = read_object(path)
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
    unknown_modes = [m for m in modes if m not in POOLING_MODES]
    if unknown_modes:
        raise CheckpointError(f"{path}: pooling mode {unknown_modes[0]!r} is not one of {', '.join(POOLING_MODES)}")
    include_prompt = raw.get("include_prompt", True)
    if not isinstance(include_prompt, bool):
        raise CheckpointError(f"{path}: include_prompt must be true or false, got {include_prompt!r}")
    if not include_prompt and not (prompt_excludable and modes == ["mean"]):
        # How many tokens the prompt is, is the family's code's to say (nvembed.py): no other family's is read.
        raise _refuse(path, "include_prompt false (prompt tokens left out of the pooling)" +
                      (f" with pooling {'+'.join(modes)} (only mean)" if prompt_excludable else ""))
    return tuple(modes), include_prompt


def _dense(directory: Path, folder: str, in_size: int, on: str | None = "sentence_embedding") -> Dense:
    """A Dense module's config, read as sentence-transformers reads it, and its weights file checked. on: the
    feature it must map in place (a MultiVectorEncoder's: token_embeddings); None: PyLate's Dense, which maps
    every token's whatever its config names."""
    path = directory / folder / "config.json"
    raw = read_object(path)
    # Keys sentence-transformers does not know it drops (a warning); they cannot change its output.
    kwargs = {k: v for k, v in raw.items() if k in DENSE_KEYS}
    for key in ("in_features", "out_features"):
        value = kwargs.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise CheckpointError(f"{path}: {key} must be a positive integer, got {value!r}")
    for key in ("bias", "use_residual"):
        if not isinstance(kwargs.get(key, key == "bias"), bool):
            raise CheckpointError(f"{path}: {key} must be true or false, got {kwargs[key]!r}")
    source = kwargs.get("module_input_name", "sentence_embedding")
    target = kwargs.get("module_output_name") or source
    if on is not None and (source, target) != (on, on):
        raise _refuse(path, f"a Dense from {source!r} to {target!r} (only {on} in place)")
    if kwargs["in_features"] != in_size:
        raise CheckpointError(f"{path}: in_features {kwargs['in_features']} but the embedding before it has "
                              f"{in_size} dimensions")
    activation = _activation(path, kwargs.get("activation_function"))
    weights = directory / folder / DENSE_WEIGHTS
    if not weights.is_file():
        if any((directory / folder).glob("*.bin")):
            raise CheckpointError(f"{directory / folder}: only {DENSE_WEIGHTS} is accepted, not pickle .bin weights")
        raise CheckpointError(f"checkpoint file missing: {weights}")
    return Dense(folder, kwargs["in_features"], kwargs["out_features"], kwargs.get("bias", True), activation,
                 kwargs.get("use_residual", False))


def _activation(path: Path, reference: Any) -> str:
    """The torch.nn class a Dense config names ("torch.nn.modules.activation.Tanh"), one of DENSE_ACTIVATIONS."""
    if reference is None:
        return DENSE_DEFAULT_ACTIVATION
    if not isinstance(reference, str):
        raise CheckpointError(f"{path}: activation_function must be a class path, got {reference!r}")
    name = reference.rsplit(".", 1)[-1]
    if not reference.startswith("torch.nn.") or name not in DENSE_ACTIVATIONS:
        # sentence-transformers itself runs Tanh instead of a class outside torch unless trusted with its code.
        raise _refuse(path, f"the activation {reference} (only torch.nn {', '.join(DENSE_ACTIVATIONS)})")
    return name


def _normalize(path: Path, on: str = "sentence_embedding") -> None:
    """Normalize L2-normalises the sentence embedding (on) unless its config points it elsewhere."""
    raw = read_object(path) if path.exists() else {}
    source = raw.get("module_input_name", "sentence_embedding")
    target = raw.get("module_output_name", source)
    if (source, target) != (on, on):
        raise _refuse(path, f"a Normalize from {source!r} to {target!r} (only {on} in place)")


def _multi_vector_pipeline(directory: Path, modules_file: Path, max_position_embeddings: int, hidden_size: int,
                           prompts: dict[str, str], similarity: str | None) -> Pipeline:
    """A MultiVectorEncoder: a Transformer at the root, Dense modules over token_embeddings, a MultiVectorMask and
    a Normalize over token_embeddings (sentence-transformers 6.2's native save of a ColBERT model)."""
    raw = read_json(modules_file)
    if not isinstance(raw, list) or not raw:
        raise CheckpointError(f"{modules_file}: expected a non-empty list of modules")
    kinds = [_module_kind(entry, modules_file, i) for i, entry in enumerate(raw)]
    names = [name for name, _ in kinds]
    dense_count = len(names) - 2 - (names[-1] == "Normalize")
    order = " -> ".join(names)
    if (names[0] != "Transformer" or kinds[0][1] != "" or dense_count < 0
            or names[1:1 + dense_count] != ["Dense"] * dense_count or names[1 + dense_count] != "MultiVectorMask"):
        raise _refuse(modules_file, f"the MultiVectorEncoder modules {order} (only a Transformer at the checkpoint's "
                                    "root -> Dense* -> MultiVectorMask -> Normalize?: ColBERT)")
    max_seq_length, length_from, transformer = _transformer(directory, max_position_embeddings,
                                                            MULTI_VECTOR_TRANSFORMER)
    config_file = directory / (next((n for n in TRANSFORMER_CONFIG_FILES if (directory / n).exists()), "-"))
    lengths = _multi_vector_lengths(config_file, transformer, max_position_embeddings)
    expansion = _expansion(config_file, transformer.get("query_expansion"), max_position_embeddings)
    size, dense = hidden_size, []
    for _, folder in kinds[1:1 + dense_count]:
        dense.append(_dense(directory, folder, size, on="token_embeddings"))
        size = dense[-1].out_features
    words, tasks = _skiplist(directory / kinds[1 + dense_count][1] / "config.json")
    normalize = names[-1] == "Normalize"
    if normalize:
        _normalize(directory / kinds[-1][1] / "config.json", on="token_embeddings")
    if similarity is not None and similarity not in SIMILARITIES:
        raise _refuse(directory / "config_sentence_transformers.json",
                      f"similarity_fn_name {similarity!r} (a MultiVectorEncoder scores by {' or '.join(SIMILARITIES)})")
    # Where sentence-transformers' Transformer.preprocess truncates each: a query at the expansion's length
    # ("fixed"), at the larger of it and query_length ("min"), else at query_length; max_seq_length where unset.
    query_length = lengths["query_length"] or max_seq_length
    if expansion is not None:
        query_length = expansion.length if expansion.strategy == "fixed" else (
            max(query_length, expansion.length) if lengths["query_length"] else max_seq_length)
    document_length = lengths["document_length"] or max_seq_length
    multi_vector = MultiVector(tuple(dense), normalize, size, query_length, document_length, expansion, tuple(words),
                               tuple(tasks), similarity or "maxsim")
    # No default prompt: the query and document prompts go by the input's type (engine/multi_vector.py). The graphs
    # are verified up to the longer of a query's and a document's width.
    longest = max(query_length, document_length, expansion.length if expansion else 0)
    return Pipeline((), (), False, longest, length_from if longest == max_seq_length else "multi_vector", prompts,
                    None, multi_vector=multi_vector)


def _pylate_pipeline(directory: Path, modules_file: Path, model_config: dict, max_position_embeddings: int,
                     hidden_size: int, prompts: dict[str, str], default_prompt_name: str | None,
                     similarity: str | None) -> Pipeline:
    """A PyLate save (model/pylate_colbert.py): a Transformer at the root, then Dense modules over every token."""
    raw = read_json(modules_file)
    if not isinstance(raw, list) or not raw:
        raise CheckpointError(f"{modules_file}: expected a non-empty list of modules")
    kinds = [_module_kind(entry, modules_file, i) for i, entry in enumerate(raw)]
    names = [name for name, _ in kinds]
    if (names[0] != "Transformer" or kinds[0][1] != "" or len(names) < 2
            or any(name not in pylate_colbert.DENSE_TYPES for name in names[1:])):
        # PyLate itself adds an untrained Dense to a folder without one, and silently drops other modules.
        raise _refuse(modules_file, f"the PyLate modules {' -> '.join(names)} (only a Transformer at the "
                                    "checkpoint's root -> Dense+)")
    _transformer(directory, max_position_embeddings)  # its settings, do_lower_case; PyLate sets the lengths itself
    size, dense = hidden_size, []
    for _, folder in kinds[1:]:
        dense.append(_dense(directory, folder, size, on=None))
        size = dense[-1].out_features
    if similarity not in (None, "MaxSim"):
        raise _refuse(directory / "config_sentence_transformers.json",
                      f"similarity_fn_name {similarity!r} (a PyLate ColBERT scores by MaxSim)")
    multi_vector = pylate_colbert.pylate_multi_vector(directory, model_config, dense, max_position_embeddings)
    # ColBERT.encode puts the default prompt, if any, before queries and documents alike.
    return _colbert_pipeline(multi_vector, prompts[default_prompt_name] if default_prompt_name else "")


def _colbert_pipeline(multi_vector: MultiVector, prompt: str) -> Pipeline:
    """A PyLate or Stanford-NLP ColBERT's pipeline: `prompt` before both input types; the graphs verified up to
    the longer of a query's and a document's length."""
    longest = max(multi_vector.query_length, multi_vector.document_length)
    return Pipeline((), (), False, longest, "multi_vector", {"query": prompt, "document": prompt}, None,
                    multi_vector=multi_vector)


def _multi_vector_lengths(config_file: Path, transformer: dict, max_position_embeddings: int) -> dict[str, int | None]:
    """A ColBERT Transformer's query_length and document_length (None where unset), each within the model's
    positions."""
    lengths: dict[str, int | None] = {}
    for key in ("query_length", "document_length"):
        value = transformer.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise CheckpointError(f"{config_file}: {key} must be a positive integer, got {value!r}")
        if value is not None and value > max_position_embeddings:
            raise _refuse(config_file, f"{key} {value}: the model has only {max_position_embeddings} positions")
        lengths[key] = value
    return lengths


def _skiplist(mask_path: Path) -> tuple[list[str], list[str]]:
    """A MultiVectorMask's config: its skiplist's words and the input types (tasks) it applies to."""
    mask = read_object(mask_path) if mask_path.exists() else {}
    unknown = sorted(set(mask) - MULTI_VECTOR_MASK_KEYS)
    if unknown:
        raise _refuse(mask_path, f"the MultiVectorMask setting {unknown[0]!r}")
    if mask.get("keep_only_token_ids") is not None:
        raise _refuse(mask_path, "keep_only_token_ids (image-patch documents)")
    words = mask.get("skiplist_words") or []
    tasks = mask.get("skiplist_tasks", ["document"])
    tasks = [tasks] if isinstance(tasks, str) else tasks
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise CheckpointError(f"{mask_path}: skiplist_words must be a list of strings, got {words!r}")
    if not isinstance(tasks, list) or not set(tasks) <= {"query", "document"}:
        raise _refuse(mask_path, f"skiplist_tasks {tasks!r} (only \"query\" and \"document\")")
    return words, tasks


def _expansion(path: Path, raw: Any, max_position_embeddings: int) -> Expansion | None:
    """query_expansion, checked as sentence-transformers' _normalize_query_expansion checks it."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) - {"strategy", "attend", "token", "length"}:
        raise CheckpointError(f"{path}: query_expansion must be an object of strategy, attend, token and length, "
                              f"got {raw!r}")
    strategy, attend, token, length = raw.get("strategy"), raw.get("attend", False), raw.get("token"), raw.get("length")
    if strategy not in EXPANSION_STRATEGIES:
        raise CheckpointError(f"{path}: query_expansion strategy must be one of {', '.join(EXPANSION_STRATEGIES)}, "
                              f"got {strategy!r}")
    if not isinstance(attend, bool) or (token is not None and not isinstance(token, str)):
        raise CheckpointError(f"{path}: query_expansion attend must be true or false and token a string, got "
                              f"{attend!r} and {token!r}")
    if not isinstance(length, int) or isinstance(length, bool) or not 1 <= length <= max_position_embeddings:
        raise CheckpointError(f"{path}: query_expansion length must be a positive integer within the model's "
                              f"{max_position_embeddings} positions, got {length!r}")
    return Expansion(strategy, attend, token, length)
