"""7B and 8B decoder embedders on a 24 GiB CPU machine (issue 47, row 8): the e5-mistral-7b-instruct and
Qwen3-Embedding-8B shapes (their real configs, random bf16 weights: bench/real_size_checkpoints.py) exported
straight into bf16 and served through OpenVINO, against transformers on the same 16 texts.

    PYTHONPATH=<openvino's site> BENCH_TMP=<disk with 35 GB free> python bench/bench_big_decoders.py e5-mistral-7b
    ... python bench/bench_big_decoders.py qwen3-embedding-8b

Rows, each a fresh process measured with every process it starts (bench_export.py's Sampler, every 0.1 s):
- transformers' reference: sentence-transformers over transformers' own model class, the weights held in bf16 and
  each decoder layer computed in fp32 (made fp32 just before its forward, bf16 again after it: an fp32 copy of the
  whole model, 2x the weights, does not fit), the residual stream in fp32;
- `attnserve export --precision bf16`: seconds and peak RSS ÷ the checkpoint's weights as stored (target 1.5x);
- `attnserve serve --precision bf16` over the export, to its first answer: seconds and peak RSS;
- the served embeddings of the 16 texts (TEI's /embed) against the reference: min cosine (target 0.999);
- beside them, what bf16 costs transformers itself: its own bf16 (every layer in bf16) against the same reference;
  and where serve refuses the bf16 graph (the export's bar), that graph run directly, as it would have served.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_export import REPO, machine_line, measured, row, serve_until_answer, served_embeddings, weights_bytes  # noqa: E402

SHAPES = ("e5-mistral-7b", "qwen3-embedding-8b")
TEXTS = 16


def reference(checkpoint: Path, out: Path, texts: list[str]) -> None:
    """transformers' embeddings of texts (normalised), its layers computed in fp32 one at a time (module
    docstring); run in a process of its own."""
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(checkpoint), device="cpu", model_kwargs={"dtype": torch.bfloat16})
    decoder = model[0].auto_model
    decoder.norm.float()
    # The rotary frequencies made again, in fp32, as the class makes them from the config (a bf16 load may round them).
    decoder.rotary_emb = type(decoder.rotary_emb)(decoder.config).float()
    decoder.embed_tokens.register_forward_hook(lambda module, args, output: output.float())
    for layer in decoder.layers:
        layer.register_forward_pre_hook(lambda module, args: module.float() and None)
        layer.register_forward_hook(lambda module, args, output: module.to(torch.bfloat16) and None)
    with torch.inference_mode():
        np.save(out, model.encode(texts, normalize_embeddings=True, batch_size=4, convert_to_numpy=True))


def transformers_bf16(checkpoint: Path, out: Path, texts: list[str]) -> None:
    """transformers' own bf16 (every layer and activation in bf16, as a bf16 load runs): what the reference's
    precision costs transformers itself, beside attnserve's bf16; in a process of its own."""
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(checkpoint), device="cpu", model_kwargs={"dtype": torch.bfloat16})
    with torch.inference_mode():
        np.save(out, model.encode(texts, normalize_embeddings=True, batch_size=4, convert_to_numpy=True
                                  ).astype(np.float32))


def graph_bf16(checkpoint: Path, graph: Path, out: Path, texts: list[str]) -> None:
    """attnserve's bf16 graph run directly on OpenVINO (tokenized by the checkpoint's own tokenizer, four texts a
    batch): where the export's bar refused it, what it would have served; in a process of its own."""
    import numpy as np
    from transformers import AutoTokenizer

    from attnserve.engine.openvino_session import OpenVINOSession

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    session = OpenVINOSession(graph, "bf16")
    rows = []
    for start in range(0, len(texts), 4):
        batch = tokenizer(texts[start:start + 4], padding=True, return_tensors="np")
        rows.append(session.run(["sentence_embedding"], {name: batch[name].astype(np.int64)
                                                         for name in ("input_ids", "attention_mask")})[0])
    embeddings = np.concatenate(rows)
    np.save(out, embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True))


