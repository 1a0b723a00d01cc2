"""The engine chooses among the exact candidate graphs by timing them on the machine that runs, and remembers."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from attnserve.config import EngineConfig
from attnserve.engine.batching import plan_batches
from attnserve.engine.calibration import CALIBRATION, record_paths, signature
from attnserve.engine.engine import Engine, candidate_graphs
from attnserve.engine.machine import INSTRUCTION_SETS, this_machine
from attnserve.engine.manifest import MANIFEST, load_manifest
from attnserve.errors import ConfigError

from .conftest import link_but_data

# Small batches (256 padded tokens): the calibration runs the shapes the engine is configured for, so this keeps
# it to a fraction of a second, and it times the same code as the default's 2048.
SMALL = dict(max_batch_tokens=256, max_batch_size=64)
TEXTS = ["The quick brown fox jumps over the lazy dog.", "a", "Graphs chosen by measurement " * 20]


@pytest.fixture
def linked(artifacts, tmp_path, monkeypatch) -> Path:
    """The artifacts in a directory of the test's own (files hard-linked: calibration never writes them), and an
    empty cache of its own."""
    monkeypatch.setenv("ATTNSERVE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "artifacts"
    shutil.copytree(artifacts, out, copy_function=link_but_data, ignore=shutil.ignore_patterns(CALIBRATION))
    return out


def record(directory: Path) -> dict:
    return json.loads((directory / CALIBRATION).read_text())


def entry(path: Path, precision: str = "fp32") -> dict:
    return json.loads(path.read_text())["choices"][signature(0)][precision]


def write_entry(directory: Path, fp32: dict) -> None:
    """A record of this CPU's fp32 choice."""
    (directory / CALIBRATION).write_text(json.dumps({"format_version": 1, "choices": {signature(0): {"fp32": fp32}}}))


def test_the_machine_is_described():
    machine = this_machine()
    assert machine.cpu_model and machine.usable_cpus >= 1
    assert set(machine.instruction_sets) <= set(INSTRUCTION_SETS.values())
    if Path("/proc/cpuinfo").is_file() and "avx2" in Path("/proc/cpuinfo").read_text():
        assert "AVX2" in machine.instruction_sets


def test_candidates_are_the_exact_graphs_of_the_precision(artifacts):
    manifest = load_manifest(artifacts, check_hashes=False)
    assert [[v.name for v in candidate_graphs(manifest, p)] for p in ("fp32", "int8")] == [
        ["embeddings_fused", "embeddings"], ["embeddings_int8", "embeddings_int8_skip_layer_norm"]]


def test_first_start_times_the_candidates_records_the_fastest_and_the_next_start_reuses_it(linked):
    first = Engine.from_directory(linked, EngineConfig(**SMALL))
    written = entry(linked / CALIBRATION)
    assert written["graph"] == first.embeddings_variant.name
    assert written["graph"] in ("embeddings_fused", "embeddings")
    assert set(written["seconds_per_1k_tokens"]) == {"embeddings_fused", "embeddings"}
    assert all(s > 0 for s in written["seconds_per_1k_tokens"].values())
    assert written["budgets"] == [256] and written["batch_tokens"] == first.batch_tokens == 256  # SMALL: nothing less
    assert "calibrated now" in first.describe() and first.embeddings_variant.name in first.describe()

    second = Engine.from_directory(linked, EngineConfig(**SMALL))
    assert second.embeddings_variant == first.embeddings_variant
    assert "recorded in" in second.describe() and "calibrated now" not in second.describe()
    assert entry(linked / CALIBRATION) == written  # not timed again
    np.testing.assert_allclose(second.encode(TEXTS).embeddings, first.encode(TEXTS).embeddings, atol=1e-5)
    # A record naming the unfused graph (as the AVX-512 machine may) makes the engine run it, untimed.
    write_entry(linked, {**written, "graph": "embeddings"})
    engine = Engine.from_directory(linked, EngineConfig(**SMALL))
    assert engine.embeddings_variant.file == "embeddings.onnx" and "recorded in" in engine.describe()


