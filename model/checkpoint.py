"""BERT-family checkpoints (config.json + model.safetensors + tokenizer.json) -> Encoder, or ModernBertEncoder
for a ModernBERT checkpoint (model_type "modernbert": its config reader and key map are in modernbert.py).

Only safetensors is read: a pickle checkpoint can run code on load. Weights are
copied through an explicit key map, and any key that is missing, unexpected
or of the wrong shape fails the load with the key's name.

A checkpoint is exported only if its whole pipeline is one the export reproduces:
a bare BERT encoder (config.json's architectures and the weights' heads say so)
and the sentence-transformers pipeline that pipeline.py reads. Everything else
is refused here, from metadata and the weights' header, before any weight is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attnserve.errors import CheckpointError

from . import heads, modernbert
from .encoder import Encoder, EncoderConfig
from .modernbert import ModernBertConfig, ModernBertEncoder
from .pipeline import Pipeline, read_json, read_pipeline

# Keys some checkpoints carry that the encoder does not use: BERT's NSP pooler
# (sentence embeddings pool the hidden states instead) and a position-id buffer.
IGNORED_KEYS = ("pooler.dense.weight", "pooler.dense.bias", "embeddings.position_ids")
# Where an encoder's own keys live; a task model (BertForX) prefixes them with "bert.".
ENCODER_PARTS = ("embeddings.", "encoder.", "pooler.")
TASK_PREFIX = "bert."
# The masked-LM head of a BertForMaskedLM checkpoint: used as an encoder, the head goes unused,
# exactly as transformers' AutoModel (what sentence-transformers loads) leaves it.
UNUSED_HEADS = ("cls.predictions.",)
# Architectures whose encoder output is the checkpoint's own output: the bare encoder, and a
# masked-LM model used as an encoder. Any other (ForSequenceClassification, ForQuestionAnswering,
# ForPreTraining, ...) ends in a head whose output the export would silently drop.
ENCODER_ARCHITECTURES = ("BertModel", "BertForMaskedLM")


@dataclass(frozen=True)
class WeightNames:
    """Where a family's checkpoints keep the encoder's weights, and the keys they carry that it does not use."""
    task_prefix: str
    encoder_parts: tuple[str, ...]
    unused_heads: tuple[str, ...]
    ignored: tuple[str, ...]


BERT_WEIGHTS = WeightNames(TASK_PREFIX, ENCODER_PARTS, UNUSED_HEADS, IGNORED_KEYS)
MODERNBERT_WEIGHTS = WeightNames(modernbert.TASK_PREFIX, modernbert.ENCODER_PARTS, modernbert.UNUSED_HEADS, ())


@dataclass(frozen=True)
class Checkpoint:
    directory: Path
    name: str
    config: EncoderConfig | ModernBertConfig
    pipeline: Pipeline  # the sentence-transformers modules after the encoder, the prompts, max_seq_length

    @property
    def pooling(self) -> str:
        """The manifest's name of the pooling: "mean", "cls", or several modes joined by "+"."""
        return self.pipeline.pooling_name

    @property
    def normalize(self) -> bool:
        """Whether the checkpoint's pipeline ends in L2 normalisation."""
        return self.pipeline.normalize

    @property
    def max_seq_length(self) -> int:
        """Inputs are truncated to this many tokens, specials included."""
        return self.pipeline.max_seq_length

    @property
    def max_seq_length_from(self) -> str:
        """Where max_seq_length came from: "sentence_bert_config.json", or "tokenizer" (its model_max_length,
        capped at the model's positions), which the export checks against transformers' own tokenizer."""
        return self.pipeline.max_seq_length_from

    @property
    def embedding_size(self) -> int:
        """The size of the sentence embedding: the hidden size, times the pooling modes, or a Dense's output."""
        return self.pipeline.embedding_size(self.config.hidden_size)

    @property
    def modules(self) -> list[str]:
        """The whole pipeline in short words, for the manifest and the export's log."""
        family = getattr(self.config, "model_type", "bert")
        if self.kind == "reranker":
            return [f"Transformer({family})", f"Classifier({self.num_labels}, {self.score_activation})"]
        return self.pipeline.modules(family)
    kind: str = "embedder"  # or "reranker": a BertForSequenceClassification checkpoint (heads.py)
    num_labels: int = 0  # a reranker's classifier outputs
    score_activation: str | None = None  # a reranker's CrossEncoder activation (heads.ACTIVATIONS)

    @property
    def weights_file(self) -> Path:
        return self.directory / "model.safetensors"

    @property
    def tokenizer_file(self) -> Path:
        return self.directory / "tokenizer.json"


