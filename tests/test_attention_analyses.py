"""Attention analyses computed in the server (attnserve/attention_analyses.py), against references written here from
each definition, row by row and token by token, over the weights the same server returns: real MiniLM weights, a
text and a sentence pair, through gRPC, /v1/attention and the Python client."""

from __future__ import annotations

import math

import grpc
import numpy as np
import pytest
import requests

from attnserve.v1 import encoder_pb2 as pb

TEXT = "The quick brown fox jumps over the lazy dog, then rests."
PAIR = ("Where does the fox sleep?", "The fox sleeps in a den under the old oak tree.")
PAIR_INPUT = pb.Input(pair=pb.TextPair(a=PAIR[0], b=PAIR[1]))


def as_array(t: pb.Tensor) -> np.ndarray:
    return np.frombuffer(t.data, "<f4").reshape(tuple(t.shape))


def rollout_reference(maps: np.ndarray) -> np.ndarray:
    """Abnar & Zuidema (2020): A_l the heads' mean, 0.5 A_l + 0.5 I re-normalised by row, R = Â_L ... Â_1."""
    L, H, T, _ = maps.shape
    R = np.identity(T)
    for layer in range(L):
        A = sum(maps[layer, h].astype(np.float64) for h in range(H)) / H
        hat = 0.5 * A + 0.5 * np.identity(T)
        hat = np.array([row / row.sum() for row in hat])
        R = hat @ R
    return R


def stats_reference(maps: np.ndarray, special: list[bool], pair_start: int | None) -> dict[str, np.ndarray]:
    """Each statistic for each layer and head, as docs/attention.md defines it, one row and one token at a time."""
    L, H, T, _ = maps.shape
    specials = [j for j in range(T) if special[j]]
    names = ["entropy", "normalized_entropy", "first_special", "separators", "self", "previous", "next", "distance"]
    names += ["a_to_b", "b_to_a"] if pair_start is not None else []
    out = {name: np.zeros((L, H)) for name in names}
    for layer in range(L):
        for h in range(H):
            a = maps[layer, h].astype(np.float64)
            rows: dict[str, list[float]] = {name: [] for name in names}
            for i in range(T):
                entropy = -sum(a[i, j] * math.log(a[i, j]) for j in range(T) if a[i, j] > 0)
                keys = sum(1 for j in range(T) if a[i, j] > 0)
                rows["entropy"].append(entropy)
                rows["normalized_entropy"].append(entropy / math.log(keys) if keys > 1 else 0.0)
                rows["first_special"].append(a[i, specials[0]] if specials else 0.0)
                rows["separators"].append(sum(a[i, j] for j in specials[1:]))
                rows["self"].append(a[i, i])
                if i > 0:
                    rows["previous"].append(a[i, i - 1])
                if i < T - 1:
                    rows["next"].append(a[i, i + 1])
                rows["distance"].append(sum(a[i, j] * abs(i - j) for j in range(T)))
                if pair_start is not None:
                    if i < pair_start:
                        rows["a_to_b"].append(sum(a[i, j] for j in range(pair_start, T)))
                    else:
                        rows["b_to_a"].append(sum(a[i, j] for j in range(pair_start)))
            for name in names:
                out[name][layer, h] = sum(rows[name]) / len(rows[name]) if rows[name] else 0.0
    return out


def attention(stub, item: pb.Input, **options) -> pb.Embedding:
    """One input's reply; every layer unless `layers` says otherwise."""
    options.setdefault("layers", list(range(6)))
    request = pb.EmbedRequest(inputs=[item], attention=pb.AttentionOptions(**options))
    return stub.Embed(request, timeout=60).embeddings[0]


