"""CLIP and SigLIP: an image tower and a text tower that embed into one space, read from their checkpoints.

A CLIPModel or SiglipModel checkpoint (config.json with text_config and vision_config, model.safetensors) holds
both towers (vision_transformer.py has the image tower and the pre-LayerNorm layer both are made of):
- CLIP's text tower is causal: a token sees itself and the tokens before it. Its pooled output is the state of
  the end-of-text token (the first eos_token_id; the highest token id where a config still says eos_token_id 2, as
  transformers keeps for checkpoints saved before its fix), after final_layer_norm. Both towers' pooled outputs go
  through a projection without bias (text_projection, visual_projection).
- SigLIP's text tower attends both ways; its pooled output is the last position's state (its tokenizer pads every
  text to max_position_embeddings, 64), through the text head (a Linear with bias). The image tower pools with an
  attention head and has no projection.
- The scores: cosine x exp(logit_scale) (+ logit_bias for SigLIP): CLIP's softmax over candidates, SigLIP's
  sigmoid of each (zero_shot()).

Checked against transformers' CLIPModel and SiglipModel at real configurations (tests/test_clip.py).
Shapes: B batch, T tokens, H a tower's hidden size, D the shared space's size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnserve.errors import CheckpointError

from .attention_reach import CAUSAL, EVERY_KEY, Reach
from .checkpoint_files import read_json, read_object
from .config_reading import check_architectures
from .dense import Dense
from .encoder import MASK_VALUE
from .family import Family, WeightNames
from .pipeline import Pipeline, tokenizer_max_length
from .tokenizer_files import tokenizer_json
from .uninitialised import uninitialised_weights
from .vision_transformer import ACTIVATIONS, PreNormLayer, TowerSizes, VisionConfig, VisionTransformer, run_layers
from .weights_files import Weights

# transformers' defaults where a config.json leaves a field out (CLIPTextConfig, CLIPVisionConfig,
# SiglipTextConfig, SiglipVisionConfig).
TEXT_DEFAULTS = {
    "clip": {"vocab_size": 49408, "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12,
             "num_attention_heads": 8, "max_position_embeddings": 77, "hidden_act": "quick_gelu",
             "layer_norm_eps": 1e-5, "eos_token_id": 49407, "pad_token_id": 1},
    "siglip": {"vocab_size": 32000, "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
               "num_attention_heads": 12, "max_position_embeddings": 64, "hidden_act": "gelu_pytorch_tanh",
               "layer_norm_eps": 1e-6, "eos_token_id": 49407, "pad_token_id": 1},
}
VISION_DEFAULTS = {
    "clip": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
             "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5, "image_size": 224, "patch_size": 32,
             "num_channels": 3},
    "siglip": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
               "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6, "image_size": 224, "patch_size": 16,
               "num_channels": 3, "vision_use_head": True},
    # SigLIP 2's NaFlex towers: no image size, a grid of num_patches position embeddings resized to each image.
    "siglip2": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
                "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6, "num_patches": 256, "patch_size": 16,
                "num_channels": 3, "vision_use_head": True},
}
TEXT_DEFAULTS["siglip2"] = TEXT_DEFAULTS["siglip"]  # Siglip2TextConfig's are SiglipTextConfig's
ARCHITECTURES = {"clip": ("CLIPModel",), "siglip": ("SiglipModel",), "siglip2": ("Siglip2Model",)}
# sentence-transformers' save of an image-text model: one module over the transformers checkpoint, perhaps a
# Normalize after it. Since 5.4 a Transformer at the root, whose modality_config calls these methods; before, a
# CLIPModel module in its own folder (0_CLIPModel).
ST_MODELS = ("sentence_transformers.models.CLIPModel", "sentence_transformers.models.Transformer",
             "sentence_transformers.base.modules.transformer.Transformer",
             "sentence_transformers.sentence_transformer.modules.clip_model.CLIPModel")
ST_NORMALIZE = ("sentence_transformers.models.Normalize", "sentence_transformers.base.modules.normalize.Normalize",
                "sentence_transformers.sentence_transformer.modules.normalize.Normalize")
ST_METHODS = {"text": ("get_text_features", "pooler_output"), "image": ("get_image_features", "pooler_output")}
# Keys some checkpoints carry that the towers do not use: the position-id buffers older versions saved.
IGNORED_KEYS = ("text_model.embeddings.position_ids", "vision_model.embeddings.position_ids")


@dataclass(frozen=True)
class TextConfig(TowerSizes):
    vocab_size: int
    max_position_embeddings: int
    eos_token_id: int
    causal: bool  # CLIP's; SigLIP's text tower attends both ways
    last_token_pooling: bool  # SigLIP's: the last position; CLIP's: the end-of-text token
    pad_token_id: int = 1


@dataclass(frozen=True)
class ImageTextConfig:
    """Both towers and the space they share."""

    family: str  # config.json's model_type: "clip", "siglip" or "siglip2" (NaFlex)
    text: TextConfig
    vision: VisionConfig
    projection_dim: int  # D

    @property
    def siglip(self) -> bool:
        """SigLIP's text head, pooling head and sigmoid scores (SigLIP 2's NaFlex towers are SigLIP's too)."""
        return self.family in ("siglip", "siglip2")

    # As a text family's config (family.ModelConfig): the text tower's, which export treats as any text encoder's;
    # the image tower is exported beside it (export/image_tower.py).
    @property
    def vocab_size(self) -> int:
        return self.text.vocab_size

    @property
    def hidden_size(self) -> int:
        return self.text.hidden_size

    @property
    def num_layers(self) -> int:
        return self.text.num_layers

    @property
    def num_heads(self) -> int:
        return self.text.num_heads

    @property
    def intermediate_size(self) -> int:
        return self.text.intermediate_size

    @property
    def max_position_embeddings(self) -> int:
        return self.text.max_position_embeddings

    @property
    def pad_token_id(self) -> int:
        return self.text.pad_token_id

    @property
    def usable_positions(self) -> int:
        return self.text.max_position_embeddings

    has_token_types = False