def _encoder_config(raw: dict, path: Path) -> EncoderConfig:
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    if raw.get("model_type") != "bert":
        raise CheckpointError(f"{path}: model_type {raw.get('model_type')!r} is not supported (only 'bert' or "
                              f"'{modernbert.MODEL_TYPE}')")
    if raw.get("hidden_act", "gelu") != "gelu":
        raise CheckpointError(f"{path}: hidden_act {raw['hidden_act']!r} is not supported (only 'gelu')")
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(f"{path}: only absolute position embeddings are supported")
    architectures = raw.get("architectures") or []
    if not isinstance(architectures, list):
        raise CheckpointError(f"{path}: architectures must be a list, got {architectures!r}")
    heads_ = [a for a in architectures if a not in ENCODER_ARCHITECTURES]
    if heads_ == [heads.RERANKER_ARCHITECTURES[0]] and len(architectures) == 1:
        heads_ = []  # the classifier head is exported as a reranker (heads.py)
    if heads_:
        raise CheckpointError(f"{path}: cannot reproduce architecture {heads_[0]} (the export runs the bare encoder: "
                              f"{' or '.join(ENCODER_ARCHITECTURES)}, or a reranker: "
                              f"{' or '.join(heads.RERANKER_ARCHITECTURES)})")
    if raw.get("is_decoder"):
        raise CheckpointError(f"{path}: cannot reproduce is_decoder true (causal attention)")
    try:
        cfg = EncoderConfig(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=int(raw["num_attention_heads"]),
            intermediate_size=int(raw["intermediate_size"]),
            max_position_embeddings=int(raw["max_position_embeddings"]),
            type_vocab_size=int(raw.get("type_vocab_size", 2)),
            layer_norm_eps=float(raw.get("layer_norm_eps", 1e-12)),
            pad_token_id=int(raw.get("pad_token_id", 0)),
        )
    except KeyError as e:
        raise CheckpointError(f"{path}: missing field {e.args[0]!r}") from None
    except (TypeError, ValueError, AssertionError, ZeroDivisionError) as e:
        raise CheckpointError(f"{path}: invalid config: {e}") from None
    sizes = {k: v for k, v in vars(cfg).items() if k not in ("pad_token_id", "layer_norm_eps")}
    if any(v < 1 for v in sizes.values()) or not cfg.layer_norm_eps > 0:
        raise CheckpointError(f"{path}: invalid config: sizes must be positive and layer_norm_eps above 0, got {sizes}"
                              f" and {cfg.layer_norm_eps}")
    return cfg


def _weight_names(cfg: EncoderConfig | ModernBertConfig) -> WeightNames:
    return MODERNBERT_WEIGHTS if isinstance(cfg, ModernBertConfig) else BERT_WEIGHTS


def _encoder_prefix(keys: list[str], names: WeightNames) -> str:
    return names.task_prefix if any(k.startswith(names.task_prefix) for k in keys) else ""


def _head_keys(keys: list[str], names: WeightNames) -> list[str]:
    """Keys outside the encoder that are not an unused masked-LM head: the weights of a task head."""
    prefix = _encoder_prefix(keys, names)
    return [k for k in keys if not k.startswith(names.unused_heads)
            and not (k.startswith(prefix) and k.removeprefix(prefix).startswith(names.encoder_parts))]


def _check_no_head(weights: Path, names: WeightNames, allowed: tuple[str, ...] = ()) -> None:
    """Read the safetensors header only (no tensor data) and refuse a checkpoint that carries a task head other
    than exactly `allowed` (a reranker's classifier keys)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(weights), framework="numpy") as f:
            keys = list(f.keys())
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"corrupt weights file {weights}: {e}") from None
    heads = _head_keys(keys, names)
    if allowed and sorted(heads) != sorted(allowed):
        raise CheckpointError(f"{weights}: a BertForSequenceClassification checkpoint must hold exactly the "
                              f"classifier head {', '.join(allowed)} outside the encoder, got {sorted(heads)[:5]}")
    if heads and not allowed:
        modules = sorted({k.rsplit(".", 1)[0] for k in heads})
        raise CheckpointError(f"{weights}: cannot reproduce the head {', '.join(m + '.*' for m in modules[:3])}"
                              f"{'...' if len(modules) > 3 else ''} ({len(heads)} tensors outside the encoder)")


def read_checkpoint(directory: str | Path, name: str | None = None) -> Checkpoint:
    """Read a checkpoint's metadata, check that every file serving needs is there, and refuse what
    the export cannot reproduce; no weights are loaded."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {directory}")
    raw = read_json(directory / "config.json")
    # Each family reads its own config; a ModernBERT config is no BERT config with extra fields.
    is_modernbert = isinstance(raw, dict) and raw.get("model_type") == modernbert.MODEL_TYPE
    cfg = (modernbert.read_config if is_modernbert else _encoder_config)(raw, directory / "config.json")
    for required in ("model.safetensors", "tokenizer.json"):
        if not (directory / required).is_file():
            if required == "model.safetensors" and any(directory.glob("*.bin")):
                raise CheckpointError(f"{directory}: only model.safetensors is accepted, not pickle .bin weights")
            raise CheckpointError(f"checkpoint file missing: {directory / required}")
    if isinstance(cfg, EncoderConfig) and heads.is_reranker(raw.get("architectures") or []):
        return _read_reranker(directory, name, cfg, raw)
    pipeline = read_pipeline(directory, cfg.max_position_embeddings, cfg.hidden_size)
    _check_no_head(directory / "model.safetensors", _weight_names(cfg))
    return Checkpoint(directory, name or directory.name, cfg, pipeline)