def test_the_batch_budget_is_timed_below_max_batch_tokens_and_a_recorded_one_is_what_runs(linked):
    """max_batch_tokens stays the most a batch holds; its half and quarter (not below max_seq_length 256) are timed
    on the chosen graph, and batches are planned at the fastest."""
    config = EngineConfig(max_batch_tokens=1024, max_batch_size=64)
    first = Engine.from_directory(linked, config)
    written = entry(linked / CALIBRATION)
    assert written["budgets"] == [1024, 512, 256] and set(written["budget_seconds_per_1k_tokens"]) == {
        "1024", "512", "256"}
    assert first.batch_tokens == written["batch_tokens"] and f"batches of {first.batch_tokens} tokens" in (
        first.describe())
    # A record that says 256 (as a CPU with a small cache may): batches of at most 256 padded tokens.
    write_entry(linked, {**written, "batch_tokens": 256})
    engine = Engine.from_directory(linked, config)
    assert engine.batch_tokens == 256 and "batches of 256 tokens" in engine.describe()
    sizes: list[int] = []
    texts = ["word " * n for n in range(1, 60)]
    inputs = engine.tokenizer.encode_texts(texts)
    encoded = engine.encode_tokenized(inputs, on_batch=sizes.append)
    assert sizes == [len(b) for b in plan_batches([len(x) for x in inputs], 256, 64)]  # planned at 256
    np.testing.assert_allclose(encoded.embeddings, first.encode(texts).embeddings, atol=1e-5)
    # Another max_batch_tokens: the record does not hold for it, and is timed again.
    again = Engine.from_directory(linked, EngineConfig(max_batch_tokens=512, max_batch_size=64))
    assert "calibrated now" in again.describe() and entry(linked / CALIBRATION)["budgets"] == [512, 256]


def test_another_thread_count_reads_the_choice_and_another_cpu_times_its_own(linked):
    """Which graph is fastest and at which batch size does not turn on the thread count (a server of two models
    gives each one thread): the choice of the same CPU is read, saying at which count it was timed. Another CPU (or
    instruction sets, or onnxruntime) times its own."""
    first = Engine.from_directory(linked, EngineConfig(**SMALL))
    one = Engine.from_directory(linked, EngineConfig(threads=1, **SMALL))
    assert f"timed at {signature(0).rsplit(' | threads ', 1)[1]} threads" in one.describe()
    assert "calibrated now" not in one.describe()
    assert (one.embeddings_variant.name, one.batch_tokens) == (first.embeddings_variant.name, first.batch_tokens)
    assert set(record(linked)["choices"]) == {signature(0)}
    data = record(linked)
    other = "Another CPU | AVX2 | " + signature(1).split(" | onnxruntime ", 1)[1]
    data["choices"] = {other: data["choices"][signature(0)]}
    (linked / CALIBRATION).write_text(json.dumps(data))
    again = Engine.from_directory(linked, EngineConfig(threads=1, **SMALL))
    assert "calibrated now" in again.describe()
    assert set(record(linked)["choices"]) == {other, signature(1)}


def test_a_forced_graph_is_used_and_nothing_is_timed(linked):
    engine = Engine.from_directory(linked, EngineConfig(graph="embeddings", **SMALL))
    assert engine.embeddings_variant.file == "embeddings.onnx" and "forced by --graph" in engine.describe()
    assert not (linked / CALIBRATION).exists()
    int8 = Engine.from_directory(linked, EngineConfig(graph="embeddings_int8", **SMALL))  # precision auto: its own
    assert int8.precision == "int8" and int8.embeddings_variant.file == "embeddings_int8.onnx"