def _tower(raw: dict, key: str, defaults: dict, path: Path) -> dict[str, Any]:
    sub = raw.get(key) or {}
    if not isinstance(sub, dict):
        raise CheckpointError(f"{path}: {key} must be an object, got {type(sub).__name__}")
    values = {**defaults, **{k: v for k, v in sub.items() if k in defaults and v is not None}}
    if values["hidden_act"] not in ACTIVATIONS:
        raise CheckpointError(f"{path}: {key}.hidden_act {values['hidden_act']!r} is not supported (only "
                              f"{', '.join(sorted(ACTIVATIONS))})")
    return values


def _sizes(values: dict[str, Any]) -> dict[str, Any]:
    return {"hidden_size": int(values["hidden_size"]), "num_layers": int(values["num_hidden_layers"]),
            "num_heads": int(values["num_attention_heads"]), "intermediate_size": int(values["intermediate_size"]),
            "layer_norm_eps": float(values["layer_norm_eps"]), "hidden_act": str(values["hidden_act"])}


def read_config(raw: dict[str, Any], path: Path) -> ImageTextConfig:
    """config.json of a CLIPModel or SiglipModel checkpoint -> its ImageTextConfig, or a one-line refusal."""
    family = raw.get("model_type")
    if family not in ARCHITECTURES:
        raise CheckpointError(f"{path}: model_type {family!r} is not an image-text model (only "
                              f"{', '.join(ARCHITECTURES)})")
    check_architectures(raw, path, ARCHITECTURES[family])
    text = _tower(raw, "text_config", TEXT_DEFAULTS[family], path)
    vision = _tower(raw, "vision_config", VISION_DEFAULTS[family], path)
    try:
        text_cfg = TextConfig(**_sizes(text), vocab_size=int(text["vocab_size"]),
                              max_position_embeddings=int(text["max_position_embeddings"]),
                              eos_token_id=int(text["eos_token_id"]), causal=family == "clip",
                              last_token_pooling=family != "clip", pad_token_id=int(text["pad_token_id"]))
        siglip, naflex = family != "clip", family == "siglip2"
        if siglip and not vision.get("vision_use_head", True):
            raise CheckpointError(f"{path}: cannot reproduce vision_config.vision_use_head false (a SiglipModel "
                                  "pools with its head)")
        patch = int(vision["patch_size"])
        if naflex:  # the position embeddings' grid, g x g = num_patches, as an image side of g x P
            side = math.isqrt(int(vision["num_patches"]))
            if side * side != int(vision["num_patches"]) or side < 1:
                raise ValueError(f"vision_config.num_patches {vision['num_patches']} must be a square")
        image_size = side * patch if naflex else int(vision["image_size"])
        vision_cfg = VisionConfig(**_sizes(vision), image_size=image_size, patch_size=patch,
                                  num_channels=int(vision["num_channels"]), class_token=not siglip,
                                  pre_norm=not siglip, patch_bias=siglip, attention_pooling=siglip,
                                  variable_resolution=naflex)
        # SigLIP's space is the text head's output, which must be the image tower's width; CLIP's is projection_dim.
        projection = vision_cfg.hidden_size if siglip else int(raw.get("projection_dim", 512))
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: invalid config: {e}") from None
    for tower in (text_cfg, vision_cfg):
        if min(tower.hidden_size, tower.num_layers, tower.num_heads, tower.intermediate_size) < 1 \
                or tower.hidden_size % tower.num_heads or not tower.layer_norm_eps > 0:
            raise CheckpointError(f"{path}: invalid config: sizes must be positive, hidden_size a multiple of "
                                  f"num_attention_heads and layer_norm_eps above 0 ({tower})")
    if vision_cfg.image_size % vision_cfg.patch_size or vision_cfg.patch_size < 1 or vision_cfg.num_channels < 1:
        raise CheckpointError(f"{path}: invalid config: image_size {vision_cfg.image_size} must be a multiple of "
                              f"patch_size {vision_cfg.patch_size}")
    if siglip and raw.get("text_config", {}).get("projection_size", text_cfg.hidden_size) != vision_cfg.hidden_size:
        raise CheckpointError(f"{path}: text_config.projection_size must be the vision tower's hidden_size "
                              f"{vision_cfg.hidden_size}")
    return ImageTextConfig(family, text_cfg, vision_cfg, projection)


