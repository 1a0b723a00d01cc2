"""LLM rerankers beyond Qwen3-Reranker (model/llm_reranker.py), each against the package its users score with, on a
tiny random-weight checkpoint of its published configuration's shape saved by transformers itself:
- mxbai-rerank-v2 (a Qwen2ForCausalLM) against mxbai-rerank's own MxbaiRerankV2.predict;
- bge-reranker-v2-gemma (a GemmaForCausalLM) against FlagEmbedding's FlagLLMReranker.compute_score;
each its template, its query and document cuts, the batch it feeds its model (recorded from that very call), and its
raw scores (each package's default), within 1e-4 on every rerank door (gRPC Rerank, TEI's /rerank, /v1/rerank,
Cohere's SDK on /v2/rerank, KServe's infer) of one real server.

Neither package imports as published under transformers 5, so each is given the least to run: mxbai-rerank 0.1.6
calls tokenizer.prepare_for_model, which transformers 5 removed, and gets FlagEmbedding's prepare_for_model_compat in
its place (FlagEmbedding's own port of transformers 4's id-level pair preparation: with add_special_tokens false, the
"only_second" cut); FlagEmbedding's modules are loaded without its package __init__ files, which import transformers
4 code (as tests/test_bge_m3.py loads them).
"""

from __future__ import annotations

import functools
import json
import shutil
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from attnserve.engine.engine import Engine
from attnserve.engine.session import open_session
from attnserve.engine.tokenizer import TextTokenizer
from attnserve.errors import CheckpointError
from attnserve.export.artifacts import build_artifacts
from attnserve.model.checkpoint import read_checkpoint
from attnserve.v1 import encoder_pb2 as pb

from .checkpoints import save_sentence_transformer
from .flag_embedding import flag_module
from .serving import ServerProcess, serving
from .tiny_decoders import save_tiny_decoder
from .tiny_gemma3 import save_tiny_gemma

QUERY = "what do cats eat"
TEXTS = ["Cats are obligate carnivores and eat meat.", "The stock market fell on Monday.", "Kittens drink milk.",
         "Paris is the capital of France.", "a", "Ünïcödé naïve café 東京は日本の首都です。",
         "the quick brown fox jumps over the lazy dog " * 60]  # cut to what the template leaves the document
LONG_QUERY = "which of these long words answers a long query " * 60  # cut at max_length * 3 // 4 tokens
TOLERANCE = 1e-4  # the bar for every rerank door
FP32 = ["scores", "scores_fused"]


class Recorded:
    """The batches a reference feeds its causal LM (input_ids and attention_mask of its last call)."""

    def __init__(self, model: torch.nn.Module):
        self.batch: dict[str, torch.Tensor] = {}
        model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module, args, kwargs):
        self.batch = {k: kwargs[k].detach().clone() for k in ("input_ids", "attention_mask")}

    def rows(self) -> list[list[int]]:
        """Each row's real ids, padding left out (on either side)."""
        return [ids[mask.bool()].tolist() for ids, mask in zip(self.batch["input_ids"], self.batch["attention_mask"],
                                                                 strict=True)]


@dataclass
class Kind:
    name: str  # the served model's name
    reranker: str  # model/llm_reranker.py's kind
    positions: int
    make: Any  # (directory) -> the folder
    reference: Any  # (folder) -> (scores(queries, documents) -> np.ndarray, Recorded)


def _mxbai(folder: Path, max_length: int | None = None):
    MxbaiRerankV2 = pytest.importorskip("mxbai_rerank", reason="attnserve[dev] installs mxbai-rerank").MxbaiRerankV2

    model = MxbaiRerankV2(str(folder), device="cpu", torch_dtype=torch.float32,
                          **({} if max_length is None else {"max_length": max_length}))
    compat = flag_module("FlagEmbedding.utils.tokenizer_compat").prepare_for_model_compat
    # Only truncation_side and model_input_names are read with add_special_tokens false; a view, so that the compat
    # function does not find this very attribute and call itself.
    view = types.SimpleNamespace(truncation_side=model.tokenizer.truncation_side,
                                 model_input_names=model.tokenizer.model_input_names)
    model.tokenizer.prepare_for_model = functools.partial(compat, view)
    return (lambda queries, documents: model.predict(queries, documents).numpy()), Recorded(model.model)  # raw


def _flag(folder: Path, max_length: int | None = None):
    base = flag_module("FlagEmbedding.inference.reranker.decoder_only.base")
    model = base.BaseLLMReranker(str(folder), devices="cpu", batch_size=64,  # FlagLLMReranker; fp32 on the CPU
                                 **({} if max_length is None else {"max_length": max_length}))
    return (lambda queries, documents: np.asarray(model.compute_score(list(zip(queries, documents, strict=True))))), \
        Recorded(model.model)  # normalize=False: the raw "Yes" logit


