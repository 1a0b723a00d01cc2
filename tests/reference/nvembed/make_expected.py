"""Makes expected.npz beside this file: what NV-Embed's published modelling code gives over the tiny checkpoint
(tests/tiny_nvembed.py), which tests/test_family_conformance.py compares attnserve's export with.

The code is nvidia/NV-Embed-v2's modeling_nvembed.py and configuration_nvembed.py, as published on the Hugging Face
Hub with the model (licence: CC-BY-NC-4.0, the model's; copyright NVIDIA). It is not in this repository (its licence
is not this repository's); give the folder that holds the two files:

    python -m tests.reference.nvembed.make_expected /path/to/NV-Embed-v2

The files are checked against the sha256 of the published ones (PUBLISHED below; the copies the expected outputs
were made from were GitHub copies of the Hub repository, three of them agreeing on the latent attention layer), and
run under the transformers this repository tests with (5.x) after the edits in EDITS, each saying why: the code was
written for transformers 4.42, and none of the edits changes what it computes.

What is kept, float32, for TEXTS with "</s>" appended as NVEmbedModel.encode appends it (always_add_eos):
- documents: NVEmbedModel.encode(TEXTS, instruction="", max_length=MAX_SEQ_LENGTH): the masked mean of the latent
  attention layer's outputs, L2-normalised (output_normalize);
- queries: the same with the model card's instruction, which encode leaves out of its pool_mask (the first
  len(tokenizer.tokenize(instruction)) positions);
- tokens, token_mask, token_ids: NVEmbedModel's forward without a pool_mask (what sentence-transformers' Transformer
  module gets): each token's output of the latent attention layer, for TOKEN_TEXTS' batch;
- document_ids, query_ids: the token ids encode ran (the test checks its tokenizer gives the same);
- weights_checksum: the sum of every weight's absolute values (the test checks its tiny checkpoint has the same).
"""

from __future__ import annotations

import hashlib
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from tests.families_table import TEXTS
from tests.tiny_nvembed import INSTRUCTION, MAX_SEQ_LENGTH, save_tiny_nvembed, weights

TOKEN_TEXTS = TEXTS[3:]  # the token outputs kept: a one-letter text, one cut at MAX_SEQ_LENGTH, whitespace, CJK
PUBLISHED = {  # sha256 of the published files (configuration_nvembed.py has no newline at its end)
    "modeling_nvembed.py": "d9f71b8f68e9bb61da7cb99fef66ed9f40f310247bbe613b501b2b1466d84218",
    "configuration_nvembed.py": "79bc5d7f36032d0bc9bc41f0768ea35663626e6f9654d1770eee77410418a5c2",
}
# (file, published text, text run, why): each replaced exactly once.
EDITS = [
    ("modeling_nvembed.py",
     "from transformers.modeling_attn_mask_utils import _prepare_4d_attention_mask, "
     "_prepare_4d_attention_mask_for_sdpa\n",
     "def _prepare_4d_attention_mask(mask, dtype, tgt_len=None):\n"
     "    expanded = mask[:, None, None, :].expand(mask.shape[0], 1, tgt_len or mask.shape[1], mask.shape[1])\n"
     "    inverted = 1.0 - expanded.to(dtype)\n"
     "    return inverted.masked_fill(inverted.to(torch.bool), torch.finfo(dtype).min)\n"
     "_prepare_4d_attention_mask_for_sdpa = _prepare_4d_attention_mask\n",
     "transformers 5 removed modeling_attn_mask_utils: 4.42's _prepare_4d_attention_mask, written out (the padding "
     "mask alone, (B, 1, T, T), 0 on real keys and the dtype's minimum on padded ones); the sdpa one is never reached "
     "(the code sets eager attention)"),
    ("modeling_nvembed.py",
     "from transformers.models.mistral.modeling_mistral import MISTRAL_INPUTS_DOCSTRING\n", "",
     "transformers 5 has no MISTRAL_INPUTS_DOCSTRING (a docstring only)"),
    ("modeling_nvembed.py",
     "    @add_start_docstrings_to_model_forward(MISTRAL_INPUTS_DOCSTRING)\n", "",
     "the decorator adds that docstring only"),
    ("modeling_nvembed.py",
     "        use_cache = use_cache if use_cache is not None else self.config.use_cache\n",
     "        use_cache = False\n",
     "no cache is built (encode never reads one; transformers 5's DynamicCache has no from_legacy_cache)"),
    ("modeling_nvembed.py",
     "        hidden_states = inputs_embeds\n",
     "        hidden_states = inputs_embeds\n"
     "        position_embeddings = self.rotary_emb(hidden_states, position_ids)\n",
     "transformers 5's decoder layers take the rotary cos and sin from the model (4.42's computed them inside)"),
    ("modeling_nvembed.py",
     "                    past_key_value=past_key_values,\n",
     "                    past_key_values=None,\n                    position_embeddings=position_embeddings,\n",
     "the same layer call under transformers 5's argument names"),
    ("modeling_nvembed.py",
     "            hidden_states = layer_outputs[0]\n",
     "            hidden_states = layer_outputs[0] if isinstance(layer_outputs, tuple) else layer_outputs\n",
     "transformers 5's decoder layer returns the hidden states alone"),
    ("modeling_nvembed.py",
     "        with torch.backends.cuda.sdp_kernel(enable_flash=True, enable_mem_efficient=True):\n"
     "            out = torch.nn.functional.scaled_dot_product_attention(q, k, v)\n",
     "        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)\n",
     "the CUDA kernel choice does nothing on CPU, and newer PyTorch dropped sdp_kernel"),
    ("configuration_nvembed.py",
     "        self.cross_dim_head = cross_dim_head\n",
     "        self.cross_dim_head = cross_dim_head\n        super().__init__(**kwargs)\n",
     "transformers 5's PretrainedConfig needs its __init__ run (4.42's tolerated the missing call)"),
]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _install_code(code: Path, folder: Path) -> None:
    for name, digest in PUBLISHED.items():
        if _sha256(code / name) != digest:
            raise SystemExit(f"{code / name} is not the published file (sha256 {_sha256(code / name)})")
    texts = {name: (code / name).read_text() for name in PUBLISHED}
    for name, old, new, _why in EDITS:
        if texts[name].count(old) != 1:
            raise SystemExit(f"{name}: the edit's text is not there exactly once: {old!r}")
        texts[name] = texts[name].replace(old, new)
    for name, text in texts.items():
        (folder / name).write_text(text)


