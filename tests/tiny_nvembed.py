"""A tiny NV-Embed checkpoint: nvidia/NV-Embed-v2's folder at tiny sizes, its weights drawn here (its published
modelling code is NVIDIA's, CC-BY-NC-4.0, and not in this repository: tests/reference/nvembed/ says how the expected
outputs were made with it).

- config.json as NV-Embed-v2's: NVEmbedModel (auto_map modeling_nvembed.NVEmbedModel), a "bidir_mistral" text_config
  (Mistral-7B's structure: grouped-query attention 4 query heads per key/value head, head size = hidden / heads,
  rms_norm_eps 1e-5, and a sliding_window that the bidirectional code ignores, here shorter than the inputs so that
  a windowed reading would show), a "latent_attention" config (its head size the hidden size, as NV-Embed-v2's
  4096 for 4096), padding_side "right", is_mask_instruction true;
- Mistral's tokenizer kind: "<s>" before a text (no end token: NV-Embed's code and model card append "</s>" to the
  text), "</s>" also its padding (add_pad_token);
- the sentence-transformers files: Transformer -> Pooling (mean, include_prompt false) -> Normalize, and the model
  card's retrieval instruction as the prompt "query".
Every weight is drawn from one seeded generator in key order (randn), so the folder is the same wherever it is made.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, processors

from .checkpoints import save_fast_tokenizer
from .tiny_tokenizers import byte_level_bpe

HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE, POSITIONS = 64, 2, 4, 1, 224, 128
LATENTS, LATENT_HEADS = 16, 2
WINDOW = 8  # text_config's sliding_window: shorter than the inputs, and not applied by the bidirectional code
MAX_SEQ_LENGTH = 120  # room for the instruction (59 tokens here) and a text after it
# NV-Embed-v2's model card: "Instruct: {task}\nQuery: " before a query, nothing before a passage.
INSTRUCTION = "Instruct: Given a question, retrieve passages that answer the question\nQuery: "
PROMPTS = {"query": INSTRUCTION, "document": ""}
SPECIALS = ["<unk>", "<s>", "</s>"]
LATENT_PREFIX = "latent_attention_model."


def config() -> dict:
    """config.json, NV-Embed-v2's structure at tiny sizes."""
    text = {"model_type": "bidir_mistral", "architectures": ["MistralModel"], "hidden_size": HIDDEN,
            "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS, "hidden_act": "silu", "max_position_embeddings": POSITIONS,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "sliding_window": WINDOW, "vocab_size": 600,
            "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False, "torch_dtype": "float32"}
    latent = {"model_type": "latent_attention", "num_latents_value": LATENTS, "num_cross_heads": LATENT_HEADS,
              "output_normalize": True, "hidden_dim": HIDDEN, "latent_dim": HIDDEN, "cross_dim_head": HIDDEN}
    return {"model_type": "nvembed", "architectures": ["NVEmbedModel"],
            "auto_map": {"AutoConfig": "configuration_nvembed.NVEmbedConfig",
                         "AutoModel": "modeling_nvembed.NVEmbedModel"},
            "hidden_size": HIDDEN, "add_eos": True, "add_pad_token": True, "is_mask_instruction": True,
            "mask_type": "b", "padding_side": "right", "torch_dtype": "float32",
            "text_config": text, "latent_attention_config": latent}


def shapes() -> dict[str, tuple[int, ...]]:
    """NVEmbedModel's state dict at these sizes, as modeling_nvembed.py names it."""
    kv, inner, latent = KV_HEADS * HIDDEN // HEADS, LATENT_HEADS * HIDDEN, LATENT_PREFIX
    out = {"embedding_model.embed_tokens.weight": (600, HIDDEN), "embedding_model.norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        layer = f"embedding_model.layers.{i}."
        out.update({
            layer + "input_layernorm.weight": (HIDDEN,), layer + "post_attention_layernorm.weight": (HIDDEN,),
            layer + "self_attn.q_proj.weight": (HIDDEN, HIDDEN), layer + "self_attn.k_proj.weight": (kv, HIDDEN),
            layer + "self_attn.v_proj.weight": (kv, HIDDEN), layer + "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
            layer + "mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
            layer + "mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
            layer + "mlp.down_proj.weight": (HIDDEN, INTERMEDIATE)})
    block0, block1 = latent + "cross_attend_blocks.0.", latent + "cross_attend_blocks.1."
    out.update({latent + "latents": (LATENTS, HIDDEN),
                block0 + "norm.weight": (HIDDEN,), block0 + "norm.bias": (HIDDEN,),
                block0 + "norm_context.weight": (HIDDEN,), block0 + "norm_context.bias": (HIDDEN,),
                block0 + "fn.to_q.weight": (inner, HIDDEN), block0 + "fn.to_kv.weight": (2 * inner, HIDDEN),
                block0 + "fn.to_out.weight": (HIDDEN, inner),
                block1 + "norm.weight": (HIDDEN,), block1 + "norm.bias": (HIDDEN,),
                block1 + "fn.net.0.weight": (8 * HIDDEN, HIDDEN), block1 + "fn.net.0.bias": (8 * HIDDEN,),
                block1 + "fn.net.2.weight": (HIDDEN, 4 * HIDDEN), block1 + "fn.net.2.bias": (HIDDEN,)})
    return out


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """Wide random weights (attention peaked, every part showing): norm scales around 1, the rest around 0."""
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for key, shape in sorted(shapes().items()):
        draw = torch.randn(shape, generator=generator)
        scale = "norm" in key.rsplit(".", 2)[-2]  # RMSNorm and LayerNorm scales
        # The latent layer's W_O and feed-forward narrower (its queries and keys as wide as the rest, its attention
        # peaked): 4x wide, and after two residuals, they would give outputs in the tens, beyond export's absolute
        # fp32 bar (1e-4) in float32's own rounding.
        spread = 0.05 if key.startswith(LATENT_PREFIX) and (".to_out." in key or ".net." in key) else 0.2
        out[key] = (1.0 + 0.3 * draw) if scale and key.endswith("weight") else spread * draw
    return out


def tokenizer(out: Path) -> Path:
    """Byte-level BPE with Mistral's template: "<s>" before a text, nothing after."""
    tok: Tokenizer = byte_level_bpe(SPECIALS)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    tok.save(str(out))
    return out


def save_tiny_nvembed(directory: Path, seed: int = 0) -> Path:
    """The folder: config.json, model.safetensors, the tokenizer's files and the sentence-transformers files."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config(), indent=2))
    save_file(weights(seed), str(directory / "model.safetensors"), metadata={"format": "pt"})
    save_fast_tokenizer(directory, tokenizer(directory / "tokenizer.json"), bos_token="<s>", eos_token="</s>",
                        unk_token="<unk>", pad_token="</s>", padding_side="right", model_max_length=POSITIONS)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (directory / "modules.json").write_text(json.dumps(modules, indent=2))
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_SEQ_LENGTH,
                                                                      "do_lower_case": False}))
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": HIDDEN, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False, "pooling_mode_lasttoken": False, "include_prompt": False}))
    (directory / "2_Normalize").mkdir(exist_ok=True)
    (directory / "config_sentence_transformers.json").write_text(json.dumps({
        "prompts": PROMPTS, "default_prompt_name": None, "similarity_fn_name": "cosine"}))
    return directory
