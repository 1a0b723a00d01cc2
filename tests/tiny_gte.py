"""A tiny random-weight GTE v1.5 saved by transformers itself (GteModel), with a lowercasing WordPiece tokenizer
as gte-base-en-v1.5's; and GTE v1.5 as published on the Hub (model/gte.py's "new" family): config.json with
model_type "new", NewModel / NewForMaskedLM / NewForTokenClassification and an auto_map to Alibaba-NLP/new-impl,
weights under the remote code's key names, written from transformers' own tensors renamed as conversion_mapping.py's
"gte" entry reverses."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch

from .checkpoints import save_rotary_bert


def save_tiny_gte(directory: Path, model_class: str = "GteModel", seed: int = 0, **config) -> Path:
    """checkpoints.save_rotary_bert's GTE: no token types (as gte-base-en-v1.5) and plain rotary positions
    (transformers cannot load the NTK-scaled ones: test_family_conformance.py scales a copy)."""
    return save_rotary_bert(directory, "GteConfig", model_class, seed, **{
        "type_vocab_size": 0, "pad_token_id": 0, "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0},
        **config})


def alibaba_ntk_inv_freq(head_size: int, base: float, factor: float) -> torch.Tensor:
    """The reference frequencies, written out as Alibaba's NTKScalingRotaryEmbedding (and vLLM's) computes them
    (mixed_b None): the base times the factor, then every frequency divided by factor ** (2 / dim)."""
    scaled_base = base * factor
    inv_freq = 1.0 / (scaled_base ** (torch.arange(0, head_size, 2).float() / head_size))
    return inv_freq / factor ** (2 / head_size)


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
