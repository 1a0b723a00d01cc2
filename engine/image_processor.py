"""An image -> the pixel values its model takes, as the checkpoint's preprocessor_config.json says, equal to
transformers' image processor (CLIPImageProcessor, SiglipImageProcessor; their Pillow backend) to the bit.

The steps are transformers' own, in its order and arithmetic, done with Pillow and numpy:
1. convert to RGB, compositing any transparency over white (image_transforms.convert_to_rgb);
2. resize with Pillow (its resample filter): the shortest edge to `size.shortest_edge`, the other edge scaled
   and truncated to an integer (CLIP), or to `size.height` x `size.width` (SigLIP);
   or (SigLIP 2's NaFlex, Siglip2ImageProcessor) to the largest size of whole patches, its aspect ratio kept, that
   has at most max_num_patches patches (get_image_size_for_max_num_patches);
3. center crop to crop_size, padding with zeros where the image is smaller (np_center_crop);
4. rescale: uint8 -> float64 x rescale_factor -> float32;
5. normalize: (x - mean) / std in float32, per channel.
SigLIP 2's processor then cuts the image into flattened patches (engine/image_encoder.py's `flat_patches`, where
a batch is assembled): the pixels here stay (C, H, W).
A setting it does not reproduce (padding, another processor class, a longest edge) is refused in one line when
the model is read, not met by a request.

Shapes: C channels (3), H and W the image's height and width, S the side the tower takes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from attnserve.errors import CheckpointError

PROCESSOR_TYPES = ("CLIPImageProcessor", "CLIPImageProcessorFast", "CLIPFeatureExtractor", "SiglipImageProcessor",
                   "SiglipImageProcessorFast", "Siglip2ImageProcessor", "Siglip2ImageProcessorFast")
# Keys that do not change the pixels.
FREE_KEYS = {"image_processor_type", "feature_extractor_type", "processor_class", "default_to_square",
             "_valid_processor_keys", "image_seq_length"}
KNOWN_KEYS = {"do_resize", "size", "resample", "do_center_crop", "crop_size", "do_rescale", "rescale_factor",
              "do_normalize", "image_mean", "image_std", "do_convert_rgb", "do_pad"} | FREE_KEYS
NAFLEX_KEYS = {"patch_size", "max_num_patches"}  # Siglip2ImageProcessor's own: another class's file is refused them
RESAMPLE = {int(f): f for f in Image.Resampling}  # 0 NEAREST ... 5 LANCZOS, as transformers' PILImageResampling


@dataclass(frozen=True)
class ImageProcessor:
    shortest_edge: int | None  # resize the shortest edge to this (CLIP) ...
    size: tuple[int, int] | None  # ... or to (height, width) (SigLIP); both None: no resize
    resample: Image.Resampling
    crop: tuple[int, int] | None  # (height, width) of the center crop, or None
    rescale_factor: float | None  # None: no rescale
    mean: tuple[float, ...] | None  # None: no normalize
    std: tuple[float, ...] | None
    # SigLIP 2's NaFlex: (patch side P, max_num_patches): each image resized to whole patches, at most that many.
    patches: tuple[int, int] | None = None

    @property
    def output_side(self) -> tuple[int, int] | None:
        """(height, width) of every output, or None where it follows the image (no crop, shortest-edge resize,
        NaFlex)."""
        return None if self.patches is not None else self.crop or self.size

    def pixels(self, image: Image.Image) -> np.ndarray:
        """A decoded image (attnserve/images.py) -> (C, S, S) float32 (NaFlex: (C, H, W), H and W whole patches)."""
        rgb = to_rgb(image)
        if self.patches is not None:
            height, width = size_for_max_patches(rgb.height, rgb.width, *self.patches)
            rgb = rgb.resize((width, height), resample=self.resample)
        elif self.shortest_edge is not None:
            rgb = rgb.resize(shortest_edge_size(rgb.size, self.shortest_edge), resample=self.resample)
        elif self.size is not None:
            rgb = rgb.resize((self.size[1], self.size[0]), resample=self.resample)
        x = np.moveaxis(np.asarray(rgb), -1, 0)  # (H, W, C) uint8 -> (C, H, W)
        if self.crop is not None:
            x = center_crop(x, self.crop)
        if self.rescale_factor is not None:
            x = (x.astype(np.float64) * self.rescale_factor).astype(np.float32)
        if self.mean is not None and self.std is not None:
            x = x if np.issubdtype(x.dtype, np.floating) else x.astype(np.float32)
            mean, std = np.array(self.mean, dtype=x.dtype), np.array(self.std, dtype=x.dtype)
            x = ((x.T - mean) / std).T  # transformers' own form: the same float32 operations
        return np.ascontiguousarray(x, dtype=np.float32)


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB, any transparency composited over white, as transformers' convert_to_rgb."""
    if image.mode == "RGB":
        return image
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def shortest_edge_size(size: tuple[int, int], shortest: int) -> tuple[int, int]:
    """(width, height) with the shorter side `shortest` and the other scaled and truncated, as transformers'
    get_resize_output_image_size(default_to_square=False)."""
    width, height = size
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(shortest * long / short)
    return (shortest, new_long) if width <= height else (new_long, shortest)