def test_a_forced_graph_still_gets_its_batch_budget_timed_in_an_entry_of_its_own(linked):
    """--graph (and Ray's actors, which run the graph the driver fingerprinted) chooses the graph, not the batch
    size: the budget changes speed, never results, so it is timed on this CPU as for a calibrated graph."""
    config = EngineConfig(max_batch_tokens=1024, max_batch_size=64)
    auto = Engine.from_directory(linked, config)
    auto_entry = entry(linked / CALIBRATION)
    forced = Engine.from_directory(linked, replace(config, graph="embeddings"))
    assert forced.embeddings_variant.name == "embeddings"
    assert "forced by --graph; calibrated now" in forced.describe()
    own = entry(linked / CALIBRATION, "fp32 embeddings")
    assert own["graph"] == "embeddings" and list(own["candidates"]) == ["embeddings"]
    assert own["budgets"] == [1024, 512, 256] and forced.batch_tokens == own["batch_tokens"]
    assert entry(linked / CALIBRATION) == auto_entry  # the choice among candidates stays
    again = Engine.from_directory(linked, replace(config, graph="embeddings"))
    assert "forced by --graph; calibrated for this CPU" in again.describe() and again.batch_tokens == own[
        "batch_tokens"]
    assert "recorded in" in Engine.from_directory(linked, config).describe() and auto.batch_tokens


@pytest.mark.parametrize("graph, precision, message", [
    ("nonesuch", "auto", "has no such graph; choose auto or one of embeddings, "),
    ("attention", "auto", "--graph attention is not one of the fp32 graphs of .*: embeddings_fused, embeddings"),
    ("embeddings", "int8", "--graph embeddings is not one of the int8 graphs of .*: embeddings_int8, "
                           "embeddings_int8_skip_layer_norm"),
])
def test_a_forced_graph_that_cannot_run_is_refused(linked, graph, precision, message):
    with pytest.raises(ConfigError, match=message):
        Engine.from_directory(linked, EngineConfig(graph=graph, precision=precision, **SMALL))


def test_a_single_candidate_is_not_timed(linked):
    manifest = json.loads((linked / MANIFEST).read_text())
    del manifest["variants"]["embeddings_int8_skip_layer_norm"]
    (linked / MANIFEST).unlink()  # a hard link to the shared artifacts: replaced, not written through
    (linked / MANIFEST).write_text(json.dumps(manifest))
    engine = Engine.from_directory(linked, EngineConfig(precision="int8", **SMALL))
    assert "the only int8 graph" in engine.describe() and not (linked / CALIBRATION).exists()


def test_variants_of_one_file_differ_in_the_session_optimizers_they_disable(linked, tmp_path):
    """The int8 graph runs without onnxruntime's SkipLayerNormalization fusion by default (its CPU kernel is
    slower), and with it as a candidate: one file, two sessions, both verified at export, and the engine opens
    each as its manifest entry says."""
    import onnx
    import onnxruntime as ort

    manifest = load_manifest(linked)
    plain, fused = manifest.variants["embeddings_int8"], manifest.variants["embeddings_int8_skip_layer_norm"]
    assert plain.file == fused.file and plain.disabled_optimizers == ("SkipLayerNormFusion",)
    assert fused.disabled_optimizers == ()
    config = EngineConfig(threads=1, **SMALL)
    for variant, has_skip_layer_norm in ((plain, False), (fused, True)):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.optimized_model_filepath = str(tmp_path / f"{variant.name}.onnx")  # the graph after load's fusions
        direct = ort.InferenceSession(str(linked / variant.file), options, providers=["CPUExecutionProvider"],
                                      disabled_optimizers=list(variant.disabled_optimizers))
        ops = {n.op_type for n in onnx.load(options.optimized_model_filepath, load_external_data=False).graph.node}
        assert ("SkipLayerNormalization" in ops) == has_skip_layer_norm, variant.name
        engine = Engine.from_directory(linked, replace(config, graph=variant.name))
        inputs = engine.tokenizer.encode_texts(TEXTS)
        expected = direct.run(["sentence_embedding"], engine._feed(inputs))[0]
        assert np.array_equal(engine._sentence_embeddings(inputs).sentence_embedding, expected), variant.name


