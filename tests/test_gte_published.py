"""GTE v1.5 as published on the Hub (model/gte.py's "new" family): config.json with model_type "new", NewModel /
NewForMaskedLM / NewForTokenClassification and an auto_map to Alibaba-NLP/new-impl, weights under the remote code's
key names. The folders are written from tiny transformers GteModel checkpoints (tiny_gte.py): transformers' own
tensors, renamed as conversion_mapping.py's "gte" entry reverses (published_keys), and the config rewritten as the
published ones are. The reference stays transformers' GteModel and sentence-transformers on the original folder."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from attnserve.engine.engine import Engine
from attnserve.errors import CheckpointError
from attnserve.export.artifacts import build_artifacts
from attnserve.model.checkpoint import load_encoder, read_checkpoint

from .checkpoints import edit_json
from .families_table import TEXTS
from .family_parity import cosines, max_error, padded_batch_with_types, transformers_model
from .tiny_gte import save_tiny_gte

REMOTE = "Alibaba-NLP/new-impl"
AUTO_MAP = {"AutoConfig": f"{REMOTE}--configuration.NewConfig", "AutoModel": f"{REMOTE}--modeling.NewModel",
            "AutoModelForMaskedLM": f"{REMOTE}--modeling.NewForMaskedLM",
            "AutoModelForTokenClassification": f"{REMOTE}--modeling.NewForTokenClassification"}
# transformers' runtime names -> the remote code's (conversion_mapping.py's "gte" WeightRenamings, reversed).
RENAMED = [(r"^layers\.", "encoder.layer."), (r"\.self_attn\.o_proj\.", ".attention.o_proj."),
           (r"\.post_attention_layernorm\.", ".attn_ln."), (r"\.post_mlp_layernorm\.", ".mlp_ln."),
           (r"^lm_head\.layer_norm\.", "lm_head.norm.")]
# Its WeightConverters, reversed: the chunks concatenated again, in the order Chunk(dim=0) splits them.
PACKED = {"self_attn.q_proj": ("attention.qkv_proj", ("q_proj", "k_proj", "v_proj")),
          "mlp.up_proj": ("mlp.up_gate_proj", ("up_proj", "gate_proj"))}


def published_keys(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """transformers' GteModel / GteForMaskedLM state dict (runtime names) -> the remote code's checkpoint: the encoder
    under `prefix` ("" for NewModel, "new." for NewForMaskedLM, its PrefixChange(prefix_to_remove="new") reversed)."""
    out: dict[str, torch.Tensor] = {}
    for original, tensor in state.items():
        if re.search(r"\.(self_attn\.[kv]_proj|mlp\.gate_proj)\.", original):
            continue  # packed with q_proj / up_proj below
        head, key = original.startswith("lm_head."), original.removeprefix("gte.")
        for first, (packed, parts) in PACKED.items():
            if f".{first}." in key:
                pieces = [state[original.replace(f".{parts[0]}.", f".{part}.")] for part in parts]
                key, tensor = key.replace(f".{first}.", f".{packed}."), torch.cat(pieces, dim=0)
        for pattern, replacement in RENAMED:
            key = re.sub(pattern, replacement, key)
        out[key if head else prefix + key] = tensor.detach().clone().contiguous()
    return out


def save_published(original: Path, directory: Path, architecture: str = "NewModel", **config) -> Path:
    """The folder `original` (a transformers GteModel / GteForMaskedLM, maybe with a sentence-transformers
    pipeline) as the Hub publishes GTE v1.5: the remote code's config.json and key names."""
    import transformers
    from safetensors.torch import save_file

    shutil.copytree(original, directory)
    model = transformers.AutoModel.from_pretrained(str(original)) if architecture != "NewForMaskedLM" else \
        transformers.GteForMaskedLM.from_pretrained(str(original))
    tensors = published_keys(model.state_dict(), "new." if architecture != "NewModel" else "")
    tensors.pop("lm_head.decoder.weight", None)  # tied to the word embeddings, as saved
    if architecture == "NewForTokenClassification":
        hidden = model.config.hidden_size
        tensors.update({"classifier.weight": torch.randn(1, hidden), "classifier.bias": torch.zeros(1)})
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    raw = json.loads((original / "config.json").read_text())
    rope = raw.pop("rope_parameters")
    raw.update(model_type="new", architectures=[architecture], auto_map=AUTO_MAP, rope_theta=rope["rope_theta"],
               rope_scaling=None, position_embedding_type="rope", layer_norm_type="layer_norm", pack_qkv=True,
               unpad_inputs=False, use_memory_efficient_attention=False, logn_attention_scale=False,
               logn_attention_clip1=False, transformers_version="4.39.1", torch_dtype="float32")
    if architecture == "NewForTokenClassification":
        raw.update(id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
    (directory / "config.json").write_text(json.dumps({**raw, **config}, indent=2))
    return directory


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_tiny_gte(tmp_path_factory.mktemp("gte") / "model")


@pytest.fixture(scope="module")
def published(model_dir, tmp_path_factory) -> Path:
    return save_published(model_dir, tmp_path_factory.mktemp("gte") / "published")


def test_published_keys_are_what_transformers_saves(model_dir, published):
    """transformers writes the remote code's names back when it saves: the renaming here is conversion_mapping's,
    reversed, or both would disagree."""
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), "pt") as a, \
            safe_open(str(published / "model.safetensors"), "pt") as b:
        assert sorted(a.keys()) == sorted(b.keys())
        assert all(torch.equal(a.get_tensor(k), b.get_tensor(k)) for k in a.keys())