class TextTower(nn.Module):
    """input_ids, attention_mask (B, T) -> (last_hidden_state (B, T, H) after final_layer_norm, pooled (B, H),
    attentions (L, B, nh, T, T) or None)."""

    def __init__(self, cfg: TextConfig):
        super().__init__()
        self.config = cfg
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embedding = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.layers = nn.ModuleList(PreNormLayer(cfg) for _ in range(cfg.num_layers))
        self.final_layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def mask(self, attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """(B, T) 1 for real tokens -> additive (B, 1, T, T) or (B, 1, 1, T): padded keys, and for CLIP the keys
        after each query, get MASK_VALUE."""
        T = attention_mask.shape[1]
        masked = attention_mask[:, None, None, :] == 0  # (B, 1, 1, T)
        if self.config.causal:
            later = torch.ones(T, T, dtype=torch.bool, device=attention_mask.device).triu(1)  # (T, T)
            masked = masked | later
        return masked.to(dtype) * MASK_VALUE

    def pooled_positions(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) -> (B,): the position whose state is the text's pooled output."""
        if self.config.last_token_pooling:
            return torch.full_like(input_ids[:, 0], input_ids.shape[1] - 1)
        if self.config.eos_token_id == 2:  # transformers' legacy rule: the highest token id (CLIP's end of text)
            return input_ids.to(torch.int32).argmax(dim=-1)
        return (input_ids == self.config.eos_token_id).to(torch.int32).argmax(dim=-1)  # the first end of text

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, output_attentions: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        T = input_ids.shape[1]
        x = self.token_embedding(input_ids) + self.position_embedding.weight[:T]  # (B, T, H)
        x, attentions = run_layers(self.layers, x, self.mask(attention_mask, x.dtype), output_attentions)
        x = self.final_layer_norm(x)
        pooled = x[torch.arange(x.shape[0], device=x.device), self.pooled_positions(input_ids)]  # (B, H)
        return x, pooled, attentions


class ImageTextModel(nn.Module):
    """Both towers, their projections into the shared space (D) and the logit scale (and bias)."""

    def __init__(self, cfg: ImageTextConfig):
        super().__init__()
        self.config = cfg
        self.text = TextTower(cfg.text)
        self.vision = VisionTransformer(cfg.vision)
        D = cfg.projection_dim
        # CLIP: both projections without bias; SigLIP: the text head (with bias), the image's pooled output as is.
        self.text_projection = nn.Linear(cfg.text.hidden_size, D, bias=cfg.siglip)
        self.visual_projection = None if cfg.siglip else nn.Linear(cfg.vision.hidden_size, D, bias=False)
        shape = (1,) if cfg.siglip else ()  # as the checkpoints store them
        self.logit_scale = nn.Parameter(torch.empty(shape))
        self.logit_bias = nn.Parameter(torch.empty(shape)) if cfg.siglip else None
        self.normalize = False  # the checkpoint's pipeline normalises its embeddings (sentence-transformers')

    def text_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, T) -> (B, D), unnormalised (transformers' get_text_features)."""
        return self.text_projection(self.text(input_ids, attention_mask)[1])

    def image_features(self, pixel_values: torch.Tensor, patch_mask: torch.Tensor | None = None,
                       spatial_shapes: torch.Tensor | None = None) -> torch.Tensor:
        """(B, C, S, S) -> (B, D), unnormalised (transformers' get_image_features); NaFlex: (B, N, C * P * P) with
        patch_mask (B, N) and spatial_shapes (B, 2)."""
        pooled = self.vision(pixel_values, patch_mask=patch_mask, spatial_shapes=spatial_shapes)[1]
        return pooled if self.visual_projection is None else self.visual_projection(pooled)

    def logits_per_image(self, image_embeds: torch.Tensor, text_embeds: torch.Tensor) -> torch.Tensor:
        """(I, D), (N, D) -> (I, N): cosine x exp(logit_scale) (+ logit_bias), as transformers' forward."""
        cosine = F.normalize(image_embeds, dim=-1) @ F.normalize(text_embeds, dim=-1).T
        logits = cosine * self.logit_scale.exp()
        return logits if self.logit_bias is None else logits + self.logit_bias

    def zero_shot(self, logits_per_image: torch.Tensor) -> torch.Tensor:
        """(I, N) -> each image's label probabilities: CLIP's softmax over the labels, SigLIP's sigmoid of each."""
        return torch.sigmoid(logits_per_image) if self.config.siglip else logits_per_image.softmax(dim=-1)


def _layer_keys(theirs: str, ours: str, num_layers: int) -> dict[str, str]:
    keys = {}
    parts = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "layer_norm1", "layer_norm2", "mlp.fc1",
             "mlp.fc2")
    for i in range(num_layers):
        for part in parts:
            for param in ("weight", "bias"):
                keys[f"{theirs}.{i}.{part}.{param}"] = f"{ours}.{i}.{part}.{param}"
        for param in ("weight", "bias"):
            keys[f"{theirs}.{i}.self_attn.out_proj.{param}"] = f"{ours}.{i}.self_attn.out.{param}"
    return keys


