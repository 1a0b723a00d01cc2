"""Cross-encoders of every family (model/classifier_heads.py) against the implementations nobody here wrote: the
PyTorch reranker's logits against transformers' XForSequenceClassification (eager and sdpa where offered), the
exported graphs' scores against sentence-transformers' CrossEncoder over the same folder, through the engine and
through a real server's rerank routes; the int8 graph held to its bar; heads this code does not reproduce refused
in one line before any weight is loaded. The checkpoints are tiny random-weight ones saved by transformers and
CrossEncoder themselves (tests/tiny_cross_encoders.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from attnserve.config import EngineConfig
from attnserve.engine.engine import Engine
from attnserve.engine.manifest import load_manifest
from attnserve.errors import CheckpointError, ConfigError
from attnserve.export.artifacts import all_variants, build_artifacts
from attnserve.export.reranker import SCORE_TOLERANCE
from attnserve.export.reranker_int8 import score_agreement
from attnserve.model.checkpoint import load_encoder, read_checkpoint
from attnserve.model.cross_encoder import load_reranker
from attnserve.v1 import encoder_pb2 as pb

from .checkpoints import copy_checkpoint, edit_json
from .conftest import assert_one_line_error, run_cli
from .serving import ServerProcess, serving
from .tiny_cross_encoders import ALL, save_tiny_cross_encoder

PAIRS = [
    ("how tall is the eiffel tower", "The Eiffel Tower is 330 metres tall."),
    ("how tall is the eiffel tower", "Paris is the capital of France."),
    ("what do cats eat", "Cats are obligate carnivores and eat meat."),
    ("what do cats eat", "The stock market fell on Monday."),
    ("a", "b"),
    ("Ünïcödé naïve café?", "東京は日本の首都です。"),
    ("long query " * 20, "a long document that the pair's truncation cuts, longest side first " * 10),
]


@pytest.fixture(scope="module", params=ALL)
def kind(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def checkpoint(kind, tmp_path_factory) -> Path:
    return save_tiny_cross_encoder(tmp_path_factory.mktemp("cross_encoder") / kind, kind)


# The kind exported with int8 too (bge-reranker-v2-m3's family, served at int8 below): the int8 search measures some
# 23 graphs and is the same code for every family (export/reranker_int8.py); the run's BERT reranker
# (tests/conftest.py `reranker_artifacts`) has every variant as well.
WITH_INT8 = ("xlm-roberta",)


@pytest.fixture(scope="module")
def exported(checkpoint, kind, tmp_path_factory) -> tuple[Path, list[str]]:
    out, lines = tmp_path_factory.mktemp("reranker") / kind, []
    ckpt = read_checkpoint(checkpoint, f"tiny-{kind}")
    variants = None if kind in WITH_INT8 else [n for n in all_variants(ckpt) if not n.startswith("scores_int8")]
    build_artifacts(ckpt, out, log=lines.append, variants=variants)
    return out, lines


@pytest.fixture(scope="module")
def cross_encoder(checkpoint):
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(checkpoint), device="cpu")


def _transformers(checkpoint: Path, implementation: str):
    import transformers

    try:
        return transformers.AutoModelForSequenceClassification.from_pretrained(
            str(checkpoint), attn_implementation=implementation).eval()
    except ValueError as e:  # MPNet offers no sdpa path
        assert implementation == "sdpa" and "does not support an attention implementation" in str(e)
        return None


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_logits_match_transformers(checkpoint, implementation):
    import transformers

    model = _transformers(checkpoint, implementation)
    if model is None:
        pytest.skip(f"transformers offers no {implementation} attention for this architecture")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
    batch = tokenizer(PAIRS, padding=True, truncation=True, max_length=64, return_tensors="pt")
    ckpt = read_checkpoint(checkpoint)
    reranker = load_reranker(ckpt.weights, load_encoder(ckpt), ckpt.head, ckpt.num_labels)
    assert "token_type_ids" not in batch  # these families' tokenizers give none, and the graphs take none
    with torch.no_grad():
        want = model(**batch).logits  # (N, 1)
        got = reranker(batch["input_ids"], batch["attention_mask"])
    assert want.shape == got.shape == (len(PAIRS), 1)
    assert float((got - want).abs().max()) <= 1e-4
    assert float(want.max() - want.min()) > 0.1  # the pairs really score apart, far beyond the tolerance


def test_manifest_and_graphs(exported, kind, cross_encoder):
    out, lines = exported
    manifest = load_manifest(out)
    assert (manifest.kind, manifest.num_labels, manifest.score_activation) == ("reranker", 1, "sigmoid")
    assert any("ForSequenceClassification" in m for m in manifest.modules)
    assert {"scores", "scores_fused", "scores_fp16", "attention"} <= set(manifest.variants)
    # The attention graph gives each head's value norms, verified against the PyTorch encoder (model/value_norms.py).
    attention = manifest.variants["attention"]
    assert "value_norms" in attention.outputs and attention.parity["max_rel_value_norms"] <= 1e-4
    for variant in manifest.variants.values():
        for tolerance in SCORE_TOLERANCE[variant.precision]:
            assert tolerance.holds(variant.parity[tolerance.metric]), (variant.name, variant.parity)
    if kind not in WITH_INT8:
        return
    # int8 is written where its scores reach the bar, and the log says either way.
    assert any(line.startswith("int8: ") or "no int8 graph is written" in line for line in lines), lines
    if "scores_int8" not in manifest.variants:
        with pytest.raises(ConfigError, match="has no int8 graph: its int8 scores missed the export's bar"):
            Engine.from_directory(out, EngineConfig(provider="cpu", precision="int8"))
        return
    engine = Engine.from_directory(out, EngineConfig(provider="cpu", precision="int8"))
    assert engine.precision == "int8" and engine.embeddings_variant.name.startswith("scores_int8")
    logits = engine.score_tokenized(engine.tokenizer.encode_pairs(PAIRS))
    want = cross_encoder.predict(PAIRS, activation_fn=torch.nn.Identity())[:, None]
    agreement = score_agreement(logits, want, "sigmoid")
    # Seven pairs, not the 256 of the export's bar: the error is held to its bar's mean, the order to near-ties.
    assert agreement["mean_score_error"] <= 0.01 and agreement["spearman"] >= 0.9, agreement


def test_scores_match_cross_encoder(exported, cross_encoder):
    engine = Engine.from_directory(exported[0], EngineConfig(provider="cpu", precision="fp32"))
    logits = engine.score_tokenized(engine.tokenizer.encode_pairs(PAIRS))  # (N, 1)
    want_logits = cross_encoder.predict(PAIRS, activation_fn=torch.nn.Identity())
    want = cross_encoder.predict(PAIRS)  # its Sigmoid
    assert np.abs(logits[:, 0] - want_logits).max() <= 2e-5
    assert np.abs(1 / (1 + np.exp(-logits[:, 0])) - want).max() <= 1e-5
    assert want.max() - want.min() > 0.01  # scores that differ 1,000 times the tolerance


SERVED = ("xlm-roberta", "modernbert-mean", "distilbert")
QUERY = "what do cats eat"
TEXTS = ["Cats are obligate carnivores and eat meat.", "The stock market fell on Monday.", "Kittens drink milk.",
         "Paris is the capital of France.", "a", "Ünïcödé naïve café 東京は日本の首都です。"]


def test_served_rerank_matches_cross_encoder(exported, cross_encoder, kind, tmp_path):
    """gRPC Rerank and TEI's /rerank on a real loopback server, fp32, and int8 where the export wrote it."""
    import httpx

    if kind not in SERVED:
        pytest.skip("served for three families; the engine's scores above cover the others")
    want = cross_encoder.predict([(QUERY, text) for text in TEXTS])
    precisions = ["fp32"] + (["int8"] if "scores_int8" in load_manifest(exported[0]).variants else [])
    for precision in precisions:
        process = ServerProcess(exported[0], env={"ATTNSERVE_PRECISION": precision},
                                log_path=tmp_path / f"server-{precision}.log")
        with serving(process), process.channel() as channel:
            reply = process.stub(channel).Rerank(pb.RerankRequest(query=QUERY, texts=TEXTS))
            tei = httpx.post(f"{process.http_url}/rerank", json={"query": QUERY, "texts": TEXTS}, timeout=30).json()
        got = np.array([r.score for r in sorted(reply.results, key=lambda r: r.index)])
        assert [r["index"] for r in tei] == [r.index for r in reply.results]
        assert np.abs(np.array([r["score"] for r in tei]) - [r.score for r in reply.results]).max() <= 1e-6
        if precision == "fp32":
            assert np.abs(got - want).max() <= 1e-5
            assert [r.index for r in reply.results] == list(np.argsort(-want, kind="stable"))
        else:
            assert np.abs(got - want).mean() <= 0.01, (got, want)