KINDS = {
    # mxbai-rerank-base-v2's shape (Qwen2.5-0.5B's: grouped-query attention, biased q, k and v, tied embeddings,
    # rope base 1e6), tiny; its template takes some 210 tokens of the tiny tokenizer.
    "mxbai": Kind("mxbai", "mxbai-rerank-v2", 512, lambda d: save_tiny_decoder(
        d, "qwen2", model_class="Qwen2ForCausalLM", seed=5, max_position_embeddings=512, tie_word_embeddings=True,
        rope_theta=1e6), _mxbai),
    # bge-reranker-v2-gemma's shape (Gemma 2B's: multi-query attention, tied embeddings), tiny; its template's prompt
    # takes some 145 tokens twice, and its 512 tokens of query and passage fit.
    "gemma": Kind("gemma", "bge-reranker-gemma", 1024, lambda d: save_tiny_gemma(
        d, model_class="GemmaForCausalLM", seed=7, max_position_embeddings=1024), _flag),
}


class Made:
    """Each kind's folder, reference and export, made once for the module when a test first asks."""

    def __init__(self, root: Path):
        self.root, self.made = root, {}

    def folder(self, kind: Kind) -> Path:
        if (kind.name, "folder") not in self.made:
            self.made[kind.name, "folder"] = kind.make(self.root / kind.name / "model")
        return self.made[kind.name, "folder"]

    def reference(self, kind: Kind):
        if (kind.name, "reference") not in self.made:
            self.made[kind.name, "reference"] = kind.reference(self.folder(kind))
        return self.made[kind.name, "reference"]

    def exported(self, kind: Kind) -> Path:
        if (kind.name, "out") not in self.made:
            out, ckpt = self.root / kind.name / "artifacts", read_checkpoint(self.folder(kind))
            # fp32: fp16, int8 and the attention graph of an LLM reranker are Qwen3-Reranker's to build
            # (tests/test_cross_encoder_families.py), the same graph code.
            build_artifacts(ckpt, out, log=lambda line: None, variants=FP32)
            self.made[kind.name, "out"] = out
        return self.made[kind.name, "out"]


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Made:
    return Made(tmp_path_factory.mktemp("llm_rerankers"))


@pytest.fixture(scope="module", params=list(KINDS))
def kind(request) -> Kind:
    return KINDS[request.param]


@pytest.fixture(scope="module")
def want(kind, made) -> np.ndarray:
    """The reference's scores (raw, its default) of (QUERY, text) in TEXTS order."""
    scores = made.reference(kind)[0]([QUERY] * len(TEXTS), TEXTS)
    assert scores.max() - scores.min() > 0.1, scores  # an order to get right
    return scores


@pytest.fixture(scope="module")
def served(made, tmp_path_factory):
    """One fp32 server over every kind's export, each by its name."""
    flags = [f for kind in KINDS.values() for f in ("--model", f"{kind.name}={made.exported(kind)}")]
    with serving(ServerProcess(None, *flags, env={"ATTNSERVE_PRECISION": "fp32"},
                               log_path=tmp_path_factory.mktemp("llm_rerankers") / "server.log")) as server:
        yield server


def test_folder_is_recognised_and_an_ambiguous_one_refused(kind, made, tmp_path):
    """A bare causal LM of the kind's architecture is its reranker, its scores raw (identity); with
    sentence-transformers' modules the same weights embed; with a sentence-transformers file but no modules.json it
    cannot be told, and is refused in one line."""
    folder = made.folder(kind)
    ckpt = read_checkpoint(folder)
    assert (ckpt.kind, ckpt.num_labels, ckpt.score_activation, ckpt.llm_reranker.name) == (
        "reranker", 1, "identity", kind.reranker)
    assert ckpt.max_seq_length <= kind.positions
    assert read_checkpoint(save_sentence_transformer(folder, tmp_path / "st", "lasttoken", True, 40)).kind == "embedder"
    half = shutil.copytree(folder, tmp_path / "half")
    (half / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 40}))
    architecture = json.loads((folder / "config.json").read_text())["architectures"][0]
    with pytest.raises(CheckpointError, match=f"cannot tell whether this {architecture} folder is an LLM reranker") \
            as refused:
        read_checkpoint(half)
    assert "\n" not in str(refused.value)


def test_engine_tokenizes_as_the_reference(kind, made):
    """The template, the query's cut at max_length * 3 // 4 and the document's at what is left: the same ids as the
    batch the reference fed its model, short and long on both sides."""
    engine = Engine.from_directory(made.exported(kind))
    pairs = [(QUERY, t) for t in TEXTS] + [(LONG_QUERY, TEXTS[0]), (LONG_QUERY, TEXTS[-1])]
    ours = engine.tokenizer.encode_templated_pairs(pairs, engine.manifest.pair_template)
    scores, recorded = made.reference(kind)
    scores([q for q, _ in pairs], [d for _, d in pairs])
    # FlagLLMReranker sorts its pairs by length before batching them: compared as a multiset.
    assert sorted(x.ids.tolist() for x in ours) == sorted(recorded.rows())
    assert [x.truncated for x in ours] == [False] * 6 + [True] * 3