# SigLIP's pooling head: nn.MultiheadAttention's stacked in_proj, split into q, k and v on load (load_weights).
IN_PROJ = ("vision_model.head.attention.in_proj_weight", "vision_model.head.attention.in_proj_bias")


def key_map(cfg: ImageTextConfig) -> dict[str, str]:
    """Checkpoint key -> ImageTextModel key, but for SigLIP's stacked in_proj (IN_PROJ), which load_weights splits."""
    keys = {"text_model.embeddings.token_embedding.weight": "text.token_embedding.weight",
            "text_model.embeddings.position_embedding.weight": "text.position_embedding.weight",
            "text_model.final_layer_norm.weight": "text.final_layer_norm.weight",
            "text_model.final_layer_norm.bias": "text.final_layer_norm.bias",
            "vision_model.embeddings.patch_embedding.weight": "vision.embeddings.patch_embedding.weight",
            "vision_model.embeddings.position_embedding.weight": "vision.embeddings.position_embedding.weight",
            "vision_model.post_layernorm.weight": "vision.post_layernorm.weight",
            "vision_model.post_layernorm.bias": "vision.post_layernorm.bias",
            "logit_scale": "logit_scale",
            **_layer_keys("text_model.encoder.layers", "text.layers", cfg.text.num_layers),
            **_layer_keys("vision_model.encoder.layers", "vision.layers", cfg.vision.num_layers)}
    if cfg.siglip:
        keys.update({"text_model.head.weight": "text_projection.weight", "text_model.head.bias": "text_projection.bias",
                     "vision_model.embeddings.patch_embedding.bias": "vision.embeddings.patch_embedding.bias",
                     "vision_model.head.probe": "vision.head.probe",
                     "vision_model.head.attention.out_proj.weight": "vision.head.attention.out.weight",
                     "vision_model.head.attention.out_proj.bias": "vision.head.attention.out.bias",
                     "logit_bias": "logit_bias"})
        for part in ("layernorm", "mlp.fc1", "mlp.fc2"):
            for param in ("weight", "bias"):
                keys[f"vision_model.head.{part}.{param}"] = f"vision.head.{part}.{param}"
    else:
        keys.update({"text_projection.weight": "text_projection.weight",
                     "visual_projection.weight": "visual_projection.weight",
                     "vision_model.embeddings.class_embedding": "vision.embeddings.class_embedding",
                     "vision_model.pre_layrnorm.weight": "vision.pre_layrnorm.weight",
                     "vision_model.pre_layrnorm.bias": "vision.pre_layrnorm.bias"})
    return keys