@pytest.mark.parametrize("item", [pb.Input(text=TEXT), PAIR_INPUT], ids=["text", "pair"])
def test_analyses_equal_the_references_written_from_their_definitions(stub, item):
    reply = attention(stub, item, analyses=["rollout", "head_stats"])
    maps = as_array(reply.attentions)  # (L, H, T, T): every layer's every head, as the reply gives them
    assert maps.shape[:2] == (6, 12)
    rollout = as_array(reply.analyses.rollout)
    np.testing.assert_allclose(rollout, rollout_reference(maps), atol=1e-5)
    np.testing.assert_allclose(rollout.sum(axis=1), 1.0, atol=1e-5)
    special = [token in ("[CLS]", "[SEP]") for token in reply.tokens]
    pair_start = reply.pair_start if reply.HasField("pair_start") else None
    assert (pair_start is not None) == (item.WhichOneof("content") == "pair")
    want = stats_reference(maps, special, pair_start)
    assert set(reply.analyses.head_stats) == set(want)
    for name, grid in want.items():
        np.testing.assert_allclose(as_array(reply.analyses.head_stats[name]), grid, atol=1e-5, err_msg=name)


def test_analyses_alone_leave_the_weights_out_and_one_layer_asked_still_gives_those_of_all(stub):
    item = pb.Input(text=TEXT)
    alone = attention(stub, item, analyses=["rollout", "head_stats"], weights=False)
    assert not alone.HasField("attentions") and list(alone.tokens)  # the tokens still label the analyses
    both = attention(stub, item, analyses=["rollout", "head_stats"])
    np.testing.assert_array_equal(as_array(alone.analyses.rollout), as_array(both.analyses.rollout))
    assert alone.ByteSize() < both.ByteSize() / 10  # T x T and a few L x H grids, not L x H x T x T
    only_rollout = attention(stub, item, analyses=["rollout"])
    assert not only_rollout.analyses.head_stats
    one = attention(stub, item, layers=[-1], heads=[0], analyses=["rollout"])
    assert list(one.attentions.shape)[:2] == [1, 1]  # only the layer and head asked are copied
    # The last-layer graph's rollout (float32, in the graph) against the server's from every layer's maps (numpy).
    np.testing.assert_allclose(as_array(one.analyses.rollout), as_array(only_rollout.analyses.rollout), atol=1e-5)


def _batches(server) -> dict[str, float]:
    """Batches run so far, by graph (the server's attnserve_batch_size_count)."""
    counts: dict[str, float] = {}
    for name, value in server.metrics().items():
        if name.startswith("attnserve_batch_size_count{"):
            graph = name.split('graph="', 1)[1].split('"', 1)[0]
            counts[graph] = counts.get(graph, 0.0) + value
    return counts


def test_the_last_layer_and_rollout_alone_run_the_last_layer_graph_and_equal_the_attention_graphs(server, stub):
    """What most attention requests ask (the default layer; rollout without weights) runs the graph of the last
    layer's maps and rollout alone (export/attention_last.py), and gives what every layer's maps give."""
    full = attention(stub, PAIR_INPUT)
    maps = as_array(full.attentions)  # (L, H, T, T), the attention graph's
    before = _batches(server)
    default = attention(stub, PAIR_INPUT, layers=[])
    alone = attention(stub, PAIR_INPUT, layers=[], analyses=["rollout"], weights=False)
    last = attention(stub, PAIR_INPUT, layers=[5], average_heads=True, analyses=["rollout"])
    after = _batches(server)
    assert after.get("attention_last", 0) - before.get("attention_last", 0) == 3
    assert after.get("attention", 0) == before.get("attention", 0)
    assert list(default.tokens) == list(full.tokens) and default.pair_start == full.pair_start
    np.testing.assert_allclose(as_array(default.attentions)[0], maps[-1], atol=1e-6)
    np.testing.assert_allclose(as_array(last.attentions)[0, 0], maps[-1].mean(axis=0), atol=1e-6)
    assert not alone.HasField("attentions")
    for reply in (alone, last):
        np.testing.assert_allclose(as_array(reply.analyses.rollout), rollout_reference(maps), atol=1e-5)


def test_artifacts_without_the_last_layer_graph_answer_from_the_attention_graph(artifacts_copy):
    """Artifacts exported before the last-layer graph: a batch that would run it runs the attention graph."""
    import json

    from attnserve.engine.engine import Engine

    manifest = json.loads((artifacts_copy / "manifest.json").read_text())
    del manifest["variants"]["attention_last"]
    (artifacts_copy / "manifest.json").write_text(json.dumps(manifest))
    (artifacts_copy / "attention_last.onnx").unlink()
    engine = Engine.from_directory(artifacts_copy, attention=True)
    assert not engine.has_last_layer_graph
    out = engine.run(engine.tokenizer.encode_texts([TEXT]), attention=True, last_layer=True)
    assert out.map_layers is None and out.rollout is None and out.attentions is not None
    assert out.attentions.shape[:3] == (6, 1, 12)


