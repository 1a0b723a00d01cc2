"""PyLate's own vectors for tests/test_pylate_colbert.py, stored because PyLate cannot run beside attnserve.

pylate 1.6.0 pins sentence-transformers 5.3.0 and transformers <= 5.3.0, older than the ones attnserve runs
(sentence-transformers 6.3, transformers 5.24), so it lives in a venv of its own:

    python -m venv /tmp/venv-pylate-ref
    /tmp/venv-pylate-ref/bin/pip install torch==2.13.0 sentence-transformers==5.3.0 transformers==5.3.0
    /tmp/venv-pylate-ref/bin/pip install --no-deps pylate==1.6.0   # its fast-plaid pin (indexes only) wants torch 2.7
    cd <repo> && /tmp/venv-pylate-ref/bin/python -m tests.goldens.make_pylate_goldens

For each published model's layout it builds a tiny random-weight backbone with this repository's tiny tokenizers
(tests/checkpoints.py, which need only transformers and tokenizers), lets pylate.models.ColBERT make the ColBERT
model of it (adding the marker tokens, the projection) and save it, loads that folder back as a user would, and
encodes QUERIES and DOCUMENTS with it. The folders themselves are kept (tests/goldens/pylate/<name>/, a few hundred
KB each), so that attnserve reads the very bytes PyLate read; <name>.npz holds, per text, its (n_i, d) vectors.
"""

from __future__ import annotations

import json
import shutil
import string
import tempfile
from pathlib import Path

import numpy as np

from tests.checkpoints import save_model, save_tiny_modernbert, save_wordpiece_tokenizer, tiny_vocab

HERE = Path(__file__).parent / "pylate"
# Queries: one short (expanded), one past query_length (cut), one with leading and trailing blanks (PyLate's
# sentence-transformers strips them), one with unknown characters.
QUERIES = ["what is the capital of france?", "a", "which encoders score each token of a query on its own? " * 3,
           "  padded on both sides \t", "¿dónde está la biblioteca? ☃"]
# Documents: punctuation (skip-listed), only punctuation, past document_length, unknown characters, blanks.
DOCUMENTS = ["paris is the capital of france.", "hello, world!", "!!! ... ???", "a",
             "encoders " * 40, "the snowman ☃ is unknown; so is ¿ here.", "\n  leading and trailing  \n",
             "late interaction keeps one vector per token (minus punctuation)."]


def gte_moderncolbert(work: Path) -> tuple[Path, dict]:
    """GTE-ModernColBERT-v1's layout: ModernBERT, "[Q] " and "[D] " added to the tokenizer as tokens, a Dense
    without bias to d, query_length 32 (here 12), document_length 300 (here 40), expansion not attended. Its local
    layers' half window (64 there, 4 here) does not reach from a short query's text to its last [MASK]s here, so
    those see no attended key in the local layers (transformers' SDPA gives them no attention there)."""
    base = save_tiny_modernbert(work / "modernbert")
    return base, dict(embedding_size=16, query_prefix="[Q] ", document_prefix="[D] ", query_length=12,
                      document_length=40, attend_to_expansion_tokens=False)


