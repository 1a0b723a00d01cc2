"""BERT-family checkpoints (config.json + model.safetensors + tokenizer.json) -> Encoder.

Only safetensors is read: a pickle checkpoint can run code on load. Weights are
copied through an explicit key map, and any key that is missing, unexpected
or of the wrong shape fails the load with the key's name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from attnserve.errors import CheckpointError

from .encoder import POOLING_MODES, Encoder, EncoderConfig

# Keys some checkpoints carry that the encoder does not use: BERT's NSP pooler
# (sentence embeddings pool the hidden states instead) and a position-id buffer.
IGNORED_KEYS = ("pooler.dense.weight", "pooler.dense.bias", "embeddings.position_ids")


@dataclass(frozen=True)
class Checkpoint:
    directory: Path
    name: str
    config: EncoderConfig
    pooling: str  # "mean" or "cls", as the sentence-transformers config says
    normalize: bool  # whether the checkpoint's pipeline ends in L2 normalisation
    max_seq_length: int  # inputs are truncated to this many tokens, specials included

    @property
    def weights_file(self) -> Path:
        return self.directory / "model.safetensors"

    @property
    def tokenizer_file(self) -> Path:
        return self.directory / "tokenizer.json"


def _read_json(path: Path) -> dict | list:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file missing: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint file unreadable: {path}: {e}") from None


def _encoder_config(raw: dict, path: Path) -> EncoderConfig:
    if raw.get("model_type") != "bert":
        raise CheckpointError(f"{path}: model_type {raw.get('model_type')!r} is not supported (only 'bert')")
    if raw.get("hidden_act", "gelu") != "gelu":
        raise CheckpointError(f"{path}: hidden_act {raw['hidden_act']!r} is not supported (only 'gelu')")
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(f"{path}: only absolute position embeddings are supported")
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
    except (TypeError, ValueError, AssertionError) as e:
        raise CheckpointError(f"{path}: invalid config: {e}") from None
    return cfg


def _pooling_and_normalize(directory: Path) -> tuple[str, bool]:
    """Read sentence-transformers' modules.json; a bare BERT checkpoint means mean pooling, no normalisation."""
    modules_file = directory / "modules.json"
    modules = _read_json(modules_file) if modules_file.exists() else []
    normalize = any(str(m.get("type", "")).endswith("Normalize") for m in modules)
    pooling_dirs = [m.get("path", "") for m in modules if str(m.get("type", "")).endswith("Pooling")]
    pooling_file = directory / (pooling_dirs[0] if pooling_dirs else "1_Pooling") / "config.json"
    if not pooling_file.exists():
        return "mean", normalize
    raw = _read_json(pooling_file)
    modes = [m for m in POOLING_MODES if raw.get(f"pooling_mode_{m}_tokens" if m == "mean" else "pooling_mode_cls_token")]
    others = [k for k, v in raw.items() if k.startswith("pooling_mode_") and v and k not in (
        "pooling_mode_mean_tokens", "pooling_mode_cls_token")]
    if len(modes) != 1 or others:
        raise CheckpointError(f"{pooling_file}: exactly one of mean or CLS pooling must be set")
    return modes[0], normalize


def read_checkpoint(directory: str | Path, name: str | None = None) -> Checkpoint:
    """Read a checkpoint's metadata and check that every file serving needs is there."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {directory}")
    cfg = _encoder_config(_read_json(directory / "config.json"), directory / "config.json")
    for required in ("model.safetensors", "tokenizer.json"):
        if not (directory / required).is_file():
            if required == "model.safetensors" and any(directory.glob("*.bin")):
                raise CheckpointError(f"{directory}: only model.safetensors is accepted, not pickle .bin weights")
            raise CheckpointError(f"checkpoint file missing: {directory / required}")
    pooling, normalize = _pooling_and_normalize(directory)
    st_config = directory / "sentence_bert_config.json"
    max_seq_length = int(_read_json(st_config).get("max_seq_length") or 0) if st_config.exists() else 0
    max_seq_length = min(max_seq_length or cfg.max_position_embeddings, cfg.max_position_embeddings)
    return Checkpoint(directory, name or directory.name, cfg, pooling, normalize, max_seq_length)


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


def load_encoder(ckpt: Checkpoint) -> Encoder:
    """Build the Encoder and copy the checkpoint's weights into it, under loud checks."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(ckpt.weights_file))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"corrupt weights file {ckpt.weights_file}: {e}") from None
    # Checkpoints saved from a task model (BertForX) prefix every key with "bert.".
    if tensors and all(k.startswith("bert.") for k in tensors if not k.startswith(("cls.", "classifier."))):
        tensors = {k.removeprefix("bert."): v for k, v in tensors.items() if k.startswith("bert.")}
    mapping = key_map(ckpt.config)
    missing = sorted(set(mapping) - set(tensors))
    unexpected = sorted(set(tensors) - set(mapping) - set(IGNORED_KEYS))
    if missing or unexpected:
        raise CheckpointError(
            f"{ckpt.weights_file}: keys do not match a {ckpt.config.num_layers}-layer BERT encoder "
            f"(missing: {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected: {unexpected[:5]}{'...' if len(unexpected) > 5 else ''})"
        )
    encoder = Encoder(ckpt.config)
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