def test_v1_attention_gives_the_same_analyses_and_refuses_them_asked_wrongly_in_words(server, stub):
    reply = requests.post(f"{server.http_url}/v1/attention", json={
        "inputs": [TEXT], "analyses": ["head_stats", "rollout"], "weights": False}, timeout=60)
    assert reply.status_code == 200, reply.text
    data = reply.json()["data"][0]
    assert "attentions" not in data and "shape" not in data
    grpc_reply = attention(stub, pb.Input(text=TEXT), analyses=["rollout", "head_stats"])
    np.testing.assert_allclose(np.array(data["rollout"]), as_array(grpc_reply.analyses.rollout), atol=1e-6)
    for name, grid in data["head_stats"].items():
        np.testing.assert_allclose(np.array(grid), as_array(grpc_reply.analyses.head_stats[name]), atol=1e-6)
    for options, words in (({"analyses": ["nope"]}, "'nope' is not one of rollout, head_stats, norms"),
                           ({"weights": False}, "weights false asks for nothing")):
        with pytest.raises(grpc.RpcError) as refused:
            attention(stub, pb.Input(text="x"), layers=[], **options)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in refused.value.details()
    reply = requests.post(f"{server.http_url}/v1/attention", json={"inputs": "x", "analyses": ["flow"]}, timeout=60)
    assert reply.status_code == 400 and "analyses[0]" in reply.json()["error"]["message"]


def test_a_rerankers_attention_over_the_pair_it_scores(reranker_server):
    url = reranker_server.http_url
    reply = requests.post(f"{url}/v1/attention", json={
        "inputs": [list(PAIR)], "layers": [0, -1], "analyses": ["rollout", "head_stats"]}, timeout=60)
    assert reply.status_code == 200, reply.text
    data = reply.json()["data"][0]
    T = data["num_tokens"]
    assert data["shape"][0] == 2 and data["shape"][2:] == [T, T] and data["pair_start"] > 1
    maps = np.array(data["attentions"])
    np.testing.assert_allclose(maps.sum(axis=-1), 1.0, atol=1e-5)
    assert {"a_to_b", "b_to_a"} <= set(data["head_stats"])
    np.testing.assert_allclose(np.array(data["rollout"]).sum(axis=1), 1.0, atol=1e-5)
    embed = requests.post(f"{url}/embed", json={"inputs": "x"}, timeout=60)
    assert embed.status_code == 400 and "reranker" in embed.text
    norms = requests.post(f"{url}/v1/attention", json={
        "inputs": [list(PAIR)], "layers": [0, -1], "analyses": ["norms"]}, timeout=60)
    assert norms.status_code == 200, norms.text
    weighted = np.array(norms.json()["data"][0]["norms"])  # (2, nh, T, T): a_ij ||f_h(x_j)||
    value_norms = weighted.sum(axis=2) / maps.sum(axis=2)  # ||f_h(x_j)||, the same for every query row
    np.testing.assert_allclose(weighted, maps * value_norms[:, :, None, :], rtol=1e-5, atol=1e-6)
    assert (value_norms > 0).all()
    with reranker_server.channel() as channel:
        stub = reranker_server.stub(channel)
        item = attention(stub, PAIR_INPUT, layers=[0, -1])
        assert not item.HasField("sentence_embedding")
        np.testing.assert_allclose(as_array(item.attentions), maps, atol=1e-6)
        assert "attention" in stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=60).outputs


