"""Every encoder family against code nobody here wrote: transformers' own model classes and sentence-transformers.

For each family a tiny random-weight model is saved by transformers' class (BertModel, RobertaModel,
XLMRobertaModel, DistilBertModel, MPNetModel) with a real tokenizer of the family's kind, and wrapped as a
sentence-transformers pipeline by sentence-transformers itself. Then:
- our Encoder's last_hidden_state equals transformers' to 1e-4 (BERT also with real token types);
- the exported artifacts (verified at export) encode texts as sentence-transformers does, cosine >= 0.99999;
- a BERT pair's embedding through the graph's token_type_ids equals transformers' with the same types, to 1e-4.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from attnserve.engine.batching import pad
from attnserve.engine.engine import Engine
from attnserve.engine.session import CPU, open_session
from attnserve.engine.tokenizer import TextTokenizer
from attnserve.export.artifacts import build_artifacts
from attnserve.model.checkpoint import load_encoder, read_checkpoint
from attnserve.model.pooling import pool

from .checkpoints import save_sentence_transformer, save_tiny_family

FAMILIES = ["bert", "roberta", "xlm-roberta", "distilbert", "mpnet"]
# Upper case, accents, pieces outside the tiny vocabularies, and a text past max_seq_length (48).
TEXTS = ["hello world", "A LONGER sentence, with punctuation!", "café über naïve 42", "x",
         "the quick brown fox jumps over the lazy dog " * 12]
MAX_SEQ_LENGTH = 48


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory) -> tuple[str, Path, Path]:
    """(family, transformers' folder, sentence-transformers' folder over it)."""
    root = tmp_path_factory.mktemp(request.param)
    model = save_tiny_family(root / "model", request.param)
    return request.param, model, save_sentence_transformer(model, root / "st", "mean", normalize=False,
                                                            max_seq_length=MAX_SEQ_LENGTH)


def _transformers_hidden(model: Path, ids: np.ndarray, mask: np.ndarray, types: np.ndarray | None) -> np.ndarray:
    from transformers import AutoModel

    reference = AutoModel.from_pretrained(str(model)).eval()
    kwargs = {} if types is None else {"token_type_ids": torch.from_numpy(types)}
    with torch.no_grad():
        return reference(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                         **kwargs).last_hidden_state.numpy()


def test_encoder_matches_transformers(family):
    name, model, st = family
    ckpt = read_checkpoint(st)
    assert ckpt.config.family == name
    encoder = load_encoder(ckpt)
    inputs = TextTokenizer(ckpt.tokenizer_file, ckpt.max_seq_length, ckpt.config.vocab_size).encode_texts(TEXTS)
    # Padded as transformers pads (its positions after padding look at the pad id); real tokens must match.
    ids, mask = pad([x.ids for x in inputs], pad_id=ckpt.config.pad_token_id)
    with torch.no_grad():
        ours = encoder(torch.from_numpy(ids), torch.from_numpy(mask))[0].numpy()
    theirs = _transformers_hidden(model, ids, mask, None)
    real = mask.astype(bool)
    assert np.abs(ours - theirs)[real].max() <= 1e-4
    if ckpt.config.has_token_types:
        types = np.zeros_like(ids)
        types[:, 3:] = 1  # a second segment from the fourth token on
        with torch.no_grad():
            ours = encoder(torch.from_numpy(ids), torch.from_numpy(mask), token_type_ids=torch.from_numpy(types))[0]
        assert np.abs(ours.numpy() - _transformers_hidden(model, ids, mask, types))[real].max() <= 1e-4


WHOLE = ("distilbert", "xlm-roberta")


def test_export_encodes_as_sentence_transformers(family, tmp_path):
    from sentence_transformers import SentenceTransformer

    name, model, st = family
    ckpt = read_checkpoint(st)
    # Every variant for the families no other test exports whole; for BERT (the default model's, tests/conftest.py),
    # RoBERTa (XLM-RoBERTa's graph) and MPNet (tests/test_real_models.py), the graphs this test reads.
    variants = None if name in WHOLE else ["embeddings", "embeddings_fused", "attention", "attention_last"]
    manifest = build_artifacts(ckpt, tmp_path / "artifacts", log=lambda m: None, variants=variants)
    assert manifest.family == name
    graph_inputs = [i.name for i in open_session(tmp_path / "artifacts" / "embeddings.onnx", CPU).get_inputs()]
    assert graph_inputs == ["input_ids", "attention_mask"] + (["token_type_ids"] if name == "bert" else [])
    # MPNet's position bias stops the Attention fusion: its "fused" graph says it is not.
    assert manifest.variants["embeddings_fused"].fused == (name != "mpnet")
    # Each head's value norms (model/value_norms.py), verified against the PyTorch encoder at export.
    assert manifest.variants["attention"].parity["max_rel_value_norms"] <= 1e-4
    # The last layer's maps and rollout in a graph of their own (export/attention_last.py), verified alike.
    last = manifest.variants["attention_last"].parity
    assert last["max_abs_rollout"] <= 1e-4 and last["max_abs_attentions"] <= 1e-4 and last["max_padded_key_weight"] == 0
    encoded = Engine.from_directory(tmp_path / "artifacts").encode(TEXTS)
    assert encoded.truncated.tolist() == [False] * 4 + [True]
    reference = SentenceTransformer(str(st), device="cpu").encode(TEXTS)
    cosine = (encoded.embeddings * reference).sum(1) / np.linalg.norm(encoded.embeddings, axis=1) \
        / np.linalg.norm(reference, axis=1)
    assert cosine.min() >= 0.99999, cosine
    assert np.abs(encoded.embeddings - reference).max() <= 1e-4
    on_disk = json.loads((tmp_path / "artifacts" / "manifest.json").read_text())
    assert on_disk["family"] == name


def test_a_pair_through_the_graph_matches_transformers_with_the_same_token_types(tmp_path):
    model = save_tiny_family(tmp_path / "model", "bert")
    st = save_sentence_transformer(model, tmp_path / "st", "mean", normalize=False, max_seq_length=MAX_SEQ_LENGTH)
    ckpt = read_checkpoint(st)
    build_artifacts(ckpt, tmp_path / "artifacts", log=lambda m: None, variants=["embeddings", "embeddings_fused"])
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(ckpt.tokenizer_file))
    pairs = tokenizer.encode_batch([("hello world", "a longer second segment, with punctuation!"),
                                    ("x", "y"), ("the quick brown fox", "jumps over the lazy dog")])
    ids, mask = pad([np.asarray(e.ids) for e in pairs])
    types, _ = pad([np.asarray(e.type_ids) for e in pairs])
    assert types.any()
    session = open_session(tmp_path / "artifacts" / "embeddings_fused.onnx", CPU)
    hidden, sentence = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
    theirs = _transformers_hidden(model, ids, mask, types)
    expected = pool(torch.from_numpy(theirs), torch.from_numpy(mask), "mean").numpy()
    assert np.abs(sentence - expected).max() <= 1e-4
    assert np.abs(hidden - theirs)[mask.astype(bool)].max() <= 1e-4
    # The same rows without types are another input: the types really reach the graph.
    without = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[1]
    assert np.abs(without - sentence).max() > 1e-3


@pytest.mark.parametrize("name,model_class", [
    ("roberta", "RobertaForMaskedLM"), ("xlm-roberta", "XLMRobertaForMaskedLM"),
    ("distilbert", "DistilBertForMaskedLM"), ("mpnet", "MPNetForMaskedLM")])
def test_masked_lm_checkpoints_load_as_automodel_loads_them(tmp_path, name, model_class):
    # A masked-LM save prefixes the encoder's keys ("roberta.", "distilbert.", "mpnet.") and adds its head,
    # which goes unused, as transformers' AutoModel (what sentence-transformers loads) leaves it.
    model = save_tiny_family(tmp_path / "mlm", name, model_class=model_class)
    ckpt = read_checkpoint(model)
    inputs = TextTokenizer(ckpt.tokenizer_file, 32, ckpt.config.vocab_size).encode_texts(TEXTS)
    ids, mask = pad([x.ids for x in inputs], pad_id=ckpt.config.pad_token_id)
    with torch.no_grad():
        ours = load_encoder(ckpt)(torch.from_numpy(ids), torch.from_numpy(mask))[0].numpy()
    assert np.abs(ours - _transformers_hidden(model, ids, mask, None))[mask.astype(bool)].max() <= 1e-4


def test_legacy_gamma_beta_layer_norm_names_load(tmp_path):
    from safetensors.torch import load_file, save_file

    model = save_tiny_family(tmp_path / "model", "bert")
    expected = load_encoder(read_checkpoint(model)).state_dict()
    tensors = load_file(model / "model.safetensors")
    renamed = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
               for k, v in tensors.items()}
    assert sum(k.endswith("gamma") for k in renamed) == 5  # embeddings and two per layer
    save_file(renamed, model / "model.safetensors", metadata={"format": "pt"})
    loaded = load_encoder(read_checkpoint(model)).state_dict()
    assert all((loaded[k] == v).all() for k, v in expected.items())