def _read_reranker(directory: Path, name: str | None, cfg: EncoderConfig, raw: dict) -> Checkpoint:
    """A cross-encoder: the encoder, its pooler and classifier (heads.py), the CrossEncoder's truncation."""
    from .pipeline import _tokenizer_max_length

    spec = heads.read_reranker(directory, raw)
    _check_no_head(directory / "model.safetensors", BERT_WEIGHTS, heads.CLASSIFIER_KEYS)
    length, length_from = spec.max_seq_length, "sentence_bert_config.json"
    if length is None:
        length, length_from = _tokenizer_max_length(directory, cfg.max_position_embeddings), "tokenizer"
    if length > cfg.max_position_embeddings:
        raise CheckpointError(f"{directory}: cannot reproduce max_seq_length {length}: the model has only "
                              f"{cfg.max_position_embeddings} positions")
    # No sentence-transformers pipeline follows the classifier: the manifest's pooling says "cls" (the pooler's).
    pipeline = Pipeline(("cls",), (), False, length, length_from, {}, None)
    return Checkpoint(directory, name or directory.name, cfg, pipeline, kind="reranker", num_labels=spec.num_labels,
                      score_activation=spec.score_activation)


def key_map(cfg: EncoderConfig) -> dict[str, str]:
    """Checkpoint key (HF BertModel naming) -> Encoder key. The only place the two namings meet."""
    keys = {
        "embeddings.word_embeddings.weight": "embeddings.word.weight",
        "embeddings.position_embeddings.weight": "embeddings.position.weight",
        "embeddings.token_type_embeddings.weight": "embeddings.token_type.weight",
        "embeddings.LayerNorm.weight": "embeddings.norm.weight",
        "embeddings.LayerNorm.bias": "embeddings.norm.bias",
    }
    per_layer = {
        "attention.self.query": "attention.query",
        "attention.self.key": "attention.key",
        "attention.self.value": "attention.value",
        "attention.output.dense": "attention.out",
        "attention.output.LayerNorm": "attention_norm",
        "intermediate.dense": "feed_forward.up",
        "output.dense": "feed_forward.down",
        "output.LayerNorm": "output_norm",
    }
    for i in range(cfg.num_layers):
        for theirs, ours in per_layer.items():
            for param in ("weight", "bias"):
                keys[f"encoder.layer.{i}.{theirs}.{param}"] = f"layers.{i}.{ours}.{param}"
    return keys


def load_encoder(ckpt: Checkpoint) -> Encoder | ModernBertEncoder:
    """Build the Encoder and copy the checkpoint's weights into it, under loud checks."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(ckpt.weights_file))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"corrupt weights file {ckpt.weights_file}: {e}") from None
    # A masked-LM checkpoint prefixes the encoder's keys with "bert." and adds its (unused) head;
    # read_checkpoint has refused any other head, so every other key must be the encoder's.
    names = _weight_names(ckpt.config)
    prefix = _encoder_prefix(list(tensors), names)
    tensors = {k.removeprefix(prefix): v for k, v in tensors.items()
               if not k.startswith(names.unused_heads) and k not in heads.CLASSIFIER_KEYS}  # a reranker's: heads.py
    cfg = ckpt.config
    mapping = modernbert.key_map(cfg) if isinstance(cfg, ModernBertConfig) else key_map(cfg)
    missing = sorted(set(mapping) - set(tensors))
    unexpected = sorted(set(tensors) - set(mapping) - set(names.ignored))
    if missing or unexpected:
        family = "ModernBERT" if isinstance(cfg, ModernBertConfig) else "BERT"
        raise CheckpointError(
            f"{ckpt.weights_file}: keys do not match a {ckpt.config.num_layers}-layer {family} encoder "
            f"(missing: {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected: {unexpected[:5]}{'...' if len(unexpected) > 5 else ''})"
        )
    encoder = ModernBertEncoder(cfg) if isinstance(cfg, ModernBertConfig) else Encoder(cfg)
    own = encoder.state_dict()
    assert len(own) == len(mapping), "key map and Encoder disagree on the parameter count"
    for theirs, ours in mapping.items():
        if tensors[theirs].shape != own[ours].shape:
            raise CheckpointError(
                f"{ckpt.weights_file}: {theirs} has shape {tuple(tensors[theirs].shape)}, "
                f"expected {tuple(own[ours].shape)}"
            )
    # nn.Linear stores (out, in) exactly as HF does, so no transpose is needed.
    encoder.load_state_dict({ours: tensors[theirs].float() for theirs, ours in mapping.items()}, strict=True)
    return encoder.eval()