def cosine_row(label: str, embeddings, expected) -> None:
    import numpy as np

    cosine = (embeddings * expected).sum(1) / np.linalg.norm(embeddings, axis=1) / np.linalg.norm(expected, axis=1)
    row(label, f"{cosine.min():.6f} (mean {cosine.mean():.6f})", ">= 0.999", bool(cosine.min() >= 0.999))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=SHAPES)
    # The children's: CHECKPOINT OUT TEXT... (--reference, --transformers-bf16), CHECKPOINT GRAPH OUT TEXT... (--graph)
    parser.add_argument("--reference", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--transformers-bf16", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--graph", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reference:
        reference(Path(args.reference[0]), Path(args.reference[1]), args.reference[2:])
        return 0
    if args.transformers_bf16:
        transformers_bf16(Path(args.transformers_bf16[0]), Path(args.transformers_bf16[1]), args.transformers_bf16[2:])
        return 0
    if args.graph:
        graph_bf16(Path(args.graph[0]), Path(args.graph[1]), Path(args.graph[2]), args.graph[3:])
        return 0
    import numpy as np

    texts = [line for line in (REPO / "examples/texts.txt").read_text().splitlines() if line.strip()][:TEXTS]
    with tempfile.TemporaryDirectory(prefix=f"bench-{args.shape}-", dir=os.environ.get("BENCH_TMP")) as tmp:
        checkpoint = Path(tmp) / "checkpoint"
        env = {**os.environ, "ATTNSERVE_CACHE": str(Path(tmp) / "cache")}
        made, _, _ = measured([sys.executable, str(REPO / "bench/real_size_checkpoints.py"), args.shape,
                               str(checkpoint)], env)
        weights = weights_bytes(checkpoint)
        print(f"\n{args.shape} shape (random weights, its real config; made in {made:.0f} s): "
              f"{weights / 2**30:.2f} GiB of weights as stored")
        print(f"machine: {machine_line()}", flush=True)
        want = Path(tmp) / "reference.npy"
        ref_seconds, ref_peak, _ = measured([sys.executable, __file__, args.shape, "--reference", str(checkpoint),
                                             str(want), *texts], env)
        row("transformers' reference (layers in fp32), seconds", f"{ref_seconds:.0f} s")
        row("  its peak RSS ÷ weights", f"{ref_peak / weights:.2f}x")
        expected = np.load(want)
        own = Path(tmp) / "transformers_bf16.npy"
        measured([sys.executable, __file__, args.shape, "--transformers-bf16", str(checkpoint), str(own), *texts], env)
        cosine_row(f"transformers' own bf16: cosine to the reference, min over {len(texts)} texts", np.load(own),
                   expected)
        seconds, peak, log = measured([sys.executable, "-m", "attnserve.cli", "export", "--checkpoint",
                                       str(checkpoint), "--precision", "bf16", "--log-level", "INFO"], env)
        for line in log.splitlines():
            if "stage " in line or "verified" in line or "parity" in line:
                print(f"  {line.strip()[:200]}")
        row("attnserve export --precision bf16, seconds", f"{seconds:.0f} s")
        row("  its peak RSS ÷ weights", f"{peak / weights:.2f}x ({peak / 2**30:.1f} GiB)", "<= 1.5x",
            peak / weights <= 1.5)
        serve = ["--model", f"{args.shape}={checkpoint}", "--precision", "bf16"]
        try:
            first, serve_peak, _ = serve_until_answer(serve, env)
        except RuntimeError as e:  # the bf16 graph missed the export's bar: serve says so and exits
            row("serve --precision bf16 over the export", "refused", ">= 0.999", False)
            print(f"  {[line for line in str(e).splitlines() if line.strip()][-1][:300]}")
            # What the refused graph would have served, beside transformers' own bf16 above.
            graphs = list(Path(env["ATTNSERVE_CACHE"]).rglob("embeddings_half.onnx"))
            if graphs:
                ours = Path(tmp) / "graph_bf16.npy"
                measured([sys.executable, __file__, args.shape, "--graph", str(checkpoint), str(graphs[0]),
                          str(ours), *texts], env)
                cosine_row(f"the refused bf16 graph run directly: cosine to the reference, min over {len(texts)} "
                           "texts", np.load(ours), expected)
            return 1
        row("serve --precision bf16 over the export, to its first answer", f"{first:.0f} s")
        row("  its peak RSS ÷ weights", f"{serve_peak / weights:.2f}x ({serve_peak / 2**30:.1f} GiB)")
        cosine_row(f"cosine to transformers, min over {len(texts)} texts", served_embeddings(serve, env, texts),
                   expected)
    return 0


if __name__ == "__main__":
    sys.exit(main())