@torch.no_grad()
def expected(code: Path) -> dict[str, np.ndarray]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_tiny_nvembed(Path(tmp) / "nvembed")
        _install_code(code, folder)
        model = _load(folder).eval()
        documents = model.encode(TEXTS, instruction="", max_length=MAX_SEQ_LENGTH)
        queries = model.encode(TEXTS, instruction=INSTRUCTION, max_length=MAX_SEQ_LENGTH)
        tokenizer = model.tokenizer
        batch = tokenizer([t + tokenizer.eos_token for t in TOKEN_TEXTS], max_length=MAX_SEQ_LENGTH, padding=True,
                          truncation=True, return_tensors="pt")
        tokens = model(batch["input_ids"], batch["attention_mask"])["sentence_embeddings"]  # (N, T, H)
        document_batch = tokenizer([t + tokenizer.eos_token for t in TEXTS], max_length=MAX_SEQ_LENGTH,
                                   padding=True, truncation=True, return_tensors="pt")
        query_batch = tokenizer([INSTRUCTION + t + tokenizer.eos_token for t in TEXTS], max_length=MAX_SEQ_LENGTH,
                                padding=True, truncation=True, return_tensors="pt")
        shutil.rmtree(folder)
    return {"documents": documents.numpy(), "queries": queries.numpy(), "tokens": tokens.numpy(),
            "token_mask": batch["attention_mask"].numpy(), "token_ids": batch["input_ids"].numpy(),
            "document_ids": document_batch["input_ids"].numpy(),
            "document_mask": document_batch["attention_mask"].numpy(),
            "query_ids": query_batch["input_ids"].numpy(), "query_mask": query_batch["attention_mask"].numpy(),
            "instruction_tokens": np.array(len(tokenizer.tokenize(INSTRUCTION))),
            "weights_checksum": np.array(sum(float(w.abs().sum()) for w in weights().values()))}


def _load(folder: Path):
    """NVEmbedModel from the folder, its tokenizer from the folder too (text_config's _name_or_path). The two files
    are imported as one package, as the Hub's remote code runs them: transformers 5's remote-code loader gave the
    configuration module two identities (the model's and AutoConfig's), and AutoModel.from_config then knew neither."""
    import importlib
    import json

    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["_name_or_path"] = str(folder)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "__init__.py").write_text("")
    sys.path.insert(0, str(folder.parent))
    try:
        modeling = importlib.import_module(f"{folder.name}.modeling_nvembed")
    finally:
        sys.path.remove(str(folder.parent))
    # Built from its config and given the folder's weights, strictly (every key, no other): transformers 5's
    # from_pretrained wants a post_init the 4.42-era __init__ does not call.
    from safetensors.torch import load_file

    configuration = importlib.import_module(f"{folder.name}.configuration_nvembed")
    model = modeling.NVEmbedModel(configuration.NVEmbedConfig.from_pretrained(str(folder)))
    model.load_state_dict(load_file(str(folder / "model.safetensors")), strict=True)
    return model.float()


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    out = Path(__file__).with_name("expected.npz")
    np.savez_compressed(out, **{k: v.astype(np.float32) if v.dtype.kind == "f" else v
                                for k, v in expected(Path(sys.argv[1])).items()})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