# --- refusals, in one line, before any weight is loaded --------------------------------------------------------


def _add_tensor(checkpoint: Path, key: str) -> None:
    from safetensors.torch import load_file, save_file

    weights = checkpoint / "model.safetensors"
    tensors = load_file(str(weights))
    weights.unlink()  # a link to the original (copy_checkpoint): written anew, not through the link
    save_file({**tensors, key: torch.zeros(2)}, str(weights), metadata={"format": "pt"})


@pytest.mark.parametrize("kind_", ["xlm-roberta", "modernbert-cls"])
def test_a_head_with_an_extra_key_is_refused(kind_, tmp_path):
    source = save_tiny_cross_encoder(tmp_path / "source", kind_)
    ckpt = copy_checkpoint(source, tmp_path / "ckpt")
    _add_tensor(ckpt, "classifier.extra.weight")
    with pytest.raises(CheckpointError, match="must hold exactly the classifier head") as caught:
        read_checkpoint(ckpt)
    assert "classifier.extra.weight" in str(caught.value) and "\n" not in str(caught.value)
    result = run_cli("export", "--checkpoint", ckpt, "--out", tmp_path / "out")
    assert_one_line_error(result, "must hold exactly the classifier head", "classifier.extra.weight")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("architecture,model_type,fragment", [
    ("XLMRobertaForTokenClassification", "xlm-roberta", "architecture XLMRobertaForTokenClassification"),
    ("ModernBertForTokenClassification", "modernbert", "architecture ModernBertForTokenClassification"),
    ("BertForSequenceClassification", "xlm-roberta", "sits on model_type 'bert'"),
], ids=["xlm-r token head", "modernbert token head", "head on another family"])
def test_an_unsupported_head_is_refused(architecture, model_type, fragment, tmp_path):
    kind_ = "modernbert-cls" if model_type == "modernbert" else "xlm-roberta"
    ckpt = copy_checkpoint(save_tiny_cross_encoder(tmp_path / "source", kind_), tmp_path / "ckpt")
    edit_json(ckpt / "config.json", architectures=[architecture])
    with pytest.raises(CheckpointError, match="cannot reproduce|sits on") as caught:
        read_checkpoint(ckpt)
    assert fragment in str(caught.value)
    result = run_cli("export", "--checkpoint", ckpt, "--out", tmp_path / "out")
    assert_one_line_error(result, fragment)


def test_modernbert_classifier_options_are_read_or_refused(tmp_path):
    ckpt = copy_checkpoint(save_tiny_cross_encoder(tmp_path / "source", "modernbert-cls"), tmp_path / "ckpt")
    assert read_checkpoint(ckpt).head.options.pooling == "cls"
    edit_json(ckpt / "config.json", classifier_pooling="max")
    with pytest.raises(CheckpointError, match="cannot reproduce classifier_pooling 'max'"):
        read_checkpoint(ckpt)
    edit_json(ckpt / "config.json", classifier_pooling="mean", classifier_activation="quick_gelu")
    with pytest.raises(CheckpointError, match="cannot reproduce classifier_activation 'quick_gelu'"):
        read_checkpoint(ckpt)
    raw = json.loads((ckpt / "config.json").read_text())
    assert raw["classifier_pooling"] == "mean"
