"""The generated gRPC code is exactly what protos/generate.py makes from protos/ today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_generated_code_is_up_to_date():
    result = subprocess.run([sys.executable, str(ROOT / "protos/generate.py"), "--check"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr + result.stdout


def test_the_contract_of_design_md():
    from attnserve.v1 import encoder_pb2 as pb

    service = pb.DESCRIPTOR.services_by_name["Encoder"]
    assert service.full_name == "attnserve.v1.Encoder"
    methods = {m.name: (m.client_streaming, m.server_streaming) for m in service.methods}
    assert methods == {"Embed": (False, False), "EmbedStream": (True, True), "GetModelInfo": (False, False),
                       "ListModels": (False, False),  # ListModels: added with several models per server
                       "Rerank": (False, False),  # Rerank: added with cross-encoders (issue 13)
                       "Similarity": (False, False),  # Similarity: TEI's /similarity (issue 22)
                       "Classify": (False, False)}  # Classify: TEI's /predict (issue 22)
    fields = {f.name: f.number for f in pb.EmbedRequest.DESCRIPTOR.fields}
    assert fields == {"inputs": 1, "pooling": 2, "normalize": 3, "return_token_embeddings": 4, "attention": 5,
                      "truncate": 6, "dimensions": 7, "truncation_direction": 8,  # 7, 8: added with the HTTP door
                      "model": 9, "prompt_name": 10, "prompt": 11,  # 9-11: several models, prompts
                      "task": 12,  # 12: jina-embeddings-v3's task adapters (issue 20)
                      "embedding_type": 13, "ranges": 14,  # 13, 14: quantized embeddings (issue 22)
                      "sparse": 15,  # 15: SPLADE's sparse embeddings (issue 22)
                      "multi_vector": 16,  # 16: ColBERT's vectors (issue 22)
                      "late_chunking": 17}  # 17: late chunking (issue 34)
    # truncate is optional (issue 19): unset (the server's --long-inputs) and false differ
    assert pb.EmbedRequest.DESCRIPTOR.fields_by_name["truncate"].has_presence
    assert pb.RerankRequest.DESCRIPTOR.fields_by_name["truncate"].has_presence
    fields = {f.name: f.number for f in pb.AttentionOptions.DESCRIPTOR.fields}
    assert fields == {"layers": 1, "average_heads": 2, "heads": 3,
                      "analyses": 4, "weights": 5}  # 4, 5: analyses computed in the server (issue 23)
    assert pb.AttentionOptions.DESCRIPTOR.fields_by_name["weights"].has_presence  # unset: true
    fields = {f.name: f.number for f in pb.Embedding.DESCRIPTOR.fields}
    assert fields == {"sentence_embedding": 1, "token_embeddings": 2, "attentions": 3, "tokens": 4, "num_tokens": 5,
                      "truncated": 6, "pair_start": 7,  # 7: added with sentence pairs
                      "sparse_embedding": 8,  # 8: SPLADE (issue 22)
                      "multi_vector": 9,  # 9: ColBERT (issue 22)
                      "analyses": 10,  # 10: attention analyses (issue 23)
                      "windows": 11, "chunks": 12,  # 11, 12: long inputs' windows, late chunks (issue 34)
                      "patches": 13}  # 13: where an image's positions lie (issue 36)
    fields = {f.name: f.number for f in pb.Input.DESCRIPTOR.fields}
    assert fields == {"text": 1, "token_ids": 2, "pair": 3, "image": 4}  # 4: an image-text model's image (issue 36)
    assert {f.name: f.number for f in pb.Image.DESCRIPTOR.fields} == {"data": 1, "url": 2, "mime_type": 3}
