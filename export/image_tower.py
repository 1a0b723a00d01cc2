"""The image tower of a CLIP or SigLIP model (model/clip.py) as ONNX graphs with a dynamic batch axis, each
verified against PyTorch before it is kept.

Graphs (pixel_values (B, C, S, S) float32 in; S is fixed by the model. SigLIP 2's NaFlex towers take each image at
its own size instead: pixel_values (B, N, C * P * P) flattened patches, pixel_attention_mask (B, N) int64 and
spatial_shapes (B, 2) int64, N dynamic too):
- image_embeds.onnx: image_embeds (B, D) and last_hidden_state (B, T, H);
- image_embeds_fp16.onnx: the same in fp16 inside (onnxruntime's converter; inputs and outputs stay fp32);
- image_embeds_int8.onnx: weights int8 per output channel, activations quantised at run time (the patch
  projection, a Conv, stays fp32);
- image_attention.onnx: with attentions (L, B, nh, T, T) and value_norms (L, B, nh, T) too: the maps over the
  patches the explorer draws;
- image_embeds_bf16: image_embeds.onnx run by OpenVINO in bf16, as the text tower's bf16 variant (where OpenVINO is
  installed and the CPU computes bf16 natively: only there can it be verified).
Each is run on check batches of 1, 2 and 5 random images (NaFlex: of sizes from one patch to the processor's most,
wide and tall, the batches padded) and compared with PyTorch's outputs on the same pixels, at each image's own
positions:
fp32 to 1e-4 in the hidden states and a cosine of 0.99999 in the embeddings; fp16 and bf16 a min cosine of 0.999
(the text graphs' bar for them); int8 a mean cosine of 0.99 and a min of 0.98. A graph off its bar is an
ExportVerificationError, not a file.

Shapes: B batch, C channels, S image side, T patches (and the class token), H hidden, D the shared space,
L layers, nh heads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn as nn

from attnserve.engine.image_processor import image_processor_in, processor_config_in
from attnserve.engine.machine import this_machine
from attnserve.engine.manifest import sha256_of
from attnserve.engine.openvino_session import openvino_available
from attnserve.engine.session import CHECK_SPIN, CPU, OPENVINO, open_graph
from attnserve.errors import CheckpointError, ExportVerificationError
from attnserve.model.clip import ImageTextModel, load_image_text_model
from attnserve.model.value_norms import keep_value_norms

from .external_data import external_files
from .isolated import run as run_isolated
from .torch_to_onnx import trace

CHECK_BATCHES = (1, 2, 5)
GRAPHS = {"image_embeds": "fp32", "image_embeds_fp16": "fp16", "image_embeds_int8": "int8",
          "image_attention": "fp32", "image_embeds_bf16": "bf16"}
# The graphs whose file is another's, run on another backend: name -> (file, backend).
SHARED = {"image_embeds_bf16": ("image_embeds", OPENVINO)}


@dataclass(frozen=True)
class Bar:
    min_cosine: float
    mean_cosine: float
    max_abs_hidden: float | None  # fp32 only


BARS = {"fp32": Bar(0.99999, 0.99999, 1e-4), "fp16": Bar(0.999, 0.999, None), "bf16": Bar(0.999, 0.999, None),
        "int8": Bar(0.98, 0.99, None)}


def graph_names() -> tuple[str, ...]:
    """The graphs export builds here: bf16 only where OpenVINO is installed and the CPU computes bf16 natively."""
    return tuple(name for name in GRAPHS if name != "image_embeds_bf16" or (
        openvino_available() and this_machine().native_bf16))


class ImageTower(nn.Module):
    """The traced module: the vision tower and its projection into the shared space."""

    def __init__(self, model: ImageTextModel, output_attentions: bool = False):
        super().__init__()
        self.vision, self.projection = model.vision, model.visual_projection
        self.output_attentions = output_attentions

    def forward(self, pixel_values: torch.Tensor, pixel_attention_mask: torch.Tensor | None = None,
                spatial_shapes: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        keep_value_norms(self.vision, self.output_attentions)
        hidden, pooled, attentions = self.vision(pixel_values, output_attentions=self.output_attentions,
                                                 patch_mask=pixel_attention_mask, spatial_shapes=spatial_shapes)
        embeds = pooled if self.projection is None else self.projection(pooled)  # (B, D)
        if attentions is None:
            return embeds, hidden
        return embeds, hidden, attentions, self.vision.value_norms()


Feed = dict[str, np.ndarray]  # a graph's inputs by name


def check_pixels(cfg_side: int, channels: int, seed: int = 0) -> list[Feed]:
    """The check batches: pixels as the preprocessing gives them (normalised, about -2..2)."""
    rng = np.random.default_rng(seed)
    return [{"pixel_values": rng.normal(size=(b, channels, cfg_side, cfg_side)).astype(np.float32)}
            for b in CHECK_BATCHES]


def naflex_feed(shapes: list[tuple[int, int]], patch_pixels: int, rng: np.random.Generator) -> Feed:
    """A NaFlex batch of images of rows x cols patches each, padded to the most: flattened patches (B, N, C*P*P),
    their mask (B, N) and spatial_shapes (B, 2)."""
    n = max(r * c for r, c in shapes)
    pixels = np.zeros((len(shapes), n, patch_pixels), dtype=np.float32)
    mask = np.zeros((len(shapes), n), dtype=np.int64)
    for i, (r, c) in enumerate(shapes):
        pixels[i, :r * c] = rng.normal(size=(r * c, patch_pixels))
        mask[i, :r * c] = 1
    return {"pixel_values": pixels, "pixel_attention_mask": mask, "spatial_shapes": np.array(shapes, dtype=np.int64)}


def naflex_checks(max_patches: int, patch_pixels: int, seed: int = 0) -> list[Feed]:
    """The check batches of a NaFlex tower: one patch, the most patches in one wide and one tall row of sizes, and
    sizes between, so that the position grid is resized up and down along each axis."""
    rng = np.random.default_rng(seed)
    side = max(1, int(max_patches ** 0.5))
    wide = (max(1, max_patches // (2 * side)), 2 * side)
    sizes = [[(side, max_patches // side)], [(1, 1), wide],
             [wide[::-1], (1, min(max_patches, 7)), (2, max(1, max_patches // 2 // 3)), (side, 1), (side, side)]]
    return [naflex_feed(batch, patch_pixels, rng) for batch in sizes]


def export_image_tower(model: ImageTextModel, out: Path, names: tuple[str, ...] | None = None,
                       max_patches: int = 0) -> dict[str, dict[str, float]]:
    """The graphs `names` (keys of GRAPHS) of the model's image tower in `out`, each verified; returns each one's
    parity numbers (names None: graph_names()). max_patches: a NaFlex tower's most patches an image (its
    processor's), which its checks span."""
    names = graph_names() if names is None else names
    out.mkdir(parents=True, exist_ok=True)
    cfg = model.config.vision
    if cfg.variable_resolution:
        checks = naflex_checks(max_patches or cfg.num_patches, cfg.num_channels * cfg.patch_size ** 2)
    else:
        checks = check_pixels(cfg.image_size, cfg.num_channels)
    with torch.no_grad():
        expected = [tuple(t.numpy() for t in ImageTower(model, True)(**{k: torch.from_numpy(v) for k, v in f.items()}))
                    for f in checks]
    parities = {}
    plain = out / "image_embeds.onnx"
    _trace(ImageTower(model), plain, checks[1], attentions=False)
    for name in names:
        path = out / f"{SHARED.get(name, (name,))[0]}.onnx"
        if name == "image_attention":
            _trace(ImageTower(model, output_attentions=True), path, checks[1], True)
        elif name == "image_embeds_fp16":
            run_isolated("the image tower's fp16 conversion", f"{__name__}:_convert_fp16",
                         {"src": str(plain), "dst": str(path)})
        elif name == "image_embeds_int8":
            run_isolated("the image tower's int8 quantization", f"{__name__}:_quantize_int8",
                         {"src": str(plain), "dst": str(path)})
        parities[name] = verify_image_graph(path, GRAPHS[name], checks, expected,
                                            SHARED.get(name, (name, "onnxruntime"))[1])
    if "image_embeds" not in names and not any(SHARED.get(n, ("",))[0] == "image_embeds" for n in names):
        for file in out.glob("image_embeds.onnx*"):
            file.unlink()
    return parities


