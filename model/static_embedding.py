"""Static embeddings: a token table and a mean (model2vec's StaticModel, sentence-transformers' StaticEmbedding).

Two folder layouts, each encoded as the library that wrote it encodes it (the tensor names say which):

- **model2vec** (`StaticModel.save_pretrained`; potion-base-8M and the other potion models): model.safetensors holds
  `embeddings` (N, H) and optionally `mapping` (V,) (row of each token id) and `weights` (V,) (each id's scale);
  config.json holds `normalize` and `max_length`. model2vec 0.10's `encode` cuts each text to max_length x the
  vocabulary's median token length characters, tokenizes without special tokens, keeps max_length tokens, drops the
  unknown token, averages `embeddings[mapping[id]] * weights[id]` (zeros for a text left without tokens) and
  divides by the norm where config.json says normalize. max_length null cuts nothing.
- **sentence-transformers** (`SentenceTransformer([StaticEmbedding(...)]).save`): `embedding.weight` (V, H) at the
  folder's root, maybe a Normalize after it. StaticEmbedding tokenizes without special tokens, keeps unknown tokens,
  cuts nothing but where its tokenizer.json says `truncation`, and averages (an EmbeddingBag's mean).

Both are a gather and a mean: the "encoder" here is the table looked up per token (its last_hidden_state: each
token's row, mapping and weights folded in, as sentence-transformers folds them), and the graph's mean pooling and
the engine's normalisation do the rest. Where nothing truncates, inputs are served up to SERVED_LENGTH tokens, past
which the server's --long-inputs decides (docs/families/static.md): `chunk` answers exactly (a mean is the
token-weighted mean of its windows' means), `truncate` cuts and marks the input, `refuse` refuses it.
The tokenizer's special tokens are never added: the served tokenizer.json has no post-processor (serving_tokenizer).
Shapes: B batch, T tokens, V vocabulary, N table rows, H dimensions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
import torch.nn as nn
from tokenizers import Tokenizer

from attnserve.errors import CheckpointError

from .checkpoint_files import read_json, read_object
from .pipeline import Pipeline, _model_config
from .weights_files import Weights

FAMILY = "static"
MODEL2VEC, SENTENCE_TRANSFORMERS = "model2vec", "sentence-transformers"
MODEL2VEC_MAX_LENGTH = 512  # model2vec 0.10's DEFAULT_MAX_LENGTH, where config.json sets none
# The longest input served at once where the library truncates nothing: a row costs T x H floats, no attention.
SERVED_LENGTH = 8192
MODEL2VEC_KEYS = {"embeddings", "mapping", "weights"}
ST_KEY = "embedding.weight"
TABLE_DTYPES = {"F32", "F16", "F64", "I8"}  # what model2vec saves (quantize_to); computed here in fp32
NO_ATTENTION = "a static embedding model (a token table and a mean) has no attention"
# The variants a static model's directory never holds, and why (the manifest's `refused`: a run asking is told so).
STATIC_REFUSED = {
    "attention": NO_ATTENTION, "attention_last": NO_ATTENTION,
    # onnxruntime's transformer optimizer fuses attention and layer norms, of which a static graph has none; its fp16
    # graph is made from the fused one.
    "embeddings_fused": "a static model's graph is a table lookup and a mean: there is nothing to fuse",
    "embeddings_fp16": "a static model's graph is a table lookup and a mean, served in fp32 (on the CPU, where it "
                       "runs faster than a GPU round trip)",
    **dict.fromkeys(("embeddings_int8", "embeddings_int8_skip_layer_norm"),
                    "a static model's graph is a table lookup and a mean, with no matrix product for int8 to speed "
                    "up (model2vec's own int8 tables are read as they are, into the fp32 graph)"),
}


@dataclass(frozen=True)
class StaticConfig:
    """What export, the manifest and serving read of a static model (family.ModelConfig's fields: no layers)."""

    vocab_size: int  # token ids served: the table's rows per id
    hidden_size: int
    library: str  # MODEL2VEC or SENTENCE_TRANSFORMERS: whose encode the folder is served as
    max_length: int | None  # the library's token limit; None: none
    char_limit: int  # model2vec's cut of each text before tokenizing (max_length x median token length); 0: none
    dropped_ids: tuple[int, ...]  # ids left out of the mean: model2vec's unknown token
    num_layers: int = 0
    num_heads: int = 0
    intermediate_size: int = 0
    pad_token_id: int = 0
    family: str = FAMILY
    type_vocab_size: ClassVar[int] = 1
    has_token_types: ClassVar[bool] = False

    @property
    def max_position_embeddings(self) -> int:
        """The longest input served at once: the library's limit, at most SERVED_LENGTH (a config's max_length of
        10**9 must not size the server's rows; past it, --long-inputs decides, as where the library has none)."""
        return min(self.max_length or SERVED_LENGTH, SERVED_LENGTH)

    @property
    def usable_positions(self) -> int:
        return self.max_position_embeddings

    def serving(self) -> dict:
        """The manifest's `static` entry: what the engine's tokenizer does that a transformer's does not."""
        return {"library": self.library, "char_limit": self.char_limit, "dropped_ids": list(self.dropped_ids)}


class StaticEncoder(nn.Module):
    """(B, T) ids -> (B, T, H) each token's row of the folded table, zeros at padding: the encoder a static model
    has. The table has one row more than the vocabulary, of zeros, that padding looks up, so that the mean sums the
    states as they are (Pipeline.pads_zeroed): no (B, T, H) product with the mask (bench_static's 20,000 texts' runs
    0.18 s before, 0.09 s after)."""

    def __init__(self, config: StaticConfig):
        super().__init__()
        self.config = config
        self.table = nn.Parameter(torch.zeros(config.vocab_size + 1, config.hidden_size), requires_grad=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, output_attentions: bool = False,
                token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        if output_attentions:
            raise CheckpointError("a static embedding model has no attention")
        ids = torch.where(attention_mask != 0, input_ids, self.config.vocab_size)  # (B, T): padding -> the zero row
        return self.table[ids], None  # (B, T, H)


def is_static(directory: Path) -> bool:
    """Whether a folder is a static model's: modules.json's first module a StaticEmbedding, or config.json's
    model_type "model2vec" (the published potion models), or a model2vec save without modules.json."""
    modules = directory / "modules.json"
    if modules.is_file():
        raw = read_json(modules)
        first = raw[0] if isinstance(raw, list) and raw and isinstance(raw[0], dict) else {}
        return str(first.get("type", "")).endswith(".StaticEmbedding")
    config = directory / "config.json"
    if not config.is_file():
        return False
    raw = read_json(config)
    if isinstance(raw, dict) and raw.get("model_type") == "model2vec":
        return True
    return isinstance(raw, dict) and "model_type" not in raw and (directory / "model.safetensors").is_file() \
        and "embeddings" in Weights(directory)


def read_static(directory: Path) -> tuple[StaticConfig, Pipeline]:
    """A static model's config and pipeline, read from its files, or a one-line CheckpointError; no tensor is read
    but the mapping (its range is checked)."""
    normalize_module = _modules(directory)
    weights = Weights(directory)
    keys = set(weights.keys())
    tokenizer = _tokenizer(directory)
    vocab = tokenizer.get_vocab()  # token -> id, added tokens included (what model2vec's StaticModel reads)
    ids = max(vocab.values()) + 1 if vocab else 0
    for key in keys:
        dtype = weights.dtype(key)
        if key != "mapping" and dtype not in TABLE_DTYPES:
            raise CheckpointError(f"{weights.name}: {key} is {dtype} (only {', '.join(sorted(TABLE_DTYPES))})")
    if keys == {ST_KEY}:
        rows, hidden = _matrix(weights, ST_KEY)
        if rows < ids:
            raise CheckpointError(f"{weights.name}: {ST_KEY} has {rows} rows but the tokenizer's ids reach {ids - 1}")
        max_length = _tokenizer_truncation(directory)
        prompts, default, _, _ = _model_config(directory / "config_sentence_transformers.json")
        config = StaticConfig(rows, hidden, SENTENCE_TRANSFORMERS, max_length, 0, ())
        return config, _pipeline(config, normalize_module, prompts, default)
    if "embeddings" not in keys or not keys <= MODEL2VEC_KEYS:
        raise CheckpointError(f"{weights.name}: a static model holds {ST_KEY} (sentence-transformers) or embeddings "
                              f"with optional mapping and weights (model2vec), not {', '.join(sorted(keys))}")
    rows, hidden = _matrix(weights, "embeddings")
    tokens = len(vocab)  # model2vec counts its tokens, one vector (or mapping entry, or weight) per token
    if "mapping" in keys:
        mapping = weights.get("mapping")
        if mapping.shape != (tokens,) or mapping.is_floating_point():
            raise CheckpointError(f"{weights.name}: mapping must be {tokens} integers (one per token), got "
                                  f"{mapping.dtype} {tuple(mapping.shape)}")
        if tokens and (int(mapping.min()) < 0 or int(mapping.max()) >= rows):
            raise CheckpointError(f"{weights.name}: mapping points outside the {rows} rows of embeddings")
    elif rows != tokens:
        raise CheckpointError(f"{weights.name}: embeddings has {rows} rows for {tokens} tokens (and no mapping)")
    if "weights" in keys and weights.shape("weights") != (tokens,):
        raise CheckpointError(f"{weights.name}: weights has shape {weights.shape('weights')}, expected ({tokens},)")
    if ids != tokens:
        raise CheckpointError(f"{directory / 'tokenizer.json'}: its ids are not 0..{tokens - 1}")
    raw = read_object(directory / "config.json")
    normalize = raw.get("normalize", False)
    max_length = raw.get("max_length", MODEL2VEC_MAX_LENGTH)
    if not isinstance(normalize, bool):
        raise CheckpointError(f"{directory / 'config.json'}: normalize must be true or false, got {normalize!r}")
    if max_length is not None and (not isinstance(max_length, int) or isinstance(max_length, bool)
                                   or max_length < 1):
        raise CheckpointError(f"{directory / 'config.json'}: max_length must be a positive integer or null, got "
                              f"{max_length!r}")
    # model2vec cuts max_length x the median token's characters (StaticModel.median_token_length), then tokenizes.
    median = int(np.median([len(token) for token in vocab])) if vocab else 0
    unknown = _unknown_id(tokenizer)
    config = StaticConfig(tokens, hidden, MODEL2VEC, max_length, max_length * median if max_length else 0,
                          () if unknown is None else (unknown,))
    return config, _pipeline(config, normalize, {}, None)


def _pipeline(config: StaticConfig, normalize: bool, prompts: dict[str, str], default: str | None) -> Pipeline:
    return Pipeline(("mean",), (), normalize, config.max_position_embeddings,
                    "static" if config.max_length == config.max_position_embeddings else "static (served length)",
                    prompts, default, pads_zeroed=True)


def _modules(directory: Path) -> bool:
    """modules.json, where there is one: StaticEmbedding at the root, then at most a Normalize. Returns whether the
    Normalize is there."""
    path = directory / "modules.json"
    if not path.is_file():
        return False
    raw = read_json(path)
    if not isinstance(raw, list) or not all(isinstance(m, dict) for m in raw):
        raise CheckpointError(f"{path}: expected a list of modules")
    names = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in raw]
    if names not in (["StaticEmbedding"], ["StaticEmbedding", "Normalize"]):
        raise CheckpointError(f"{path}: cannot reproduce the modules {' -> '.join(names)} (only StaticEmbedding, "
                              "then at most Normalize)")
    if str(raw[0].get("path", "")) not in ("", "."):
        raise CheckpointError(f"{path}: cannot reproduce a StaticEmbedding in the subfolder {raw[0]['path']!r} "
                              "(only at the folder's root)")
    return len(names) == 2


def _tokenizer(directory: Path) -> Tokenizer:
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(f"checkpoint file missing: {path}")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception for a bad file
        raise CheckpointError(f"{path}: unreadable tokenizer: {str(e).splitlines()[0][:200]}") from None


def _tokenizer_truncation(directory: Path) -> int | None:
    """sentence-transformers' StaticEmbedding keeps its tokenizer.json's truncation: its max_length, from the right."""
    path = directory / "tokenizer.json"
    truncation = read_object(path).get("truncation")
    if truncation is None:
        return None
    length = truncation.get("max_length") if isinstance(truncation, dict) else None
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        raise CheckpointError(f"{path}: truncation max_length must be a positive integer, got {length!r}")
    if truncation.get("direction", "Right") != "Right":
        raise CheckpointError(f"{path}: cannot reproduce truncation from the {truncation['direction']} (only Right)")
    return length


def _unknown_id(tokenizer: Tokenizer) -> int | None:
    """The id model2vec drops (model2vec's _get_unk_token_id): the model's unk_token, or a Unigram's unk_id."""
    model = json.loads(tokenizer.to_str())["model"]
    if "unk_token" in model:
        return None if model["unk_token"] is None else tokenizer.token_to_id(model["unk_token"])
    return model.get("unk_id")


def _matrix(weights: Weights, key: str) -> tuple[int, int]:
    shape = weights.shape(key)
    if len(shape) != 2 or shape[1] < 1:
        raise CheckpointError(f"{weights.name}: {key} must be a (tokens, dimensions) matrix, got shape {shape}")
    return shape[0], shape[1]


def load_static(directory: Path, config: StaticConfig, dtype: torch.dtype = torch.float32) -> StaticEncoder:
    """The encoder with the folded table: row id = embeddings[mapping[id]] * weights[id] (model2vec's product,
    which sentence-transformers' _fold_model2vec_weights folds the same way), computed in fp32."""
    weights = Weights(directory)
    if config.library == SENTENCE_TRANSFORMERS:
        table = weights.get(ST_KEY).float()
    else:
        table = weights.get("embeddings").float()  # (N, H)
        if "mapping" in weights:
            table = table[weights.get("mapping").long()]  # (V, H)
        if "weights" in weights:
            table = table * weights.get("weights").float()[:, None]
    encoder = StaticEncoder(config)
    encoder.table.data = torch.cat([table, table.new_zeros(1, table.shape[1])]).to(dtype).contiguous()  # (V + 1, H)
    return encoder.eval()


def serving_tokenizer(source: Path, destination: Path) -> None:
    """The tokenizer.json serving reads: the folder's, without its post-processor, so that no special token is
    added (both libraries tokenize with add_special_tokens=False); its padding and truncation are the engine's."""
    tokenizer = Tokenizer.from_file(str(source))
    raw = json.loads(tokenizer.to_str())
    raw["post_processor"] = None
    Tokenizer.from_str(json.dumps(raw)).save(str(destination))
