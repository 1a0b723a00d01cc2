"""Image embeddings offline, from the image files' bytes to the embeddings: attnserve's engine (the image tower's
graphs exported by `attnserve export`, engine/image_encoder.py: decode, preprocess, batch) against transformers'
CLIPProcessor + CLIPModel.get_image_features on torch, and against OpenVINO through optimum-intel where it imports
(`--optimum-python`: a Python whose environment has optimum-intel; attnserve's extras do not install it, and its
transformers pin conflicts with attnserve's, so it runs in a process of its own). The same ViT-B/16-shaped CLIP
(random weights), the same JPEGs, the same batch size, one after the other in one run on this machine. Prints
images/s and the ratios against issue 36's targets: attnserve / torch >= 2, attnserve / the fastest other CPU path
>= 1.2. Measures, does not test.

    python bench/bench_images.py [--images 64] [--batch 16] [--optimum-python /path/to/venv/bin/python]
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

TORCH_ROW = "transformers CLIPProcessor + CLIPModel (torch fp32)"
OPTIMUM = "optimum-intel OVModelForZeroShotImageClassification"
# optimum-intel's rows: its default (OpenVINO's CPU plugin chooses: bf16 where the CPU computes it natively), and
# OpenVINO held to f32, the fp32-class row attnserve's fp32 graph is compared with.
OPTIMUM_HINTS = {"default": None, "f32": "f32"}


def jpegs(count: int, seed: int = 0) -> list[bytes]:
    """Photo-sized JPEGs (640 x 480), smooth gradients and noise: what the decoder and the resize see in practice."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:480, 0:640]
    out = []
    for _ in range(count):
        base = np.stack([(x * rng.uniform(0.1, 0.4) + y * rng.uniform(0.1, 0.4)) % 256 for _ in range(3)], -1)
        pixels = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def images_per_second(run, batches: list[list[bytes]], repeats: int = 2) -> float:
    run(batches[0])  # warm
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for batch in batches:
            run(batch)
        best = min(best, time.perf_counter() - start)
    return sum(len(b) for b in batches) / best


def save_clip(directory: Path) -> None:
    """A ViT-B/16-shaped CLIPModel (openai/clip-vit-base-patch16's sizes, random weights) with CLIP's processor and a
    small byte-level BPE tokenizer in CLIP's class (its text tower is exported too, as for any CLIP)."""
    import torch
    import transformers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    characters = list(bytes_to_unicode().values())
    vocab = {t: i for i, t in enumerate(characters + [c + "</w>" for c in characters]
                                         + ["<|startoftext|>", "<|endoftext|>"])}
    tokenizer = transformers.CLIPTokenizerFast(vocab=vocab, merges=[])
    torch.manual_seed(0)
    config = transformers.CLIPConfig(vision_config={"patch_size": 16}, projection_dim=512, text_config={
        "vocab_size": len(vocab), "eos_token_id": vocab["<|endoftext|>"], "bos_token_id": vocab["<|startoftext|>"],
        "pad_token_id": vocab["<|endoftext|>"]})
    transformers.CLIPModel(config).eval().save_pretrained(str(directory))
    transformers.CLIPProcessor(image_processor=transformers.CLIPImageProcessor(), tokenizer=tokenizer).save_pretrained(
        str(directory))