def transformers_value_norms(text: str) -> np.ndarray:
    """(L, nh, T): ||(x_j W_V^h + b_V^h) W_O^h|| from transformers' BertModel over the default checkpoint, its value
    projections read by forward hooks and W_O from its attention output layers: a reference nobody here wrote."""
    import torch
    import transformers

    from attnserve.default_model import default_checkpoint_dir

    directory = str(default_checkpoint_dir())
    model = transformers.BertModel.from_pretrained(directory).eval()
    ids = transformers.AutoTokenizer.from_pretrained(directory)(text, return_tensors="pt")
    values: list[torch.Tensor] = []
    hooks = [layer.attention.self.value.register_forward_hook(lambda m, i, out: values.append(out))
             for layer in model.encoder.layer]
    with torch.no_grad():
        model(**ids)
    for hook in hooks:
        hook.remove()
    nh, hs = model.config.num_attention_heads, model.config.hidden_size // model.config.num_attention_heads
    norms = []
    for v, layer in zip(values, model.encoder.layer, strict=True):
        w = layer.attention.output.dense.weight.detach()  # (H, nh * hs): W_O
        per_head = [(v[0, :, h * hs:(h + 1) * hs] @ w[:, h * hs:(h + 1) * hs].T).norm(dim=-1) for h in range(nh)]
        norms.append(torch.stack(per_head).numpy())  # (nh, T)
    return np.stack(norms)


def test_norm_weighted_attention_uses_the_value_norms_transformers_gives(stub):
    reply = attention(stub, pb.Input(text=TEXT), analyses=["norms"])
    maps, norms = as_array(reply.attentions), as_array(reply.analyses.norms)  # (L, H, T, T) each
    value_norms = norms.sum(axis=2) / maps.sum(axis=2)  # a_ij ||f(x_j)|| summed over i, over the a_ij: ||f(x_j)||
    np.testing.assert_allclose(value_norms, transformers_value_norms(TEXT), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(norms, maps * value_norms[:, :, None, :], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(as_array(reply.analyses.norms_summed), norms.sum(axis=1), rtol=1e-5, atol=1e-5)
    one = attention(stub, pb.Input(text=TEXT), layers=[2], heads=[5, 1], analyses=["norms"], weights=False)
    np.testing.assert_allclose(as_array(one.analyses.norms), norms[2:3][:, [5, 1]], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(as_array(one.analyses.norms_summed), norms[2:3].sum(axis=1), rtol=1e-5, atol=1e-5)


def test_the_python_client_returns_the_analyses_as_arrays_and_writes_a_standalone_explorer(server, stub, tmp_path):
    """tests/test_explorer.py opens such pages in Chromium; here: the client's to_html and what the page carries."""
    import json
    import re

    from attnserve.client.client import Client
    from attnserve.errors import AttnserveError

    with Client(server.target) as client:
        alone = client.attention(TEXT, analyses=["rollout", "head_stats"], weights=False)
        result = client.attention(TEXT, layers=range(6), analyses=["rollout", "head_stats", "norms"])
        averaged = client.attention(TEXT, layers=range(6), average_heads=True)
        last = client.attention(TEXT, layers=[-1])
    assert alone.attentions is None and alone.rollout is not None and alone.head_stats is not None
    want = attention(stub, pb.Input(text=TEXT), analyses=["rollout", "head_stats"])
    np.testing.assert_array_equal(alone.rollout, as_array(want.analyses.rollout))
    assert set(alone.head_stats) == set(want.analyses.head_stats)
    assert alone.head_stats["entropy"].shape == (6, 12)
    page = result.to_html(tmp_path / "fox.html", model="minilm", text=TEXT).read_text(encoding="utf-8")
    data = json.loads(re.search(r"window\.ATTNSERVE_DATA = (\{.*?\});</script>", page, re.S).group(1))
    item = data["data"][0]
    assert item["tokens"] == result.tokens and item["shape"] == [6, 12, len(result.tokens), len(result.tokens)]
    assert {"rollout", "norms", "norms_summed", "head_stats"} <= set(item) and data["model"] == "minilm"
    with pytest.raises(AttnserveError, match="to_html needs every head's map"):
        averaged.to_html(tmp_path / "no.html")
    with pytest.raises(AttnserveError, match="to_html needs every layer from the first, in order"):
        last.to_html(tmp_path / "no.html")  # one map, of layer 5, would be shown as layer 0
