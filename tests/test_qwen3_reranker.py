"""Qwen3-Reranker (model/qwen3_reranker.py, export/qwen3_reranker.py) against the model card's own computation with
transformers' Qwen3ForCausalLM: its template around each (query, document), its tokenization and left padding, and
softmax over the logits of "no" and "yes" at the last position. Through the exported graph, the engine, and a real
server's gRPC Rerank and TEI /rerank, on a tiny random-weight checkpoint saved by transformers (tiny_qwen3.py)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from attnserve.config import EngineConfig
from attnserve.engine.batching import pad
from attnserve.engine.engine import Engine
from attnserve.engine.session import open_session
from attnserve.errors import CheckpointError, ConfigError
from attnserve.export.artifacts import build_artifacts
from attnserve.model.checkpoint import load_encoder, read_checkpoint
from attnserve.model.qwen3_reranker import BODY, INSTRUCTION, PREFIX, SUFFIX, load_reranker
from attnserve.v1 import encoder_pb2 as pb

from .serving import ServerProcess, serving
from .tiny_qwen3 import save_qwen3_embedding, save_tiny_qwen3

POSITIONS = 256  # the template alone takes about 50 tokens of the tiny tokenizer
QUERY = "what do cats eat"
TEXTS = ["Cats are obligate carnivores and eat meat.", "The stock market fell on Monday.", "Kittens drink milk.",
         "Paris is the capital of France.", "a", "Ünïcödé naïve café 東京は日本の首都です。",
         "the quick brown fox jumps over the lazy dog " * 40]  # cut to what max_seq_length leaves the body


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_tiny_qwen3(tmp_path_factory.mktemp("qwen3_reranker") / "model", model_class="Qwen3ForCausalLM",
                           seed=3, max_position_embeddings=POSITIONS)


@pytest.fixture(scope="module")
def exported(model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("qwen3_reranker") / "artifacts"
    lines: list[str] = []
    build_artifacts(read_checkpoint(model_dir), out, log=lines.append)
    (out.parent / "export.log").write_text("\n".join(lines) + "\n")
    return out


@pytest.fixture(scope="module")
def served(exported, tmp_path_factory):
    """One server over the export, for the tests of its routes."""
    with serving(ServerProcess(exported, log_path=tmp_path_factory.mktemp("qwen3_reranker") / "server.log")) as server:
        yield server


def card_inputs(model_dir: Path, query: str, documents: list[str]) -> dict[str, torch.Tensor]:
    """The model card's process_inputs: the body truncated to what max_length leaves, then prefix and suffix
    tokens around it, padded by the tokenizer (on the left, as its tokenizer_config.json says)."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    assert tokenizer.padding_side == "left"
    prefix = tokenizer.encode(PREFIX, add_special_tokens=False)
    suffix = tokenizer.encode(SUFFIX, add_special_tokens=False)
    bodies = [BODY.format(instruction=INSTRUCTION, query=query, document=d) for d in documents]
    encoded = tokenizer(bodies, padding=False, truncation="longest_first", return_attention_mask=False,
                        max_length=POSITIONS - len(prefix) - len(suffix))
    ids = [prefix + body + suffix for body in encoded["input_ids"]]
    return tokenizer.pad({"input_ids": ids}, padding=True, return_tensors="pt")


