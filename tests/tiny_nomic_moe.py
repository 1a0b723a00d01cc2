"""A tiny random-weight nomic-embed-text-v2-moe, saved by its published modelling code (tests/reference/nomic_moe,
the file its config.json's auto_map names, copied into the folder as the Hub's folder has it): the published
config.json's structure at tiny sizes (a mixture of 8 experts, top 2, in every other layer; gelu; biases; one
token type; pad_vocab_size_multiple 64 over a vocabulary that is not a multiple of it), an XLM-R-style tokenizer,
and sentence-transformers' files as the Hub folder has them (mean pooling, Normalize, its prompts)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from .checkpoints import ROBERTA_SPECIALS, save_fast_tokenizer

REFERENCE = Path(__file__).parent / "reference" / "nomic_moe"
REMOTE_FILES = ("configuration_hf_nomic_bert.py", "modeling_hf_nomic_bert.py")
PROMPTS = {"query": "search_query: ", "passage": "search_document: "}


def published_config(vocab_size: int, pad_token_id: int, **changes: Any) -> dict[str, Any]:
    """nomic-embed-text-v2-moe's config.json at tiny sizes (n_embd 32, 4 heads, 4 layers, n_inner 48), its auto_map
    naming the modelling code beside it rather than on the Hub."""
    return {
        "architectures": ["NomicBertModel"], "model_type": "nomic_bert",
        "auto_map": {"AutoConfig": "configuration_hf_nomic_bert.NomicBertConfig",
                     "AutoModel": "modeling_hf_nomic_bert.NomicBertModel"},
        "activation_function": "gelu", "attn_pdrop": 0.0, "bos_token_id": None, "causal": False,
        "dense_seq_output": True, "embd_pdrop": 0.1, "eos_token_id": None, "expert_choice_router": False,
        "ffn_div": 1, "fused_bias_fc": True, "fused_dropout_add_ln": True, "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05, "max_trained_positions": 2048, "mlp_fc1_bias": True, "mlp_fc2_bias": True,
        "moe_every_n_layers": 2, "moe_impl": "megablocks", "moe_normalize_expert_weights": False,
        "moe_resid_pdrop": 0.0, "moe_top_k": 2, "n_embd": 32, "n_head": 4, "n_inner": 48, "n_layer": 4,
        "n_positions": 2048, "num_experts": 8, "num_shared_experts": 0, "pad_token_id": pad_token_id,
        "pad_vocab_size_multiple": 64, "parallel_block": False, "parallel_block_tied_norm": False,
        "prenorm": False, "qkv_proj_bias": True, "reorder_and_upcast_attn": False, "resid_pdrop": 0.0,
        "rotary_emb_base": 10000, "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
        "rotary_emb_scale_base": None, "rotary_scaling_factor": None, "router_aux_loss_coef": 0.1,
        "scale_attn_by_inverse_layer_idx": False, "scale_attn_weights": True, "type_vocab_size": 1,
        "use_cache": True, "use_flash_attn": True, "use_rms_norm": False, "use_xentropy": True,
        "vocab_size": vocab_size, **changes}


def reference_model(directory: Path):
    """The published code's NomicBertModel over a folder, loaded by its own from_pretrained (which loads with
    strict=False: the caller checks every weight arrived)."""
    from .reference.nomic_moe.modeling_hf_nomic_bert import NomicBertModel

    return NomicBertModel.from_pretrained(str(directory)).eval()


def save_tiny_nomic_moe(directory: Path, seed: int = 0, **changes: Any) -> Path:
    """The folder, its weights drawn wider than the code's initialisation (which leaves the experts' w1 and w2
    uninitialised): norms around 1, attention's 0.1 around 0 (wider, it makes every token alike and the routers send
    them all to the same few experts), the rest 0.2 (the routers' top two weights sum to about a half).
    changes: config.json settings over the published ones."""
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer

    from .reference.nomic_moe.configuration_hf_nomic_bert import NomicBertConfig
    from .reference.nomic_moe.modeling_hf_nomic_bert import NomicBertModel
    from .tiny_tokenizers import xlmr_style

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer.from_file(str(xlmr_style(directory / "tokenizer.json")))
    raw = published_config(tokenizer.get_vocab_size(), tokenizer.token_to_id("<pad>"), **changes)
    torch.manual_seed(seed)
    model = NomicBertModel(NomicBertConfig(**raw), add_pooling_layer=False)  # pads its vocabulary to 2048 rows
    with torch.no_grad():
        for name, param in model.named_parameters():
            norm = ("norm" in name or "emb_ln" in name) and name.endswith("weight")
            spread = 0.1 if "attn." in name else 0.2  # attention narrower: tokens stay apart, reach every expert
            param.copy_(1.0 + 0.3 * torch.randn_like(param) if norm else spread * torch.randn_like(param))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(raw, indent=2))
    for name in REMOTE_FILES:
        shutil.copyfile(REFERENCE / name, directory / name)
    save_fast_tokenizer(directory, directory / "tokenizer.json", **ROBERTA_SPECIALS, model_max_length=512)
    return directory


def save_sentence_transformers_files(directory: Path, max_seq_length: int) -> Path:
    """sentence-transformers' files as nomic-embed-text-v2-moe's folder has them, written beside the model (its
    Transformer module at the folder's root): Transformer -> mean Pooling -> Normalize, with its prompts."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (directory / "modules.json").write_text(json.dumps(modules, indent=2))
    (directory / "sentence_bert_config.json").write_text(json.dumps(
        {"max_seq_length": max_seq_length, "do_lower_case": False}))
    (directory / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": PROMPTS, "default_prompt_name": None, "similarity_fn_name": "cosine"}, indent=2))
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": json.loads((directory / "config.json").read_text())["n_embd"],
         "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
         "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
         "pooling_mode_lasttoken": False, "include_prompt": True}, indent=2))
    (directory / "2_Normalize").mkdir(exist_ok=True)
    return directory
