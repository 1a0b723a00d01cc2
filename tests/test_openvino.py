"""bf16 and OpenVINO's fp32 (issue 21): the plain embeddings graph run by the OpenVINO runtime, verified at export
like every variant, and timed beside onnxruntime's graphs by the engine's calibration. OpenVINO is an optional extra
(attnserve[openvino]): .ci/run runs this file again in a venv with it; without it, one test checks that there is no
OpenVINO graph and bf16 is refused in one line. A CPU without native bf16 gets no bf16 graph and is refused bf16;
its calibration test describes one through /proc/cpuinfo's flags less bf16's.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from attnserve.config import EngineConfig
from attnserve.engine import machine
from attnserve.engine.calibration import CALIBRATION, signature
from attnserve.engine.engine import Engine
from attnserve.engine.machine import this_machine
from attnserve.engine.manifest import load_manifest
from attnserve.engine.openvino_session import openvino_available
from attnserve.errors import ConfigError
from tests import test_calibration
from tests.conftest import VARIED_TEXTS
from tests.test_calibration import SMALL
from tests.test_weights_once import resident_bytes

linked = test_calibration.linked  # the artifacts linked into a directory of the test's own, with a cache of its own
SAMPLE_TEXTS = Path(__file__).resolve().parent.parent / "export/data/sample_texts.txt"

needs_openvino = pytest.mark.skipif(
    not openvino_available(), reason="OpenVINO is not installed: .ci/run runs this file in a venv with it")
needs_bf16 = pytest.mark.skipif(not this_machine().native_bf16, reason="this CPU has no native bf16")


def sample_texts(n: int) -> list[str]:
    return [t for t in SAMPLE_TEXTS.read_text(encoding="utf-8").splitlines() if t.strip()][:n]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


@needs_openvino
def test_export_verifies_the_openvino_graphs_against_pytorch(artifacts):
    manifest = load_manifest(artifacts)
    fp32 = manifest.variants["embeddings_openvino"]
    # The plain graph as it is: OpenVINO reads embeddings.onnx, and the manifest says it runs there.
    assert (fp32.file, fp32.precision, fp32.backend) == ("embeddings.onnx", "fp32", "openvino")
    assert fp32.sha256 == manifest.variants["embeddings"].sha256
    assert fp32.runs_as != manifest.variants["embeddings"].runs_as  # a resumed encode tells them apart
    assert fp32.parity["max_abs_last_hidden_state"] <= 1e-4 and fp32.parity["shapes_checked"] > 0
    assert manifest.tools["openvino"]
    if this_machine().native_bf16:
        bf16 = manifest.variants["embeddings_bf16"]
        assert (bf16.file, bf16.precision, bf16.backend) == ("embeddings.onnx", "bf16", "openvino")
        assert bf16.parity["mean_cosine_sentence_embedding_texts"] >= 0.9999
        assert bf16.parity["texts_checked"] >= 64 and bf16.parity["shapes_checked"] > 0
        # bf16 really ran: its error is a bf16's, not an fp32 graph's passed off under the name.
        assert bf16.parity["max_abs_last_hidden_state"] > 1e-4
    else:
        assert "embeddings_bf16" not in manifest.variants


@needs_openvino
@needs_bf16
def test_a_bf16_graph_off_its_bar_is_left_out_and_the_export_goes_on(checkpoint, tmp_path, monkeypatch):
    """bf16 is an extra candidate read from the plain graph: on a model whose bf16 misses 0.9999 (tiny random
    ModernBERT, GTE, NomicBERT and EuroBERT checkpoints did) the export keeps every other graph and says why."""
    from attnserve.export import artifacts as export
    from attnserve.export.verify import TOLERANCES, Tolerance

    monkeypatch.setitem(TOLERANCES, "bf16", Tolerance("mean_cosine_sentence_embedding_texts", 1.01, True))
    lines: list[str] = []
    # The steps before OpenVINO's (trace, fuse), its own, and one after it (attention: engine/variants.py STEPS).
    manifest = export.build_artifacts(checkpoint, tmp_path / "out", log=lines.append, variants=[
        "embeddings", "embeddings_fused", "embeddings_openvino", "embeddings_bf16", "attention"])
    assert "embeddings_bf16" not in manifest.variants
    assert {"embeddings_openvino", "embeddings_fused", "attention"} <= set(manifest.variants)
    assert [line for line in lines if line.startswith("embeddings_bf16 left out: embeddings.onnx (bf16) fails parity "
                                                      "with PyTorch: mean_cosine_sentence_embedding_texts 0.99")]
    with pytest.raises(ConfigError, match="has no bf16 graph"):
        Engine.from_directory(tmp_path / "out", EngineConfig(precision="bf16", **SMALL))


@needs_openvino
def test_openvino_fp32_encodes_as_onnxruntime_does_on_several_threads(linked):
    onnxruntime = Engine.from_directory(linked, EngineConfig(graph="embeddings_fused", **SMALL))
    openvino = Engine.from_directory(linked, EngineConfig(graph="embeddings_openvino", **SMALL))
    assert "OpenVINO" in openvino.describe() and openvino.precision == "fp32"
    np.testing.assert_allclose(openvino.encode(VARIED_TEXTS).embeddings, onnxruntime.encode(VARIED_TEXTS).embeddings,
                               atol=2e-5)
    # Token embeddings come from the same run (the batch's last_hidden_state).
    inputs = openvino.tokenizer.encode_texts(VARIED_TEXTS[:3])
    np.testing.assert_allclose(openvino.run(inputs).last_hidden_state, onnxruntime.run(inputs).last_hidden_state,
                               atol=1e-4)
    # One session serves several threads (the server's inference thread and the attention pool share an engine):
    # each thread gets its own request.
    groups = [sample_texts(200)[i::4] for i in range(4)]
    alone = [openvino.encode(g).embeddings for g in groups]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda g: openvino.encode(g).embeddings, groups * 3))
    for i, got in enumerate(together):
        np.testing.assert_allclose(got, alone[i % 4], atol=1e-6)


@needs_openvino
@needs_bf16
def test_bf16_holds_its_bar_on_real_texts_and_attention_still_runs(linked):
    fp32 = Engine.from_directory(linked, EngineConfig(precision="fp32", **SMALL))
    bf16 = Engine.from_directory(linked, EngineConfig(precision="bf16", **SMALL), attention=True)
    assert bf16.precision == "bf16" and bf16.embeddings_variant.name == "embeddings_bf16"
    texts = sample_texts(300) + VARIED_TEXTS
    cos = cosines(bf16.encode(texts).embeddings, fp32.encode(texts).embeddings)
    assert cos.mean() >= 0.9999 and cos.min() >= 0.999, (cos.mean(), cos.min())
    # The attention maps come from the attention graph, on onnxruntime, whatever runs the embeddings.
    out = bf16.run(bf16.tokenizer.encode_texts(["The cat sat on the mat."]), attention=True)
    assert out.attentions is not None
    np.testing.assert_allclose(out.attentions.sum(-1), 1.0, atol=1e-5)


@needs_openvino
@needs_bf16
def test_the_server_runs_bf16_on_every_door_and_says_so(linked):
    """A real `attnserve serve --precision bf16`: its batcher's inference thread runs OpenVINO's session."""
    import urllib.request

    from attnserve.client import Client
    from tests.serving import ServerProcess, serving

    fp32 = Engine.from_directory(linked, EngineConfig(precision="fp32", **SMALL)).encode(VARIED_TEXTS).embeddings
    with serving(ServerProcess(linked, "--precision", "bf16")) as server:
        info = json.load(urllib.request.urlopen(f"{server.http_url}/info", timeout=30))
        assert info["model_dtype"] == "bfloat16"
        request = urllib.request.Request(f"{server.http_url}/embed", json.dumps({"inputs": VARIED_TEXTS}).encode(),
                                         {"Content-Type": "application/json"})
        over_http = np.array(json.load(urllib.request.urlopen(request, timeout=60)), dtype=np.float32)
        with Client(server.target) as client:
            over_grpc = client.embed(VARIED_TEXTS)
            assert client.model_info().precision == "bf16"
    for got in (over_http, over_grpc):
        cos = cosines(got, fp32)
        assert cos.mean() >= 0.9999 and cos.min() >= 0.999, cos


@needs_openvino
@needs_bf16
def test_auto_times_bf16_beside_the_fp32_graphs_and_records_the_choice(linked):
    engine = Engine.from_directory(linked, EngineConfig(**SMALL))
    record = json.loads((linked / CALIBRATION).read_text())["choices"][signature(0)]["auto"]
    assert set(record["seconds_per_1k_tokens"]) == {"embeddings_fused", "embeddings", "embeddings_openvino",
                                                    "embeddings_bf16"}
    assert engine.embeddings_variant.name == record["graph"]
    assert engine.precision == engine.embeddings_variant.precision
    # The fastest runs, unless within the margin of the default (engine/calibration.py).
    seconds = record["seconds_per_1k_tokens"]
    assert seconds[record["graph"]] <= min(seconds.values()) * 1.04
    again = Engine.from_directory(linked, EngineConfig(**SMALL))
    assert again.embeddings_variant == engine.embeddings_variant and "recorded in" in again.describe()


@needs_openvino
@needs_bf16
def test_a_bf16_graph_under_autos_bar_is_served_only_when_asked_for(linked, monkeypatch):
    """bf16 is listed where it holds fp16's bar (a min cosine of 0.999: what asking for half precision gets); auto
    chooses it over fp32 unasked only where it also holds 0.9999 on average over real texts (engine.AUTO_BF16). A
    graph between the two (the Qwen3-Embedding-4B shape's, at 0.99978) is not timed by auto, which says why."""
    import attnserve.engine.engine as engine_module

    monkeypatch.setattr(engine_module, "AUTO_BF16", ("mean_cosine_sentence_embedding_texts", 1.01))
    auto = Engine.from_directory(linked, EngineConfig(**SMALL))
    assert auto.precision == "fp32"
    how = auto.graph_choice.how
    assert "bf16 not timed: its embeddings' cosine to PyTorch's" in how and "under the 1.01 auto needs" in how, how
    assert "--precision bf16 serves it" in how
    asked = Engine.from_directory(linked, EngineConfig(precision="bf16", **SMALL))
    assert asked.embeddings_variant.name == "embeddings_bf16"


@needs_openvino
def test_a_forced_backend_runs_only_its_graphs(linked):
    openvino = Engine.from_directory(linked, EngineConfig(backend="openvino", precision="fp32", **SMALL))
    assert openvino.embeddings_variant.name == "embeddings_openvino" and "OpenVINO" in openvino.describe()
    onnxruntime = Engine.from_directory(linked, EngineConfig(backend="onnxruntime", **SMALL))
    assert onnxruntime.embeddings_variant.backend == "onnxruntime" and onnxruntime.precision == "fp32"
    with pytest.raises(ConfigError, match="--backend openvino: .* has no int8 graph that it runs"):
        Engine.from_directory(linked, EngineConfig(backend="openvino", precision="int8", **SMALL))
    with pytest.raises(ConfigError, match="embeddings_fused runs on onnxruntime, not on --backend openvino"):
        Engine.from_directory(linked, EngineConfig(backend="openvino", graph="embeddings_fused", **SMALL))


@pytest.fixture
def cpu_without_bf16(tmp_path, monkeypatch) -> None:
    """This CPU as /proc/cpuinfo describes it, less the bf16 flags (AVX512-BF16, AMX)."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else "model name\t: CPU\nflags\t: \n"
    flags = {"avx512_bf16", "amx_bf16", "amx_tile", "amx_int8"}
    lines = [" ".join(w for w in line.split(" ") if w not in flags) if line.startswith("flags") else line
             for line in text.splitlines()]
    fake = tmp_path / "cpuinfo"
    fake.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(machine, "CPUINFO", fake)
    assert not this_machine().native_bf16


@needs_openvino
def test_a_cpu_without_bf16_never_runs_bf16_and_the_record_says_why(linked, cpu_without_bf16):
    engine = Engine.from_directory(linked, EngineConfig(**SMALL))
    assert engine.precision == "fp32" and engine.embeddings_variant.name != "embeddings_bf16"
    entry = json.loads((linked / CALIBRATION).read_text())["choices"][signature(0)]["fp32"]
    assert "embeddings_bf16" not in entry["seconds_per_1k_tokens"]
    assert "embeddings_openvino" in entry["seconds_per_1k_tokens"]  # OpenVINO's fp32 is still a candidate
    assert entry["notes"] == [f"bf16 not timed: this CPU has no native bf16 (AVX512-BF16 or AMX): "
                              f"{this_machine().describe()}"]
    assert "bf16 not timed: this CPU has no native bf16" in engine.describe()
    with pytest.raises(ConfigError, match="needs a CPU with native bf16"):
        Engine.from_directory(linked, EngineConfig(precision="bf16", **SMALL))


@pytest.mark.skipif(openvino_available(), reason="the default install's behaviour, without OpenVINO")
def test_without_openvino_there_is_no_openvino_graph_and_bf16_is_refused_in_one_line(artifacts):
    manifest = load_manifest(artifacts, check_hashes=False)
    assert not [v for v in manifest.variants.values() if v.backend != "onnxruntime"]
    assert "openvino" not in manifest.tools
    message = "attnserve\\[openvino\\]" if this_machine().native_bf16 else "needs a CPU with native bf16"
    with pytest.raises(ConfigError, match=message) as refused:
        Engine.from_directory(artifacts, EngineConfig(precision="bf16", **SMALL))
    assert "\n" not in str(refused.value)
    with pytest.raises(ConfigError, match="--backend openvino: .*exported with attnserve\\[openvino\\] installed"):
        Engine.from_directory(artifacts, EngineConfig(backend="openvino", **SMALL))


@needs_openvino
@needs_bf16
def test_bf16_on_the_half_trace_keeps_its_weights_fp16(checkpoint, tmp_path):
    """A bf16 run's first export traces in fp16 and writes no fp32 graph (export/half_precision.py). OpenVINO reads
    that graph's fp16 weights as compressed ones (engine/openvino_session.py _read): compiled, they stay fp16
    constants mapped from the data file, not fp32 copies held beside the bf16 ones its matrix products pack (the
    Qwen3-4B shape did not fit in 24 GiB that way); and it encodes as sentence-transformers does."""
    from collections import Counter

    from sentence_transformers import SentenceTransformer

    from attnserve.default_model import default_checkpoint_dir
    from attnserve.engine.openvino_session import OpenVINOSession
    from attnserve.export.artifacts import build_artifacts

    out = tmp_path / "artifacts"
    build_artifacts(checkpoint, out, log=lambda m: None, variants=["embeddings_bf16"], trace="fp16")
    manifest = load_manifest(out)
    assert set(manifest.traces) == {"fp16"} and not (out / "weights.fp32.data").exists()
    session = OpenVINOSession(out / manifest.variants["embeddings_bf16"].file, "bf16")
    elements: Counter = Counter()  # the compiled graph's constants: element type -> elements
    for op in session._compiled.get_runtime_model().get_ordered_ops():
        shape = op.output(0).get_partial_shape()
        if op.get_rt_info()["layerType"].astype(str) == "Const" and shape.is_static:
            elements[op.output(0).get_element_type().get_type_name()] += int(np.prod(list(op.output(0).get_shape())))
    assert elements["f16"] >= 0.99 * sum(elements.values()), elements
    engine = Engine.from_directory(out, EngineConfig(precision="bf16", **SMALL), build=False)
    assert engine.embeddings_variant.name == "embeddings_bf16"
    want = SentenceTransformer(str(default_checkpoint_dir()), device="cpu").encode(VARIED_TEXTS)
    cos = cosines(engine.encode(VARIED_TEXTS).embeddings, want)
    assert cos.mean() >= 0.9999 and cos.min() >= 0.999, cos
    # The first run packed the weights, and what it read of the mapped data file was handed back as it went
    # (engine/mapped_pages.py): the matrix products' weights are held once, packed. What is mapped again is what
    # later runs read from the file: MiniLM's word embeddings (30,522 x 384 fp16, half the file), which OpenVINO
    # gathers from. Without the page-out, all of the file stayed.
    data = out / "weights.fp16.data"
    assert resident_bytes(data) <= 0.6 * data.stat().st_size, (resident_bytes(data), data.stat().st_size)
    again = engine.encode(VARIED_TEXTS).embeddings  # read back where it is read again: the same outputs
    np.testing.assert_array_equal(again, engine.encode(VARIED_TEXTS).embeddings)
    assert cosines(again, want).min() >= 0.999


@needs_openvino
@needs_bf16
def test_an_image_towers_bf16_graph_runs_on_openvino_beside_its_text_towers(clip_artifacts):
    """A CLIP exported where OpenVINO runs bf16 natively: its image tower's bf16 graph (image_embeds.onnx on
    OpenVINO) is verified at export, and a bf16 engine runs it for images, near the fp32 graph's embeddings."""
    import io

    from PIL import Image

    manifest = load_manifest(clip_artifacts)
    assert manifest.images is not None
    graph = manifest.images["graphs"]["image_embeds_bf16"]
    assert graph["backend"] == "openvino" and graph["file"] == "image_embeds.onnx"
    assert graph["parity"]["min_cosine_image_embeds"] >= 0.999
    picture = io.BytesIO()
    Image.fromarray((np.random.default_rng(0).random((40, 50, 3)) * 255).astype(np.uint8)).save(picture, "PNG")
    rows = {}
    for precision in ("bf16", "fp32"):
        engine = Engine.from_directory(clip_artifacts, EngineConfig(precision=precision))
        assert engine.images is not None and engine.images.precision == precision
        rows[precision] = engine.run([engine.images.prepare(picture.getvalue())]).sentence_embedding[0]
    a, b = rows["bf16"], rows["fp32"]
    assert float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) >= 0.999