WEIGHTS = WeightNames("", ("text_model.", "vision_model.", "text_projection.", "visual_projection.", "logit_"),
                      (), IGNORED_KEYS)


@dataclass(frozen=True)
class ImageTextCheckpoint:
    directory: Path  # the transformers checkpoint: config.json, the weights, the preprocessing
    normalize: bool  # sentence-transformers' pipeline ends in Normalize: its embeddings are unit vectors


def image_text_checkpoint(directory: Path) -> ImageTextCheckpoint:
    """Where a directory's image-text checkpoint is: itself (as transformers saves it), or the folder of
    sentence-transformers' model module (modules.json); a pipeline it cannot reproduce is a one-line refusal."""
    modules = directory / "modules.json"
    if not modules.exists():
        return ImageTextCheckpoint(directory, False)
    raw = read_json(modules)
    if not isinstance(raw, list) or not raw or not all(isinstance(m, dict) for m in raw):
        raise CheckpointError(f"{modules}: expected a list of module objects")
    types = [str(m.get("type", "")) for m in raw]
    if types[0] not in ST_MODELS or any(t not in ST_NORMALIZE for t in types[1:]) or len(types) > 2:
        names = ", ".join(t.rsplit(".", 1)[-1] for t in types)
        raise CheckpointError(f"{modules}: cannot reproduce the modules {names} (an image-text model is its model "
                              "module, perhaps followed by Normalize)")
    folder = raw[0].get("path", "")
    if not isinstance(folder, str) or Path(folder).is_absolute() or ".." in Path(folder).parts:
        raise CheckpointError(f"{modules}: the model module's path {folder!r} is not a folder inside {directory}")
    inner = directory / folder
    settings = inner / "sentence_bert_config.json"
    if settings.exists():  # the Transformer's: which methods of the model give each modality's embedding
        modality = read_object(settings).get("modality_config")
        if modality is not None and _methods(modality) != ST_METHODS:
            raise CheckpointError(f"{settings}: cannot reproduce modality_config {modality!r} (an image-text "
                                  "model's embeddings are its get_text_features and get_image_features)")
    return ImageTextCheckpoint(inner, len(types) == 2)