def test_served_below_the_templates_longest_pair_is_the_reference_at_a_shorter_max_length(kind, made):
    """An export that verifies (and so serves) fewer tokens than the template's longest pair (mxbai-rerank-base-v2's
    8,192-token max_length past its 3,575 verified tokens) cuts as the reference does with max_length that much
    shorter."""
    engine = Engine.from_directory(made.exported(kind))
    template, served = engine.manifest.pair_template, engine.manifest.max_seq_length - 100
    tokenizer = TextTokenizer(engine.manifest.path(engine.manifest.tokenizer), served, engine.manifest.vocab_size)
    pairs = [(QUERY, t) for t in TEXTS] + [(LONG_QUERY, TEXTS[0]), (LONG_QUERY, TEXTS[-1])]
    ours = tokenizer.encode_templated_pairs(pairs, template)
    scores, recorded = kind.reference(made.folder(kind), max_length=template["max_length"] - 100)
    scores([q for q, _ in pairs], [d for _, d in pairs])
    assert sorted(x.ids.tolist() for x in ours) == sorted(recorded.rows())
    assert max(len(x) for x in ours) == served


def test_every_fp32_graph_takes_the_references_padded_batch(kind, made, want):
    """The batch the reference fed its model (its padding side, its pad-to-8) straight into each graph."""
    out = made.exported(kind)
    scores, recorded = made.reference(kind)
    expected = scores([QUERY] * len(TEXTS), TEXTS)
    feed = {k: v.numpy().astype(np.int64) for k, v in recorded.batch.items()}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["score_activation"] == "identity" and manifest["pair_template"]["style"] == "query_document"
    for file in ("scores.onnx", "scores_fused.onnx"):
        got = open_session(out / file, "CPUExecutionProvider").run(["scores"], feed)[0][:, 0]  # (B,)
        assert sorted(got.tolist()) == pytest.approx(sorted(expected.tolist()), abs=TOLERANCE), file


def _check(indices, scores, want: np.ndarray, door: str) -> None:
    """Best first, every text, each score within TOLERANCE of the reference's."""
    assert list(indices) == list(np.argsort(-want, kind="stable")), door
    assert np.abs(np.asarray(scores) - want[list(indices)]).max() <= TOLERANCE, door


def test_scores_on_every_rerank_door(kind, served, want):
    import cohere

    with served.channel() as channel:
        stub = served.stub(channel)
        for raw in (False, True):  # the activation is identity: raw or not, the reference's scores
            reply = stub.Rerank(pb.RerankRequest(query=QUERY, texts=TEXTS, model=kind.name, raw_scores=raw),
                                timeout=60)
            _check([r.index for r in reply.results], [r.score for r in reply.results], want, "gRPC Rerank")
    url = served.http_url
    tei = httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": TEXTS, "model": kind.name}, timeout=60)
    assert tei.status_code == 200, tei.text
    _check([r["index"] for r in tei.json()], [r["score"] for r in tei.json()], want, "/rerank")
    v1 = httpx.post(f"{url}/v1/rerank", json={"query": QUERY, "documents": TEXTS, "model": kind.name}, timeout=60)
    assert v1.status_code == 200, v1.text
    results = v1.json()["results"]
    _check([r["index"] for r in results], [r["relevance_score"] for r in results], want, "/v1/rerank")
    v2 = cohere.ClientV2(api_key="unused", base_url=url).rerank(model=kind.name, query=QUERY, documents=TEXTS)
    _check([r.index for r in v2.results], [r.relevance_score for r in v2.results], want, "/v2/rerank")
    kserve = httpx.post(f"{url}/v2/models/{kind.name}/infer", timeout=60, json={"inputs": [
        {"name": "query", "shape": [1], "datatype": "BYTES", "data": [QUERY]},
        {"name": "text", "shape": [len(TEXTS)], "datatype": "BYTES", "data": TEXTS}]})
    assert kserve.status_code == 200, kserve.text
    score = next(o for o in kserve.json()["outputs"] if o["name"] == "score")["data"]  # in the order sent
    assert np.abs(np.asarray(score) - want).max() <= TOLERANCE, "KServe"


def test_a_long_query_is_cut_as_the_reference_cuts_it_and_truncate_false_refuses_it(kind, made, served):
    want = made.reference(kind)[0]([LONG_QUERY] * len(TEXTS), TEXTS)
    tei = httpx.post(f"{served.http_url}/rerank", json={"query": LONG_QUERY, "texts": TEXTS, "model": kind.name},
                     timeout=60)
    assert tei.status_code == 200, tei.text
    _check([r["index"] for r in tei.json()], [r["score"] for r in tei.json()], want, "/rerank, long query")
    refused = httpx.post(f"{served.http_url}/rerank", timeout=60, json={
        "query": LONG_QUERY, "texts": TEXTS[:2], "model": kind.name, "truncate": False})
    assert refused.status_code in (400, 413), refused.text
    assert "\n" not in refused.text and "template keeps" in refused.text, refused.text