@pytest.mark.parametrize("content, warned", [
    ("{not json", True), ('{"format_version": 1, "choices": []}', True),
    ('{"format_version": 1, "choices": {"SIGNATURE": ["fp32"]}}', False),  # an entry of another shape: timed anew
    # A re-export changes the graphs' sha256: the old choice does not hold for them.
    (json.dumps({"format_version": 1, "choices": {"SIGNATURE": {"fp32": {"graph": "embeddings", "candidates": {
        "embeddings_fused": "0" * 64, "embeddings": "1" * 64}}}}}), False),
], ids=["not json", "choices not a table", "an entry of another shape", "a record for other graphs"])
def test_a_record_that_does_not_hold_is_timed_again_and_replaced(linked, caplog, content, warned):
    """A corrupt record is ignored with a warning."""
    (linked / CALIBRATION).write_text(content.replace("SIGNATURE", signature(0)))
    with caplog.at_level(logging.WARNING, logger="attnserve.engine"):
        engine = Engine.from_directory(linked, EngineConfig(**SMALL))
    assert "calibrated now" in engine.describe()
    assert warned == any("ignoring the graph calibration record" in r.getMessage() for r in caplog.records)
    written = entry(linked / CALIBRATION)
    assert written["graph"] == engine.embeddings_variant.name and written["candidates"] == {
        v.name: v.sha256 for v in candidate_graphs(load_manifest(linked, check_hashes=False), "fp32")}


@contextlib.contextmanager
def read_only(directory: Path):
    """Read-only even for root, who ignores permission bits: then the directory is made immutable as well."""
    directory.chmod(0o555)
    root = os.geteuid() == 0
    immutable = root and subprocess.run(["chattr", "+i", str(directory)], capture_output=True).returncode == 0
    try:
        if root and not immutable:
            pytest.skip("running as root without chattr: no way to make a directory read-only")
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(directory)], check=True)
        directory.chmod(0o755)


def test_a_read_only_artifact_directory_records_in_the_cache(linked):
    beside, cached = record_paths(load_manifest(linked, check_hashes=False))
    with read_only(linked):
        first = Engine.from_directory(linked, EngineConfig(**SMALL))
        assert not beside.exists() and cached.is_file()
        assert entry(cached)["graph"] == first.embeddings_variant.name
        assert f"recorded in {cached}" in first.describe()
        second = Engine.from_directory(linked, EngineConfig(**SMALL))
        assert f"recorded in {cached}" in second.describe() and "calibrated now" not in second.describe()


def test_a_reranker_chooses_among_its_scores_graphs(reranker_artifacts, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSERVE_CACHE", str(tmp_path / "cache"))
    linked = tmp_path / "reranker"
    shutil.copytree(reranker_artifacts, linked, copy_function=link_but_data, ignore=shutil.ignore_patterns(CALIBRATION))
    engine = Engine.from_directory(linked, EngineConfig(**SMALL))
    assert entry(linked / CALIBRATION)["graph"] == engine.embeddings_variant.name
    assert set(entry(linked / CALIBRATION)["candidates"]) == {"scores_fused", "scores"}
    pairs = engine.tokenizer.encode_pairs([("a query", "a passage about it")])
    assert engine.score_tokenized(pairs).shape == (1, engine.manifest.num_labels)


def test_a_deferred_timing_stops_when_asked_and_changes_nothing(linked):
    """A server's first start on a CPU serves on the default graph and times afterwards; a drain stops the timing
    before its next run (onnxruntime aborted the process when it exited under a run), recording nothing."""
    import threading

    from attnserve.engine.calibration import CalibrationStopped

    engine = Engine.from_directory(linked, EngineConfig(**SMALL), defer_calibration=True)
    assert "not timed on this CPU yet" in engine.describe()
    before = (engine.embeddings_variant.name, engine.batch_tokens)
    stop = threading.Event()
    stop.set()
    with pytest.raises(CalibrationStopped):
        engine.calibrate_pending(stop)
    assert (engine.embeddings_variant.name, engine.batch_tokens) == before and not (linked / CALIBRATION).exists()
    assert "calibrated now" in (engine.calibrate_pending() or "")
    assert entry(linked / CALIBRATION)["graph"] == engine.embeddings_variant.name
    assert engine.calibrate_pending() is None  # timed once