def tiny_uncased_bert(base: Path, seed: int) -> Path:
    """A 2-layer, hidden-32 BERT over a tiny lowercasing WordPiece that has [unused0] and [unused1] at ids 1 and 2,
    as bert-base-uncased has them."""
    import transformers

    save_wordpiece_tokenizer(base, 150)
    vocab = json.loads((base / "tokenizer.json").read_text())
    pieces = list(tiny_vocab(150))
    order = [pieces[0], "[unused0]", "[unused1]", *pieces[1:]]
    vocab["model"]["vocab"] = {t: i for i, t in enumerate(order)}
    for special in vocab["post_processor"]["special_tokens"].values():
        special["ids"] = [order.index(special["id"])]
    for added in vocab["added_tokens"]:
        added["id"] = order.index(added["content"])
    (base / "tokenizer.json").write_text(json.dumps(vocab))
    transformers.PreTrainedTokenizerFast(tokenizer_file=str(base / "tokenizer.json"), unk_token="[UNK]",
                                         pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
                                         mask_token="[MASK]", model_max_length=64).save_pretrained(base)
    config = transformers.BertConfig(vocab_size=len(order), hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    save_model(base, config, "BertModel", seed=seed)
    return base


def bert_pylate(work: Path) -> tuple[Path, dict]:
    """PyLate's layout over a BERT with markers [unused0] / [unused1] and no query expansion: a query keeps its own
    tokens, unpadded."""
    return tiny_uncased_bert(work / "bert", seed=1), dict(
        embedding_size=8, query_prefix="[unused0]", document_prefix="[unused1]", query_length=16,
        document_length=48, do_query_expansion=False)


def answerai_colbert_small(work: Path) -> Path:
    """answerai-colbert-small-v1's layout, Stanford-NLP ColBERT's: config.json's architectures ["HF_ColBERT"], the
    BERT's weights under "bert." and the projection as "linear.weight" (96 x 384 there, 8 x 32 here) in one
    model.safetensors, artifact.metadata with the markers [unused0] / [unused1], query_maxlen 32 (here 16),
    doc_maxlen 300 (here 48), expansion attended. PyLate reads this folder as it is."""
    import torch
    from safetensors.torch import load_file, save_file

    base = tiny_uncased_bert(work / "stanford_bert", seed=2)
    weights = {f"bert.{k}": v for k, v in load_file(str(base / "model.safetensors")).items()}
    weights["linear.weight"] = 0.3 * torch.randn(8, 32, generator=torch.Generator().manual_seed(3))
    folder = HERE / "answerai_colbert_small"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((base / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["HF_ColBERT"]}, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(base / name, folder / name)
    (folder / "artifact.metadata").write_text(json.dumps({
        "query_token_id": "[unused0]", "doc_token_id": "[unused1]", "query_maxlen": 16, "doc_maxlen": 48,
        "dim": 8, "attend_to_mask_tokens": True, "similarity": "cosine", "mask_punctuation": True}, indent=2))
    return folder


def encode(name: str, folder: Path) -> None:
    """PyLate's vectors of QUERIES and DOCUMENTS from the folder, loaded as a user loads it."""
    from pylate import models

    model = models.ColBERT(str(folder), device="cpu")
    queries = model.encode(QUERIES, is_query=True, batch_size=2)
    documents = model.encode(DOCUMENTS, is_query=False, batch_size=3)
    np.savez(HERE / f"{name}.npz", **{f"query_{i}": v for i, v in enumerate(queries)},
             **{f"document_{i}": v for i, v in enumerate(documents)})
    print(name, [len(v) for v in queries], [len(v) for v in documents])


def build(name: str, make, work: Path) -> None:
    """PyLate's ColBERT made of the backbone, saved by PyLate, then encode()."""
    import torch
    from pylate import models

    base, settings = make(work)
    torch.manual_seed(0)  # the Dense PyLate adds, and any rows it adds to the embeddings for the markers
    model = models.ColBERT(str(base), device="cpu", skiplist_words=[*string.punctuation, "not-a-token"], **settings)
    folder = HERE / name
    shutil.rmtree(folder, ignore_errors=True)
    model.save(str(folder))
    (folder / "README.md").unlink(missing_ok=True)  # a model card with the build's dates: not needed
    encode(name, folder)


def main() -> None:
    HERE.mkdir(exist_ok=True)
    (HERE / "texts.json").write_text(json.dumps({"queries": QUERIES, "documents": DOCUMENTS}, ensure_ascii=False,
                                                indent=1) + "\n")
    with tempfile.TemporaryDirectory() as work:
        for name, make in (("gte_moderncolbert", gte_moderncolbert), ("bert_pylate", bert_pylate)):
            build(name, make, Path(work))
        encode("answerai_colbert_small", answerai_colbert_small(Path(work)))


if __name__ == "__main__":
    main()