def _trace(module: ImageTower, path: Path, example: Feed, attentions: bool) -> None:
    """example: a check batch of two images (the batch axis, and a NaFlex batch's patch axis, traced as such)."""
    outputs = ["image_embeds", "last_hidden_state"] + (["attentions", "value_norms"] if attentions else [])
    inputs = list(example)
    if "spatial_shapes" not in example:  # one image size: only the batch axis varies
        axes = {"pixel_values": {0: "batch"}, "image_embeds": {0: "batch"}, "last_hidden_state": {0: "batch"},
                "attentions": {1: "batch"}, "value_norms": {1: "batch"}}
    else:  # NaFlex: N, the batch's most patches, varies too
        axes = {"pixel_values": {0: "batch", 1: "patches"}, "pixel_attention_mask": {0: "batch", 1: "patches"},
                "spatial_shapes": {0: "batch"}, "image_embeds": {0: "batch"},
                "last_hidden_state": {0: "batch", 1: "patches"},
                "attentions": {1: "batch", 3: "patches", 4: "patches"}, "value_norms": {1: "batch", 3: "patches"}}
    args = tuple(torch.from_numpy(example[name]) for name in inputs)
    trace(module.eval(), args, inputs, outputs, {k: v for k, v in axes.items() if k in outputs or k in inputs},
          path)