def card_scores(model_dir: Path, query: str, documents: list[str], implementation: str = "eager") -> np.ndarray:
    """The model card's compute_logits: p(yes) from softmax over [no, yes] at the last position."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), attn_implementation=implementation)
    with torch.no_grad():
        logits = model.eval()(**card_inputs(model_dir, query, documents)).logits[:, -1, :]  # (B, V)
    two = torch.stack([logits[:, no], logits[:, yes]], dim=1)  # (B, 2)
    return torch.nn.functional.log_softmax(two, dim=1)[:, 1].exp().numpy()


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def test_a_causal_lm_without_sentence_transformers_modules_is_a_reranker(model_dir, tmp_path):
    ckpt = read_checkpoint(model_dir)
    assert (ckpt.kind, ckpt.num_labels, ckpt.score_activation, ckpt.max_seq_length) == ("reranker", 1, "sigmoid",
                                                                                         POSITIONS)
    # With Qwen3-Embedding's modules the same weights are an embedder.
    assert read_checkpoint(save_qwen3_embedding(model_dir, tmp_path / "st")).kind == "embedder"


def test_a_vocabulary_without_the_answers_is_refused_in_one_line(model_dir, tmp_path):
    import shutil

    from .tiny_tokenizers import roberta_style

    checkpoint = tmp_path / "no-answers"
    shutil.copytree(model_dir, checkpoint)
    roberta_style(checkpoint / "tokenizer.json")  # a byte-level BPE that learned neither word whole
    with pytest.raises(CheckpointError, match="needs the tokens 'yes' and 'no'; 'yes', 'no' is not one") as refused:
        read_checkpoint(checkpoint)
    assert "\n" not in str(refused.value)


def test_the_engine_tokenizes_as_the_model_card(model_dir, exported):
    engine = Engine.from_directory(exported)
    ours = engine.tokenizer.encode_templated_pairs([(QUERY, t) for t in TEXTS], engine.manifest.pair_template)
    theirs = card_inputs(model_dir, QUERY, TEXTS)
    for x, ids, mask in zip(ours, theirs["input_ids"], theirs["attention_mask"], strict=True):
        assert x.ids.tolist() == ids[mask.bool()].tolist()
    assert [x.truncated for x in ours] == [False] * 6 + [True] and len(ours[-1]) == POSITIONS


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_engine_scores_are_the_card_yes_probability(model_dir, exported, implementation):
    want = card_scores(model_dir, QUERY, TEXTS, implementation)
    assert want.max() - want.min() > 0.05, want  # scores that differ: an order to get right
    engine = Engine.from_directory(exported)
    inputs = engine.tokenizer.encode_templated_pairs([(QUERY, t) for t in TEXTS], engine.manifest.pair_template)
    got = sigmoid(engine.score_tokenized(inputs)[:, 0])  # batched by length, right-padded
    assert np.abs(got - want).max() <= 1e-5, np.abs(got - want).max()


def test_every_fp32_graph_takes_the_card_left_padded_batch(model_dir, exported):
    """The card's own batch (left padding, sizes not traced) straight into each graph; and the manifest's
    verification."""
    want = card_scores(model_dir, QUERY, TEXTS)
    feed = {name: tensor.numpy().astype(np.int64) for name, tensor in card_inputs(model_dir, QUERY, TEXTS).items()}
    for file in ("scores.onnx", "scores_fused.onnx", "attention.onnx"):
        scores = open_session(exported / file, "CPUExecutionProvider").run(["scores"], feed)[0]  # (B, 1)
        assert scores.shape == (len(TEXTS), 1)
        assert np.abs(sigmoid(scores[:, 0]) - want).max() <= 1e-5, file
    manifest = json.loads((exported / "manifest.json").read_text())
    assert manifest["kind"] == "reranker" and manifest["pair_template"]["instruction"] == INSTRUCTION
    assert {name: v["parity"]["max_rel_scores"] <= (3e-2 if v["precision"] == "fp16" else 1e-4)
            for name, v in manifest["variants"].items() if v["precision"] != "int8"} == dict.fromkeys(
        ("scores", "scores_fused", "scores_fp16", "attention"), True)
    assert manifest["variants"]["attention"]["parity"]["max_padded_key_weight"] == 0


def test_int8_is_held_to_the_rerankers_bar_or_refused_in_one_line(model_dir, exported):
    """The cross-encoders' int8 search (export/reranker_int8.py) on the templated pairs: where it reaches the bar the
    engine's int8 scores stay near the card's; where it does not, the log says so and int8 is refused."""
    lines = (exported.parent / "export.log").read_text().splitlines()
    assert any(line.startswith("int8: ") or "no int8 graph is written" in line for line in lines), lines
    manifest = json.loads((exported / "manifest.json").read_text())
    if "scores_int8" not in manifest["variants"]:
        with pytest.raises(ConfigError, match="has no int8 graph: its int8 scores missed the export's bar"):
            Engine.from_directory(exported, EngineConfig(provider="cpu", precision="int8"))
        return
    parity = manifest["variants"]["scores_int8"]["parity"]
    assert parity["mean_score_error_texts"] <= 0.01 and parity["spearman_texts"] >= 0.98, parity
    engine = Engine.from_directory(exported, EngineConfig(provider="cpu", precision="int8"))
    assert engine.precision == "int8"
    want = card_scores(model_dir, QUERY, TEXTS)
    inputs = engine.tokenizer.encode_templated_pairs([(QUERY, t) for t in TEXTS], engine.manifest.pair_template)
    got = sigmoid(engine.score_tokenized(inputs)[:, 0])
    assert np.abs(got - want).mean() <= 0.01, np.abs(got - want)


def test_untied_checkpoint_scores_with_its_lm_head(tmp_path, exported):
    """tie_word_embeddings false: the answers' rows come from lm_head.weight (the exported module, in PyTorch)."""
    model = save_tiny_qwen3(tmp_path / "untied", model_class="Qwen3ForCausalLM", seed=4,
                            max_position_embeddings=POSITIONS, tie_word_embeddings=False)
    ckpt = read_checkpoint(model)
    encoder = load_encoder(ckpt)
    inputs = Engine.from_directory(exported).tokenizer.encode_templated_pairs(
        [(QUERY, t) for t in TEXTS[:4]], ckpt.pair_template.to_json())  # the same tokenizer
    ids, mask = (torch.from_numpy(a) for a in pad([x.ids for x in inputs]))
    with torch.no_grad():
        untied = load_reranker(ckpt.weights, ckpt.tokenizer_file, encoder, tied=False)(ids, mask)  # (B, 1)
        tied = load_reranker(ckpt.weights, ckpt.tokenizer_file, encoder, tied=True)(ids, mask)
    want = card_scores(model, QUERY, TEXTS[:4])
    assert np.abs(sigmoid(untied.numpy()[:, 0]) - want).max() <= 1e-5
    assert np.abs(sigmoid(tied.numpy()[:, 0]) - want).max() > 1e-3  # the input embeddings' rows would not do