@pytest.mark.parametrize("architecture", ["NewModel", "NewForMaskedLM", "NewForTokenClassification"])
def test_published_checkpoint_matches_transformers_on_the_original(model_dir, tmp_path, architecture):
    folder = save_published(model_dir, tmp_path / "published", architecture)
    ckpt = read_checkpoint(folder)
    assert ckpt.config.family == "new"
    encoder = load_encoder(ckpt)
    reference = transformers_model(model_dir, "eager")
    for seed, lengths in enumerate([(1,), (16, 9, 1), (100, 64, 7, 100)]):
        ids, mask, _ = padded_batch_with_types(lengths, encoder.config.vocab_size, seed)
        with torch.no_grad():
            got, _ = encoder(ids, mask)
            want = reference(input_ids=ids, attention_mask=mask).last_hidden_state
        assert max_error(got, want, mask) <= 1e-4, lengths


def test_published_ntk_config_is_read(published, tmp_path):
    """gte-base-en-v1.5's form: rope_theta with rope_scaling {"type": "ntk", "factor": 2.0}."""
    scaled = tmp_path / "scaled"
    shutil.copytree(published, scaled)
    edit_json(scaled / "config.json", rope_theta=500_000, rope_scaling={"type": "ntk", "factor": 2.0})
    cfg = read_checkpoint(scaled).config
    assert (cfg.rope_theta, cfg.ntk_factor, cfg.family) == (500_000.0, 2.0, "new")


def test_engine_over_the_published_folder_encodes_as_sentence_transformers_over_the_original(model_dir, tmp_path,
                                                                                              monkeypatch):
    """Exported without transformers asking whether to run the auto_map's remote code (its tokenizer check)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling

    from .checkpoints import save_pipeline

    st_dir = save_pipeline(model_dir, tmp_path / "st", lambda size: [Pooling(size, "cls"), Normalize()],
                           max_seq_length=48)
    folder = save_published(st_dir, tmp_path / "published")
    monkeypatch.setattr("builtins.input", lambda *args: pytest.fail(f"transformers asked: {args}"))
    out = tmp_path / "artifacts"
    # The fp32 graph, which the comparison reads: the rotary encoder's other variants are held on
    # tests/test_family_conformance.py's nomic_bert row.
    build_artifacts(read_checkpoint(folder), out, log=lambda line: None, variants=["embeddings"])
    expected = SentenceTransformer(str(st_dir), device="cpu").encode(TEXTS)
    encoded = Engine.from_directory(out).encode(TEXTS)
    assert cosines(encoded.embeddings, expected).min() >= 0.99999
    assert json.loads((out / "manifest.json").read_text())["family"] == "new"


REFUSED = [
    ({"auto_map": {"AutoModel": "someone/other-impl--modeling.NewModel"}}, "model_type 'new' is read only as GTE"),
    ({"auto_map": None}, "model_type 'new' is read only as GTE v1.5, whose auto_map names Alibaba-NLP/new-impl"),
    ({"architectures": ["NewForSequenceClassification"]}, "cannot reproduce architecture NewForSequenceClassification"),
    ({"architectures": ["NewForTokenClassification"], "id2label": {"0": "O", "1": "B-PER"}},
     "cannot reproduce NewForTokenClassification with 2 labels"),
    ({"rope_theta": None}, "a published GTE config must give rope_theta"),
    ({"logn_attention_scale": True}, "cannot reproduce logn_attention_scale True (only False)"),
    ({"rope_scaling": {"type": "ntk", "factor": 2.0, "mixed_b": 0.5}}, "cannot reproduce rope settings"),
]


@pytest.mark.parametrize("change, fragment", REFUSED, ids=[f"{'-'.join(c)}{i}" for i, (c, _) in enumerate(REFUSED)])
def test_what_is_not_gte_v15_is_refused_in_one_line(published, tmp_path, change, fragment):
    checkpoint = tmp_path / "refused"
    shutil.copytree(published, checkpoint)
    edit_json(checkpoint / "config.json", **change)
    with pytest.raises(CheckpointError) as refused:
        read_checkpoint(checkpoint)
    assert fragment in str(refused.value) and "\n" not in str(refused.value)