def _convert_fp16(src: str, dst: str) -> dict[str, int]:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(src)  # the image tower's weights: a few hundred MB at most
    half = convert_float_to_float16(model, keep_io_types=True)
    onnx.save_model(half, dst, save_as_external_data=True, location=Path(dst).name + ".data")
    return {}


POSITIONS = "vision.embeddings.position_embedding.weight"  # the initializer's name in the traced graph


def _quantize_int8(src: str, dst: str) -> dict[str, int]:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from .int8_recipes import weight_type

    # A NaFlex tower's position embeddings are resized by a MatMul of interpolation weights: kept fp32, since
    # an image's positions are what tell its patches apart.
    graph = onnx.load(src, load_external_data=False).graph
    resize = [n.name for n in graph.node if n.op_type == "MatMul" and POSITIONS in n.input]
    quantize_dynamic(src, dst, weight_type=getattr(QuantType, weight_type()), per_channel=True,
                     op_types_to_quantize=["MatMul"], use_external_data_format=True, nodes_to_exclude=resize)
    return {}


def verify_image_graph(path: Path, precision: str, checks: list[Feed],
                       expected: list[tuple[np.ndarray, ...]], backend: str = "onnxruntime") -> dict[str, float]:
    """The graph's outputs on the check batches against PyTorch's, held to its precision's bar: each image's
    states and maps at its own positions (a NaFlex batch's padding is no image's)."""
    session = open_graph(path, backend, precision, CPU, spin=CHECK_SPIN)
    wanted = list(GRAPH_OUTPUTS["image_attention" if path.stem == "image_attention" else "image_embeds"])
    cosines, worst_hidden, worst_maps = [], 0.0, 0.0
    for feed, (embeds, hidden, attentions, _) in zip(checks, expected, strict=True):
        got = dict(zip(wanted, session.run(wanted, feed), strict=True))
        a, b = got["image_embeds"].astype(np.float64), embeds.astype(np.float64)
        cosines.extend((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1))
        counts = feed["pixel_attention_mask"].sum(1) if "pixel_attention_mask" in feed else \
            np.full(len(embeds), hidden.shape[1])
        for i, n in enumerate(counts.tolist()):
            worst_hidden = max(worst_hidden, float(np.abs(got["last_hidden_state"][i, :n] - hidden[i, :n]).max()))
            if "attentions" in got:
                worst_maps = max(worst_maps, float(np.abs(got["attentions"][:, i, :, :n, :n]
                                                          - attentions[:, i, :, :n, :n]).max()))
    bar = BARS[precision]
    parity = {"min_cosine_image_embeds": float(min(cosines)), "mean_cosine_image_embeds": float(np.mean(cosines)),
              "max_abs_last_hidden_state": worst_hidden, "images_checked": float(len(cosines))}
    if "attentions" in wanted:
        parity["max_abs_attentions"] = worst_maps
    failed = []
    if parity["min_cosine_image_embeds"] < bar.min_cosine:
        failed.append(f"min cosine {parity['min_cosine_image_embeds']:.6f} < {bar.min_cosine}")
    if parity["mean_cosine_image_embeds"] < bar.mean_cosine:
        failed.append(f"mean cosine {parity['mean_cosine_image_embeds']:.6f} < {bar.mean_cosine}")
    if bar.max_abs_hidden is not None and worst_hidden > bar.max_abs_hidden:
        failed.append(f"max abs last_hidden_state {worst_hidden:.2e} > {bar.max_abs_hidden}")
    if bar.max_abs_hidden is not None and worst_maps > 1e-5:
        failed.append(f"max abs attentions {worst_maps:.2e} > 1e-05")
    if failed:
        raise ExportVerificationError(f"{path.name} ({precision}) fails parity with PyTorch: {'; '.join(failed)}")
    return parity