def test_served_through_rerank_routes(model_dir, served):
    want = card_scores(model_dir, QUERY, TEXTS)
    order = list(np.argsort(-want, kind="stable"))
    with served.channel() as channel:
        reply = served.stub(channel).Rerank(pb.RerankRequest(query=QUERY, texts=TEXTS), timeout=60)
    assert [r.index for r in reply.results] == order
    assert np.abs(np.array([r.score for r in reply.results]) - want[order]).max() <= 1e-5
    tei = httpx.post(f"{served.http_url}/rerank", json={"query": QUERY, "texts": TEXTS}, timeout=60)
    assert tei.status_code == 200, tei.text
    assert [r["index"] for r in tei.json()] == order
    assert np.abs(np.array([r["score"] for r in tei.json()]) - want[order]).max() <= 1e-5


def test_attention_of_a_templated_pair_is_the_models_own(model_dir, served):
    """The attention a reranker researcher asks for: the (query, document) pair put through the model card's
    template, every layer's maps equal to transformers' Qwen3ForCausalLM (eager) on the same tokens, the document's
    first token as pair_start; a text that is no pair is refused in one line."""
    import transformers

    document = TEXTS[0]
    ids = card_inputs(model_dir, QUERY, [document])["input_ids"]  # (1, T): one pair, no padding
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), attn_implementation="eager")
    with torch.no_grad():
        want = torch.stack(model.eval()(input_ids=ids, output_attentions=True).attentions)[:, 0].numpy()  # (L,nh,T,T)
    reply = httpx.post(f"{served.http_url}/v1/attention", json={
        "inputs": [[QUERY, document]], "layers": list(range(want.shape[0])), "analyses": ["head_stats"]},
        timeout=60)
    assert reply.status_code == 200, reply.text
    item = reply.json()["data"][0]
    got = np.reshape(item["attentions"], item["shape"])
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-4
    tokens = item["tokens"]
    assert len(tokens) == ids.shape[1]
    start = item["pair_start"]
    # The document's first token (with the space before it, as byte-level BPE joins them) starts segment b.
    assert "".join(tokens[start - 4:start]).endswith("Document>:") and tokens[start] == "ĠC", tokens[start - 4:]
    refused = httpx.post(f"{served.http_url}/v1/attention", json={"inputs": "not a pair"}, timeout=60)
    assert refused.status_code == 400 and "send pairs" in refused.json()["error"]["message"], refused.text