def module_folder(directory: Path) -> Path | None:
    """The model module's folder of a legacy sentence-transformers save of an image-text model (its CLIPModel module
    in a folder of its own, 0_CLIPModel, and no config.json at the root), which is what export reads; None for any
    other directory."""
    if (directory / "config.json").exists() or not (directory / "modules.json").is_file():
        return None
    try:
        inner = image_text_checkpoint(directory).directory
    except CheckpointError:
        return None
    return inner if inner != directory and (inner / "config.json").is_file() else None


def _methods(modality: object) -> object:
    """modality_config as {modality: (method, its output)}; itself where it is not of that shape (no match)."""
    if isinstance(modality, dict) and all(isinstance(v, dict) for v in modality.values()):
        return {k: (v.get("method"), v.get("method_output_name")) for k, v in modality.items()}
    return modality


def load_image_text_model(directory: Path) -> ImageTextModel:
    """A CLIPModel or SiglipModel checkpoint's two towers, its weights read a tensor at a time (safetensors only);
    as transformers saves it, or as sentence-transformers does (image_text_checkpoint). The model's `normalize`
    says whether the checkpoint's pipeline normalises its embeddings."""
    checkpoint = image_text_checkpoint(directory)
    directory = checkpoint.directory
    cfg = read_config(read_object(directory / "config.json"), directory / "config.json")
    weights = Weights(directory)
    with uninitialised_weights():
        model = ImageTextModel(cfg)
    model = load_weights(model, {key: weights.get(key) for key in weights.keys()})
    model.normalize = checkpoint.normalize
    return model


def load_weights(model: ImageTextModel, tensors: dict[str, torch.Tensor]) -> ImageTextModel:
    """The checkpoint's tensors (by its keys) into the model, under loud key and shape checks."""
    cfg = model.config
    mapping = key_map(cfg)
    expected = set(mapping) | (set(IN_PROJ) if cfg.siglip else set())
    given = set(tensors) - set(IGNORED_KEYS)
    missing, unexpected = sorted(expected - given), sorted(given - expected)
    if missing or unexpected:
        raise CheckpointError(f"keys do not match a {cfg.family} model (missing: {missing[:5]}, unexpected: "
                              f"{unexpected[:5]})")
    state = dict(model.state_dict())
    loaded = {ours: tensors[theirs] for theirs, ours in mapping.items()}
    if cfg.siglip:  # (3H, H) and (3H,) -> q, k and v, each (H, H) and (H,)
        for key, param in zip(IN_PROJ, ("weight", "bias"), strict=True):
            for name, part in zip(("q_proj", "k_proj", "v_proj"), tensors[key].chunk(3), strict=True):
                loaded[f"vision.head.attention.{name}.{param}"] = part
    for key, tensor in loaded.items():
        if tuple(tensor.shape) != tuple(state[key].shape):
            raise CheckpointError(f"{key} has shape {tuple(tensor.shape)}, expected {tuple(state[key].shape)}")
    if set(loaded) != set(state):
        left = sorted(set(state) - set(loaded))
        raise CheckpointError(f"the {cfg.family} model's parameters left unloaded: {left[:5]}")
    model.load_state_dict({k: v.float() for k, v in loaded.items()}, strict=True)
    return model.eval()


# --- the text tower as a text family (families.py): what `attnserve export` exports as the text encoder -----------

