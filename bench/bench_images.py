"""Image embeddings offline: attnserve's image tower graphs (export/image_tower.py) against transformers'
CLIPModel.get_image_features on torch, the same ViT-B/16-shaped CLIP (random weights), the same batches of
preprocessed pixels, one after the other in one run on this machine. Prints images/s and the ratios (issue 36's
target: attnserve / torch >= 2, here for the graphs alone). Measures, does not test.

    python bench/bench_images.py [--images 64] [--batch 16]

OpenVINO through optimum-intel, the issue's second comparison, is not installed by attnserve's extras; where
`optimum.intel` imports, its OVModelForFeatureExtraction is not a CLIP image path, so that row is reported as not
measured rather than guessed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from machine import machine_lines  # noqa: E402


def images_per_second(run, batches: list[np.ndarray], repeats: int = 2) -> float:
    run(batches[0])  # warm
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for batch in batches:
            run(batch)
        best = min(best, time.perf_counter() - start)
    return sum(len(b) for b in batches) / best


def main() -> int:
    import transformers

    from attnserve.engine.session import CPU, open_session
    from attnserve.export.image_tower import export_image_tower
    from attnserve.model.clip import load_image_text_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    print("\n".join(machine_lines()))
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}; transformers {transformers.__version__}")
    rng = np.random.default_rng(0)
    batches = [rng.normal(size=(min(args.batch, args.images - i), 3, 224, 224)).astype(np.float32)
               for i in range(0, args.images, args.batch)]
    with tempfile.TemporaryDirectory(prefix="bench-images-") as tmp:
        torch.manual_seed(0)
        reference = transformers.CLIPModel(transformers.CLIPConfig(vision_config={"patch_size": 16},
                                                                   projection_dim=512)).eval()
        reference.save_pretrained(f"{tmp}/model")
        started = time.perf_counter()
        export_image_tower(load_image_text_model(Path(f"{tmp}/model")), Path(f"{tmp}/graphs"),
                           ("image_embeds", "image_embeds_int8"))
        print(f"ViT-B/16 CLIP, {args.images} images in batches of {args.batch}; the image graphs exported and "
              f"verified in {time.perf_counter() - started:.0f} s")

        def torch_run(batch: np.ndarray) -> None:
            with torch.inference_mode():
                reference.get_image_features(pixel_values=torch.from_numpy(batch))

        rows = {"transformers CLIPModel (torch fp32)": images_per_second(torch_run, batches)}
        for name in ("image_embeds", "image_embeds_int8"):
            session = open_session(Path(f"{tmp}/graphs/{name}.onnx"), CPU)
            rows[f"attnserve {name}.onnx"] = images_per_second(
                lambda b, s=session: s.run(["image_embeds"], {"pixel_values": b}), batches)
    base = rows["transformers CLIPModel (torch fp32)"]
    for name, rate in rows.items():
        print(f"{name:45s} {rate:8.2f} images/s   {rate / base:5.2f}x torch")
    fp32 = rows["attnserve image_embeds.onnx"] / base
    best = max(rate for name, rate in rows.items() if name.startswith("attnserve")) / base
    print(f"fp32 graph / torch: {fp32:.2f}; the fastest verified graph / torch: {best:.2f} (target >= 2: "
          f"{'PASS' if best >= 2 else 'FAIL'}; graphs alone: `encode` of images is not built yet)")
    print("OpenVINO through optimum-intel: not measured (not installed by attnserve's extras)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