def size_for_max_patches(height: int, width: int, patch: int, max_patches: int, eps: float = 1e-5
                         ) -> tuple[int, int]:
    """(height, width) in whole patches of `patch` px, at least one each way, at most max_patches in all, the
    image's aspect ratio kept as near as whole patches allow: transformers' get_image_size_for_max_num_patches, its
    binary search over the scale step for step (so that its sizes are these)."""
    def scaled(scale: float, size: int) -> int:
        return max(patch, math.ceil(size * scale / patch) * patch)

    low, high = eps / 10, 100.0
    while high - low >= eps:
        scale = (low + high) / 2
        if (scaled(scale, height) / patch) * (scaled(scale, width) / patch) <= max_patches:
            low = scale
        else:
            high = scale
    return scaled(low, height), scaled(low, width)


def center_crop(x: np.ndarray, crop: tuple[int, int]) -> np.ndarray:
    """(C, H, W) -> (C, crop height, crop width), zero-padded where the image is smaller (transformers'
    center_crop)."""
    height, width = x.shape[-2:]
    crop_height, crop_width = crop
    top, left = (height - crop_height) // 2, (width - crop_width) // 2
    if top >= 0 and left >= 0:
        return x[..., top:top + crop_height, left:left + crop_width]
    new_height, new_width = max(crop_height, height), max(crop_width, width)
    padded = np.zeros(x.shape[:-2] + (new_height, new_width), dtype=x.dtype)
    top_pad, left_pad = -(-(new_height - height) // 2), -(-(new_width - width) // 2)  # ceil
    padded[..., top_pad:top_pad + height, left_pad:left_pad + width] = x
    top, left = top + top_pad, left + left_pad
    return padded[..., max(0, top):min(new_height, top + crop_height), max(0, left):min(new_width, left + crop_width)]


# Where a checkpoint keeps its image preprocessing: transformers' own file, or (transformers 5 and
# sentence-transformers 5.4 and later) the processor's file, under "image_processor".
PREPROCESSOR_CONFIG, PROCESSOR_CONFIG = "preprocessor_config.json", "processor_config.json"


def image_processor_in(directory: Path) -> ImageProcessor:
    """The ImageProcessor of a checkpoint directory, read where transformers 5 reads it: processor_config.json's
    image_processor where it has one, else preprocessor_config.json."""
    raw, path = processor_config_in(directory)
    return _processor(raw, path)


def processor_config_in(directory: Path) -> tuple[dict, Path]:
    """The image processor's settings as the checkpoint holds them (what export copies beside the graphs as
    preprocessor_config.json), and the file they are in."""
    path = directory / PROCESSOR_CONFIG
    if path.exists():
        raw = _read_object(path)
        if "image_processor" in raw:
            if not isinstance(raw["image_processor"], dict):
                raise CheckpointError(f"{path}: image_processor must be an object")
            return raw["image_processor"], path
    path = directory / PREPROCESSOR_CONFIG
    return _read_object(path), path


def read_image_processor(path: Path) -> ImageProcessor:
    """preprocessor_config.json -> its ImageProcessor, or CheckpointError naming what it cannot reproduce."""
    return _processor(_read_object(path), path)


def _read_object(path: Path) -> dict:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file missing: {path} (an image model's preprocessing)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint file unreadable: {path}: {e}") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return raw


def _processor(raw: dict, path: Path) -> ImageProcessor:
    kind = raw.get("image_processor_type") or raw.get("feature_extractor_type")
    if kind not in PROCESSOR_TYPES:
        raise CheckpointError(f"{path}: cannot reproduce image processor {kind!r} (only {', '.join(PROCESSOR_TYPES)})")
    siglip, naflex = kind.startswith("Siglip"), kind.startswith("Siglip2")
    unknown = sorted(set(raw) - KNOWN_KEYS - (NAFLEX_KEYS if naflex else set()))
    if unknown:
        raise CheckpointError(f"{path}: cannot reproduce the image processor setting {unknown[0]!r}")
    if raw.get("do_pad"):
        raise CheckpointError(f"{path}: cannot reproduce do_pad true")
    # The class's defaults where the file leaves a setting out (transformers' CLIPImageProcessor,
    # SiglipImageProcessor and Siglip2ImageProcessor).
    defaults: dict[str, Any] = {"do_resize": True, "resample": 2 if naflex else 3, "do_center_crop": not siglip,
                                "do_rescale": True, "patch_size": 16, "max_num_patches": 256,
                                "rescale_factor": 1 / 255, "do_normalize": True,
                                "size": {"height": 224, "width": 224} if siglip else {"shortest_edge": 224},
                                "crop_size": {"height": 224, "width": 224},
                                "image_mean": [0.5] * 3 if siglip else [0.48145466, 0.4578275, 0.40821073],
                                "image_std": [0.5] * 3 if siglip else [0.26862954, 0.26130258, 0.27577711]}
    settings = {**defaults, **{k: v for k, v in raw.items() if v is not None}}
    try:
        patches = None
        if naflex:  # every image resized to its patches: no size, no crop (transformers' class ignores both)
            if not settings["do_resize"]:
                raise ValueError("do_resize false (a NaFlex image must be resized to whole patches)")
            patches = (_positive(settings["patch_size"]), _positive(settings["max_num_patches"]))
            settings.update(do_center_crop=False)
        shortest, size = _size(settings["size"]) if settings["do_resize"] and not naflex else (None, None)
        crop = _side(settings["crop_size"]) if settings["do_center_crop"] else None
        resample = RESAMPLE[int(settings["resample"])]
        factor = float(settings["rescale_factor"]) if settings["do_rescale"] else None
        mean = std = None
        if settings["do_normalize"]:
            mean, std = _triple(settings["image_mean"]), _triple(settings["image_std"])
            if min(std) <= 0:
                raise ValueError(f"image_std {std} must be above 0")
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: invalid image processor setting: {e}") from None
    return ImageProcessor(shortest, size, resample, crop, factor, mean, std, patches)


def _size(value: Any) -> tuple[int | None, tuple[int, int] | None]:
    if isinstance(value, int) and not isinstance(value, bool):  # an old file's int: the shortest edge
        return _positive(value), None
    if isinstance(value, dict) and set(value) == {"shortest_edge"}:
        return _positive(value["shortest_edge"]), None
    if isinstance(value, dict) and set(value) == {"height", "width"}:
        return None, (_positive(value["height"]), _positive(value["width"]))
    raise ValueError(f"size {value!r} (only shortest_edge, or height and width)")


def _side(value: Any) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return _positive(value), _positive(value)
    if isinstance(value, dict) and set(value) == {"height", "width"}:
        return _positive(value["height"]), _positive(value["width"])
    raise ValueError(f"crop_size {value!r} (only height and width)")


def _positive(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{value!r} is not a positive integer")
    return value


def _triple(value: Any) -> tuple[float, ...]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (float(value),) * 3
    if isinstance(value, list) and len(value) == 3 and all(isinstance(v, (int, float)) for v in value):
        return tuple(float(v) for v in value)
    raise ValueError(f"{value!r} is not 3 numbers")