class TextEncoder(nn.Module):
    """The text tower as every family's encoder is (family.EncoderModule): input_ids, attention_mask (B, T) ->
    (last_hidden_state (B, T, H) after final_layer_norm, attentions (L, B, nh, T, T) or None). Its pooling and
    projection are the pipeline's (text_pipeline)."""

    def __init__(self, cfg: ImageTextConfig):
        super().__init__()
        self.config = cfg
        self.text = TextTower(cfg.text)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, output_attentions: bool = False,
                token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        hidden, _, attentions = self.text(input_ids, attention_mask, output_attentions)
        return hidden, attentions

    def attention_reach(self) -> tuple[Reach, ...]:
        """CLIP's text tower is causal in every layer; SigLIP's attends to every key."""
        return (CAUSAL if self.config.text.causal else EVERY_KEY,) * len(self.text.layers)


def text_key_map(cfg: ImageTextConfig) -> dict[str, str]:
    """The text tower's keys (TextEncoder's), its projection left to the pipeline's Dense."""
    return {k: v for k, v in key_map(cfg).items() if k.startswith("text_model.") and not k.startswith(
        "text_model.head.")}


def text_pipeline(directory: Path, cfg: ImageTextConfig) -> Pipeline:
    """The text embedding as transformers' get_text_features gives it, normalised where sentence-transformers' save
    ends in Normalize:
    - CLIP: the end-of-text token's state (the tokenizer ends every text with it, so it is the last real token),
      projected without bias;
    - SigLIP: every text padded to the tower's positions (64) with the tokenizer's pad token, which the tower
      attends to as its processor's padding="max_length" has it do, the last position's state through the text head
      (a Linear with bias). The pad id is the tokenizer's own (tokenizer.json's padding), else the config's."""
    # A legacy save's model folder (module_folder): its Normalize is in the save's root, one folder up.
    root = directory.parent if module_folder(directory.parent) == directory else directory
    checkpoint = image_text_checkpoint(root)
    length = tokenizer_max_length(directory, cfg.usable_positions)
    if cfg.siglip:
        head = Dense("", cfg.text.hidden_size, cfg.projection_dim, True, "Identity", False,
                     checkpoint_keys=("text_model.head.weight", "text_model.head.bias"))
        positions = cfg.text.max_position_embeddings
        return Pipeline(("lasttoken",), (head,), checkpoint.normalize, positions, "tokenizer", {}, None,
                        pad_to=positions, pad_id=_pad_id(directory, cfg))
    projection = Dense("", cfg.text.hidden_size, cfg.projection_dim, False, "Identity", False,
                       checkpoint_keys=("text_projection.weight",))
    return Pipeline(("lasttoken",), (projection,), checkpoint.normalize, length, "tokenizer", {}, None)


def _pad_id(directory: Path, cfg: ImageTextConfig) -> int:
    """The id SigLIP's texts are padded with: the tokenizer's pad token (tokenizer.json's padding, or its added
    token named in tokenizer_config.json's pad_token), else the text config's pad_token_id."""
    tokenizer = read_json(tokenizer_json(directory))
    padding = tokenizer.get("padding") if isinstance(tokenizer, dict) else None
    if isinstance(padding, dict) and isinstance(padding.get("pad_id"), int):
        return int(padding["pad_id"])
    settings = directory / "tokenizer_config.json"
    name = read_object(settings).get("pad_token") if settings.is_file() else None
    name = name.get("content") if isinstance(name, dict) else name
    for token in tokenizer.get("added_tokens", []) if isinstance(tokenizer, dict) else []:
        if isinstance(token, dict) and token.get("content") == name and isinstance(token.get("id"), int):
            return int(token["id"])
    return cfg.text.pad_token_id


# The text families' weight names: the text tower's are the encoder's; the projection is the pipeline's Dense
# (read from the same file), the image tower and the logit scale the image export's (export/image_tower.py).
TEXT_WEIGHTS = WeightNames("", ("text_model.",), ("vision_model.", "visual_projection.", "text_projection.",
                                                  "text_model.head.", "logit_scale", "logit_bias"), IGNORED_KEYS)
FAMILIES = tuple(Family(model_type, read_config, text_key_map, TextEncoder, TEXT_WEIGHTS, pipeline=text_pipeline)
                 for model_type in ARCHITECTURES)