PROCESSOR_FILE = "preprocessor_config.json"
GRAPH_OUTPUTS = {"image_embeds": ("image_embeds", "last_hidden_state"),
                 "image_attention": ("image_embeds", "last_hidden_state", "attentions", "value_norms")}


def image_artifacts(checkpoint: Path, work: Path, log) -> dict:
    """An image-text checkpoint's image tower into the artifact directory being built (`work`): every graph of
    GRAPHS, verified, and its preprocessing; returns the manifest's `images` entry (engine/manifest.py)."""
    processor = image_processor_in(checkpoint)  # what it cannot reproduce is refused before any weight is read
    raw_processor, _ = processor_config_in(checkpoint)
    model = load_image_text_model(checkpoint)
    cfg = model.config
    side, patch = cfg.vision.image_size, cfg.vision.patch_size
    max_patches = 0
    if cfg.vision.variable_resolution:  # NaFlex: the processor's patches are the tower's, as many as it says
        if processor.patches is None or processor.patches[0] != patch:
            given = f"patches of {processor.patches[0]} px" if processor.patches else "whole images"
            raise CheckpointError(f"{checkpoint}: a {cfg.family} image tower takes images in patches of {patch} px, "
                                  f"and its image processor gives {given}")
        max_patches = processor.patches[1]
    elif processor.output_side != (side, side):
        raise CheckpointError(f"{checkpoint}: the image processor gives {processor.output_side or 'images of any size'}"
                              f", not the {side} x {side} the image tower takes")
    sizes = f"up to {max_patches} patches an image, of" if max_patches else f"{cfg.vision.num_patches} patches of"
    log(f"exporting the image tower ({cfg.vision.num_layers} layers, hidden {cfg.vision.hidden_size}, "
        f"{sizes} {patch} px): {', '.join(GRAPHS)}")
    parities = export_image_tower(model, work, max_patches=max_patches)
    for name, parity in parities.items():
        log(f"verified {name}.onnx  min cosine {parity['min_cosine_image_embeds']:.6f} ({GRAPHS[name]})")
    (work / PROCESSOR_FILE).write_text(json.dumps(raw_processor, indent=2) + "\n", encoding="utf-8")
    with torch.no_grad():
        scale = float(model.logit_scale.exp().reshape(()))
        bias = None if model.logit_bias is None else float(model.logit_bias.reshape(()))
    return {
        "graphs": {name: _entry(work, name, parity) for name, parity in parities.items()},
        "processor": {"file": PROCESSOR_FILE, "sha256": sha256_of(work / PROCESSOR_FILE)},
        "image_size": side, "patch_size": cfg.vision.patch_size, "num_channels": cfg.vision.num_channels,
        "class_token": cfg.vision.class_token, "hidden_size": cfg.vision.hidden_size,
        "num_layers": cfg.vision.num_layers, "num_heads": cfg.vision.num_heads,
        "embedding_size": cfg.projection_dim, "logit_scale": scale, "logit_bias": bias,
        "zero_shot": "sigmoid" if cfg.siglip else "softmax", "max_patches": max_patches,
    }


def _entry(work: Path, name: str, parity: dict[str, float]) -> dict:
    """A graph's entry in the manifest's images: its file (another graph's, for bf16) and what runs it."""
    file, backend = SHARED.get(name, (name, "onnxruntime"))
    path = work / f"{file}.onnx"
    return {"file": path.name, "sha256": sha256_of(path), "precision": GRAPHS[name],
            "outputs": list(GRAPH_OUTPUTS["image_attention" if name == "image_attention" else "image_embeds"]),
            "data_files": {f: sha256_of(work / f) for f in external_files(path)}, "parity": parity,
            **({"backend": backend} if backend != "onnxruntime" else {})}