def measure_optimum(checkpoint: Path, count: int, batch: int, hint: str | None) -> tuple[float, str]:
    """optimum-intel's CLIP on OpenVINO: exported from the checkpoint, its processor's pixels; its forward takes a
    text beside the images (one short text a batch, a small share of a ViT-B/16 batch's work). hint: OpenVINO's
    INFERENCE_PRECISION_HINT ("f32"), None for optimum's default, which leaves it to OpenVINO's CPU plugin: bf16 on a
    CPU with native bf16 (AVX512-BF16, AMX), f32 elsewhere. Returns images/s and the precision it ran at."""
    import transformers
    from optimum.intel import OVModelForZeroShotImageClassification
    from PIL import Image

    model = OVModelForZeroShotImageClassification.from_pretrained(
        str(checkpoint), export=True, ov_config={"INFERENCE_PRECISION_HINT": hint} if hint else None)
    processor = transformers.CLIPProcessor.from_pretrained(str(checkpoint))
    text = processor.tokenizer(["a photo"], return_tensors="pt")
    data = jpegs(count)
    batches = [data[i:i + batch] for i in range(0, count, batch)]

    def run(chunk: list[bytes]) -> None:
        pixels = processor.image_processor(images=[Image.open(io.BytesIO(d)) for d in chunk], return_tensors="pt")
        out = model(input_ids=text["input_ids"], attention_mask=text["attention_mask"],
                    pixel_values=pixels["pixel_values"])
        assert out.image_embeds.shape[0] == len(chunk)

    rate = images_per_second(run, batches)
    ran = model.request.get_property("INFERENCE_PRECISION_HINT")  # an openvino.Type
    return rate, ran.to_string() if hasattr(ran, "to_string") else str(ran).replace(" ", "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--optimum-python", default=None,
                        help="a Python with optimum-intel installed: its row is measured in a process of its own")
    parser.add_argument("--measure-optimum", default=None, help=argparse.SUPPRESS)  # that process's own call
    parser.add_argument("--hint", default=None, help=argparse.SUPPRESS)  # its precision hint
    args = parser.parse_args()
    if args.measure_optimum:
        rate, ran = measure_optimum(Path(args.measure_optimum), args.images, args.batch, args.hint)
        print(f"optimum images/s {rate:.4f} {ran}")
        return 0

    import torch
    import transformers
    from machine import machine_lines  # attnserve's: not in the optimum process's environment
    from PIL import Image

    from attnserve.config import EngineConfig
    from attnserve.engine.engine import Engine
    from attnserve.export.artifacts import build_artifacts
    from attnserve.model.checkpoint import read_checkpoint

    print("\n".join(machine_lines()))
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}; transformers {transformers.__version__}")
    data = jpegs(args.images)
    batches = [data[i:i + args.batch] for i in range(0, args.images, args.batch)]
    rows: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-images-") as tmp:
        checkpoint, artifacts = Path(tmp) / "clip-vit-b16", Path(tmp) / "artifacts"
        save_clip(checkpoint)
        started = time.perf_counter()
        build_artifacts(read_checkpoint(checkpoint), artifacts, log=lambda line: None, variants=["embeddings"])
        print(f"ViT-B/16 CLIP, {args.images} JPEGs of 640 x 480 in batches of {args.batch}; exported (both towers, "
              f"every image graph verified) in {time.perf_counter() - started:.0f} s")
        model = transformers.CLIPModel.from_pretrained(str(checkpoint)).eval()
        processor = transformers.CLIPProcessor.from_pretrained(str(checkpoint))

        def torch_run(chunk: list[bytes]) -> None:
            pixels = processor.image_processor(images=[Image.open(io.BytesIO(d)) for d in chunk], return_tensors="pt")
            with torch.inference_mode():
                model.get_image_features(pixel_values=pixels["pixel_values"])

        rows[TORCH_ROW] = images_per_second(torch_run, batches)
        # fp32 and int8 on onnxruntime; bf16 where export built its OpenVINO graph (OpenVINO installed, native bf16);
        # auto: what `attnserve serve` runs unasked (bf16 where its parity and this CPU allow it, fp32 otherwise).
        graphs = json.loads((artifacts / "manifest.json").read_text())["images"]["graphs"]
        default_graph = ""
        for precision in ("fp32", "int8", *(["bf16"] if "image_embeds_bf16" in graphs else []), "auto"):
            engine = Engine.from_directory(artifacts, EngineConfig(precision=precision))
            images = engine.images
            assert images is not None
            default = ", the default" if precision == "auto" else ""
            name = f"attnserve engine, {images.graph} ({images.precision}{default})"
            if precision == "auto":
                default_graph = images.graph
            rows[name] = images_per_second(lambda chunk, e=engine, i=images: e.run([i.prepare(d) for d in chunk]),
                                           batches)
        optimum: dict[str, tuple[float, str]] = {}
        for kind, hint in OPTIMUM_HINTS.items() if args.optimum_python else ():
            done = subprocess.run([args.optimum_python, __file__, "--measure-optimum", str(checkpoint), "--images",
                                   str(args.images), "--batch", str(args.batch), *(["--hint", hint] if hint else [])],
                                  capture_output=True, text=True)
            line = next((x for x in done.stdout.splitlines() if x.startswith("optimum images/s")), None)
            if line is None:
                print(f"optimum-intel ({kind}): not measured "
                      f"({(done.stderr.strip().splitlines() or ['no output'])[-1]})")
                continue
            rate, ran = float(line.split()[2]), line.split()[3]
            optimum[kind] = rate, ran
            rows[f"{OPTIMUM} (OpenVINO {'its default' if hint is None else hint + ' hint'}: ran {ran})"] = rate
    base = rows[TORCH_ROW]
    for name, rate in rows.items():
        print(f"{name:84s} {rate:8.2f} images/s   {rate / base:5.2f}x torch")
    ours = {name: rate for name, rate in rows.items() if name.startswith("attnserve")}
    fp32 = next(rate for name, rate in ours.items() if "(fp32" in name)
    default_rate = next(rate for name, rate in ours.items() if "the default" in name)
    best = max(ours.values())
    print(f"attnserve fp32 / torch: {fp32 / base:.2f}; the fastest verified graph / torch: {best / base:.2f} "
          f"(target >= 2: {'PASS' if best / base >= 2 else 'FAIL'})")
    if "f32" in optimum:
        ratio = fp32 / optimum["f32"][0]
        print(f"fp32-class: attnserve's fp32 graph / optimum-intel's OpenVINO held to f32: {ratio:.2f} "
              f"(target >= 1.2: {'PASS' if ratio >= 1.2 else 'FAIL'})")
    if "default" in optimum:
        rate, ran = optimum["default"]
        print(f"each as installed: attnserve's default ({default_graph}) / optimum-intel's default (OpenVINO ran "
              f"{ran}): {default_rate / rate:.2f} (target >= 1.2: {'PASS' if default_rate / rate >= 1.2 else 'FAIL'})")
    if not optimum:
        print("OpenVINO through optimum-intel: not measured here (give --optimum-python)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
