"""/openapi.json against what the server does, judged by schemathesis (a fuzzer nobody here wrote) with its default
checks on every operation the description lists (those every kind lists alike, on the embedder's server only): no
5xx, a schema-valid body accepted, a schema-violating one refused, replies of the documented status, content type
and shape, the methods a 405 allows.

One server per kind of model, since each lists the operations its model answers (server/http/openapi.py): an
embedder (all-MiniLM-L6-v2, its own max length), a reranker, a classifier, a SPLADE model and a ColBERT model
(tiny, random weights). The rules JSON Schema has no word for are told to the generator in
tests/schemathesis_hooks.py. Deterministic: schemathesis's deterministic mode, a bounded number of examples.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnserve.default_model import default_checkpoint_dir
from tests.checkpoints import save_cross_encoder
from tests.serving import ServerProcess, serving

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = 30  # per operation and phase; about 3,000 requests for the embedder, 25 s


def _export(checkpoint: Path, out: Path) -> Path:
    """The fp32 graphs the CPU server runs and the attention graphs: no request picks a precision, and fp16's and
    int8's builds are held to their bars on the default model and one model per kind (tests/test_real_models.py,
    test_splade.py, test_colbert.py)."""
    from attnserve.engine.session import ONNXRUNTIME
    from attnserve.engine.variants import variants_of
    from attnserve.export.artifacts import all_variants, build_artifacts
    from attnserve.model.checkpoint import read_checkpoint

    ckpt = read_checkpoint(checkpoint)
    kinds = variants_of(ckpt.kind)
    fp32 = [n for n in all_variants(ckpt) if kinds[n].precision == "fp32" and kinds[n].backend == ONNXRUNTIME]
    build_artifacts(ckpt, out, log=lambda m: None, variants=fp32)
    return out


@pytest.fixture(scope="module", params=["embedder", "reranker", "classifier", "splade", "colbert"])
def served(request, artifacts, reranker_artifacts, tmp_path_factory):
    kind = request.param
    root = tmp_path_factory.mktemp(f"schemathesis_{kind}")
    if kind == "embedder":
        directory = artifacts
    elif kind == "reranker":
        directory = reranker_artifacts  # the session's, shared with the other reranker tests
    elif kind == "classifier":
        directory = _export(save_cross_encoder(root / "checkpoint", default_checkpoint_dir(),
                                               labels=["negative", "neutral", "positive"]), root / "artifacts")
    elif kind == "splade":
        from tests.test_splade import save_splade

        directory = _export(save_splade(root / "checkpoint"), root / "artifacts")
    else:
        from tests.test_colbert import CLASSIC, save_colbert

        directory = _export(save_colbert(root / "checkpoint", CLASSIC), root / "artifacts")
    process = ServerProcess(directory, env={"ATTNSERVE_THREADS": "1"}, log_path=root / "server.log")
    with serving(process):
        yield kind, process


# What every kind's description lists alike, fuzzed on the embedder's server only: the reads (GET: the model's
# info, health, KServe's metadata) and the routes that take no model output (/tokenize, /decode, KServe's index).
# The other kinds' runs fuzz what each answers of its own: their POSTs.
ALIKE = ["--exclude-method", "GET", "--exclude-path", "/tokenize", "--exclude-path", "/decode",
         "--exclude-path", "/v2/repository/index"]


def test_every_operation_answers_as_openapi_json_describes_it(served, tmp_path):
    kind, process = served
    command = [sys.executable, "-m", "schemathesis.cli", "run", f"{process.http_url}/openapi.json",
               "--max-examples", str(EXAMPLES), "--generation-deterministic", "--workers", "1",
               "--request-timeout", "60", "--no-color", *([] if kind == "embedder" else ALIKE)]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.schemathesis_hooks", "PYTHONPATH": str(REPO)}
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    report = run.stdout + run.stderr
    (tmp_path / "schemathesis.txt").write_text(report)
    failures = report[max(0, report.find("FAILURES")):]
    assert run.returncode == 0, f"{kind}: schemathesis found what the description does not say:\n{failures[:6000]}"
    summary = report[report.rindex("API Operations:"):]
    assert "Tested:" in summary and "passed" in summary, summary
    log = process.log_tail()
    assert "Traceback" not in log, log
