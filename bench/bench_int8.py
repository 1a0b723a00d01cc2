"""int8 candidates side by side: tokens/s against fp32 and cosine against fp32 on the mixed-length corpus.

Every candidate is built from an artifact directory's fp32 graphs (copied, never modified) by
export/int8_recipes.py and run on the same engine-style batches: the corpus (loadtest/corpus.py) tokenized by
the artifact's tokenizer, sorted by length and packed under max_batch_tokens 2048 (engine/batching.py). Only
session.run is timed (tokenizing is the same for every candidate). Rounds are interleaved (every candidate once
per round, reversed every other round) and each candidate's best round is kept, so machine noise falls on all
alike; read the ratios, not the absolute numbers.

Every int8 candidate runs as export's default int8 variant does, without onnxruntime's load-time
SkipLayerNormalization fusion (export/artifacts.py DISABLED_OPTIMIZERS); the shipped recipe runs once more with it.

With attnserve[openvino] and nncf installed (`pip install nncf`), OpenVINO's rows run too (issue 21): the plain
fp32 graph at OpenVINO's bf16 (where the CPU has it: the bar an int8 recipe must beat to be worth choosing
there), and OpenVINO's static int8 as NNCF quantizes the plain graph for transformers (SmoothQuant on MatMuls,
the MIXED and PERFORMANCE presets), calibrated on the same batches, its fp32 parts at OpenVINO's default
precision. OpenVINO cannot read the int8 graphs onnxruntime runs (QAttention, DynamicQuantizeMatMul are
onnxruntime's contrib ops), nor the fused graph the outlier split is made on; NNCF's SmoothQuant is its own
answer to the same outliers. These rows measure a corpus of English sample texts only: static ranges fail on inputs
unlike them (cosine 0.70 on a line of symbols and emoji, docs/performance.md), which is why no OpenVINO int8 ships.

Cosine: the sentence embedding of each text against the fp32 fused graph's (mean, 1st percentile, min).
Static candidates are calibrated on sample texts 512.. of export/data/sample_texts.txt (export verifies on the
first 512). The sensitivity candidates keep in fp32 the nodes whose quantization alone costs the most cosine,
measured on those calibration texts (export/int8_sensitivity.py). The "outlier units apart" candidates start
from the fused graph with each feed-forward's outlier units split off into fp32 (export/int8_outliers.py), found
on the same calibration texts.

    ATTNSERVE_TEST_ARTIFACTS=/tmp/art python bench/bench_int8.py --rounds 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnserve.engine.batching import pad, plan_batches
from attnserve.engine.machine import this_machine
from attnserve.engine.manifest import load_manifest
from attnserve.engine.session import CPU, open_session
from attnserve.engine.tokenizer import TextTokenizer
from attnserve.export.artifacts import DISABLED_OPTIMIZERS
from attnserve.export.int8_outliers import side_path_nodes, split_outliers
from attnserve.export.int8_recipes import Int8Recipe, build
from attnserve.export.int8_sensitivity import OUTPUT, cosine, node_drops
from attnserve.export.optimize import FIRST_FFN_DOWN, quiet
from attnserve.loadtest.corpus import mixed_length_corpus

MAX_BATCH_TOKENS, MAX_BATCH_SIZE = 2048, 256  # the engine's defaults (attnserve/config.py)
SAMPLE_TEXTS = Path(__file__).resolve().parent.parent / "export/data/sample_texts.txt"
VERIFIED_TEXTS = 512  # export/verify.py checks the first 512 sample texts: calibration takes others

S8 = dict(weight_type="QInt8")
CANDIDATES = [
    # (recipe, source graph): "fused" is embeddings_fused.onnx, "unfused" embeddings.onnx
    (Int8Recipe("dynamic per-channel s8, first FFN down fp32 (before)", keep_fp32=(FIRST_FFN_DOWN,)), "fused"),
    (Int8Recipe("dynamic per-channel s8"), "fused"),
    (Int8Recipe("dynamic per-channel s8 reduce_range"), "fused"),
    (Int8Recipe("dynamic per-channel u8 weights", weight_type="QUInt8"), "fused"),
    (Int8Recipe("dynamic per-tensor s8", per_channel=False), "fused"),
    (Int8Recipe("dynamic per-tensor u8 weights", per_channel=False, weight_type="QUInt8"), "fused"),
    (Int8Recipe("dynamic per-channel s8, every MatMul of unfused attention (QK^T, PV too)"), "unfused"),
    (Int8Recipe("static QDQ per-channel MinMax, attention fp32", static=True), "fused"),
    (Int8Recipe("static QDQ per-channel MinMax + dynamic QAttention", static=True, dynamic_attention=True), "fused"),
    (Int8Recipe("static QDQ per-channel Percentile + dynamic QAttention", static=True, dynamic_attention=True,
                calibrate_method="Percentile"), "fused"),
    (Int8Recipe("static QDQ per-channel Entropy + dynamic QAttention", static=True, dynamic_attention=True,
                calibrate_method="Entropy"), "fused"),
    (Int8Recipe("static QOperator per-channel MinMax + dynamic QAttention", static=True, dynamic_attention=True,
                quant_format="QOperator"), "fused"),
]
SENSITIVE_KEPT = (1, 2, 3)  # the dynamic per-channel recipe with its worst k nodes kept in fp32
SHIPPED = "outlier units apart, dynamic per-channel s8, FastGelu (shipped)"
INT8_SESSION = DISABLED_OPTIMIZERS["embeddings_int8"]


@dataclass
class Candidate:
    name: str
    path: Path
    spinning: bool = True
    openvino: str | None = None  # OpenVINO's inference precision ("bf16", "fp32"); None: onnxruntime
    disabled_optimizers: tuple[str, ...] = INT8_SESSION
    best_seconds: float = float("inf")
    embeddings: np.ndarray | None = None


def feeds_of(tokenizer: TextTokenizer, texts: list[str]) -> tuple[list[dict[str, np.ndarray]], np.ndarray, int]:
    """Engine-style batches -> (feeds, row order of the concatenated outputs, real tokens)."""
    inputs = tokenizer.encode_texts(texts)
    batches = plan_batches([len(x) for x in inputs], MAX_BATCH_TOKENS, MAX_BATCH_SIZE)
    feeds = []
    for rows in batches:
        ids, mask = pad([inputs[i].ids for i in rows])
        feeds.append({"input_ids": ids, "attention_mask": mask})
    return feeds, np.concatenate(batches), sum(len(x) for x in inputs)


def run_pass(candidate: Candidate, session, feeds) -> float:
    start = time.perf_counter()
    outputs = [session.run([OUTPUT], feed)[0] for feed in feeds]
    seconds = time.perf_counter() - start
    if candidate.embeddings is None:
        candidate.embeddings = np.concatenate(outputs)
    return seconds


def session_for(candidate: Candidate):
    if candidate.openvino:
        from attnserve.engine.openvino_session import OpenVINOSession

        return OpenVINOSession(candidate.path, candidate.openvino)
    if candidate.spinning:
        return open_session(candidate.path, CPU, disabled_optimizers=candidate.disabled_optimizers)
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(candidate.path), options, providers=[CPU],
                                disabled_optimizers=list(candidate.disabled_optimizers))


def openvino_candidates(plain: Path, work: Path, calibration: list[dict[str, np.ndarray]],
                        notes: list[str]) -> list[Candidate]:
    """OpenVINO's bf16 and NNCF's static int8 of the plain graph, where openvino and nncf are installed."""
    try:
        import nncf
        import openvino as ov
        from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, AdvancedSmoothQuantParameters
    except ImportError as e:
        notes.append(f"OpenVINO rows not run: {e.name} is not installed (pip install 'attnserve[openvino]' nncf)")
        return []
    # OpenVINO's own default: bf16 for what stays in floating point, where the CPU computes it.
    native = "bf16" if this_machine().native_bf16 else "fp32"
    candidates = [Candidate(f"OpenVINO {native}, plain graph (not int8: the speed to beat)", plain, openvino=native)]
    inputs = {port.get_any_name() for port in ov.Core().read_model(str(plain)).inputs}
    feeds = [{**f, "token_type_ids": np.zeros_like(f["input_ids"])} if "token_type_ids" in inputs else f
             for f in calibration]
    for preset in ("MIXED", "PERFORMANCE"):
        name = f"OpenVINO static int8, NNCF {preset.lower()} preset, SmoothQuant, {native} elsewhere"
        start = time.perf_counter()
        with quiet():
            model = nncf.quantize(ov.Core().read_model(str(plain)), nncf.Dataset(feeds),
                                  preset=getattr(nncf.QuantizationPreset, preset), subset_size=len(feeds),
                                  model_type=nncf.ModelType.TRANSFORMER,
                                  advanced_parameters=AdvancedQuantizationParameters(
                                      smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=0.95)))
            path = work / f"openvino_int8_{preset.lower()}.xml"
            ov.save_model(model, str(path))
        print(f"built {name} in {time.perf_counter() - start:.0f}s", file=sys.stderr)
        candidates.append(Candidate(name, path, openvino=native))
    notes.append(f"OpenVINO {ov.__version__.split('-')[0]}, NNCF {nncf.__version__}")
    return candidates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifacts", type=Path, default=os.environ.get("ATTNSERVE_TEST_ARTIFACTS"))
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--calibration-texts", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", help="run only candidates whose name contains this")
    parser.add_argument("-o", "--out", type=Path, default=Path(__file__).parent / "int8_candidates.md")
    args = parser.parse_args(argv)
    if args.artifacts is None:
        parser.error("--artifacts (or ATTNSERVE_TEST_ARTIFACTS) is required")
    manifest = load_manifest(args.artifacts)
    tokenizer = TextTokenizer(args.artifacts / manifest.tokenizer, manifest.max_seq_length, manifest.vocab_size)
    feeds, _, tokens = feeds_of(tokenizer, mixed_length_corpus(args.texts))
    sample = [t for t in SAMPLE_TEXTS.read_text(encoding="utf-8").splitlines() if t.strip()]
    calibration, _, _ = feeds_of(tokenizer, sample[VERIFIED_TEXTS: VERIFIED_TEXTS + args.calibration_texts])
    print(f"machine: {this_machine().describe()}", file=sys.stderr)

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sources = {"fused": work / "fused.onnx", "unfused": work / "unfused.onnx", "split": work / "split.onnx"}
        shutil.copyfile(args.artifacts / manifest.variants["embeddings_fused"].file, sources["fused"])
        shutil.copyfile(args.artifacts / manifest.variants["embeddings"].file, sources["unfused"])
        split = split_outliers(sources["fused"], sources["split"], calibration)
        side = tuple(side_path_nodes(split))
        candidates = [Candidate("fp32 fused (baseline)", sources["fused"], disabled_optimizers=())]
        recipes = list(CANDIDATES)
        notes = ["outlier units split off (down-projection: units): "
                 + "; ".join(f"{down} {units}" for down, units in split.items())]
        if not args.only or "sensitive" in args.only:
            start = time.perf_counter()
            with quiet():
                drops = node_drops(Int8Recipe("probe"), sources["fused"], calibration)
            worst = list(drops)
            notes.append(f"sensitivity probe ({time.perf_counter() - start:.0f}s, {len(drops)} nodes, "
                         f"1 - mean cosine when quantized alone): "
                         + ", ".join(f"{n} {d:.2e}" for n, d in list(drops.items())[:6]))
            print(notes[-1], file=sys.stderr)
            recipes += [(Int8Recipe(f"dynamic per-channel s8, {k} most sensitive fp32 (measured)",
                                    keep_fp32=tuple(worst[:k])), "fused") for k in SENSITIVE_KEPT]
        recipes += [(Int8Recipe("outlier units apart, dynamic per-channel s8", keep_fp32=side), "split"),
                    (Int8Recipe(SHIPPED, keep_fp32=side, fast_gelu=True), "split")]
        for i, (recipe, source) in enumerate(recipes):
            if args.only and args.only not in recipe.name:
                continue
            path = work / f"candidate{i}.onnx"
            start = time.perf_counter()
            try:
                with quiet():
                    build(recipe, sources[source], path, calibration)
            except Exception as e:  # onnxruntime's quantizer fails on some recipes: the table says so
                notes.append(f"{recipe.name}: onnxruntime's quantizer failed: {type(e).__name__}: {e}")
                print(notes[-1], file=sys.stderr)
                continue
            print(f"built {recipe.name} in {time.perf_counter() - start:.0f}s", file=sys.stderr)
            candidates.append(Candidate(recipe.name, path))
        shipped = candidates[-1]
        if shipped.name == SHIPPED:  # (not where --only left it out)
            candidates += [Candidate(f"{shipped.name}, SkipLayerNormalization fused at load", shipped.path,
                                     disabled_optimizers=()),
                           Candidate(f"{shipped.name}, intra-op spinning off", shipped.path, spinning=False)]
        if not args.only or "OpenVINO" in args.only:
            candidates += openvino_candidates(sources["unfused"], work, calibration, notes)

        sessions = [session_for(c) for c in candidates]
        if "token_type_ids" in {i.name for i in sessions[0].get_inputs()}:  # zeros, as the engine feeds a text
            feeds = [{**feed, "token_type_ids": np.zeros_like(feed["input_ids"])} for feed in feeds]
        for session in sessions:  # warm-up: first runs pre-pack and allocate
            session.run([OUTPUT], feeds[-1])
        for r in range(args.rounds):
            pairs = list(zip(candidates, sessions, strict=True))
            for c, s in pairs if r % 2 == 0 else pairs[::-1]:
                c.best_seconds = min(c.best_seconds, run_pass(c, s, feeds))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)

    base = candidates[0]
    rows = []
    for c in candidates:
        cos = cosine(c.embeddings, base.embeddings)
        rows.append((c.name, tokens / c.best_seconds, base.best_seconds / c.best_seconds,
                     float(cos.mean()), float(np.percentile(cos, 1)), float(cos.min())))
    lines = [f"# int8 candidates ({args.texts} mixed-length texts, {tokens} tokens, best of {args.rounds} "
             f"interleaved rounds, session.run only)", "", f"machine: {this_machine().describe()}", "",
             "| candidate | tokens/s | ×fp32 | cos mean | cos p1 | cos min |", "|---|---|---|---|---|---|"]
    lines += [f"| {n} | {t:,.0f} | {x:.2f} | {m:.4f} | {p:.4f} | {mn:.4f} |" for n, t, x, m, p, mn in rows]
    lines += ["", *notes]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
