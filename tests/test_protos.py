"""The generated gRPC code is exactly what protos/generate.py makes from protos/ today; attnserve.v1 keeps the
contract of design.md; and attnserve's KServe v2 protos (protos/attnserve/kserve/) hold Triton's own, as
tritonclient.grpc ships them: every service method, message, field and enum value exists there with the same name,
number, type and cardinality, so the two read each other's bytes (what Triton has beside is what attnserve never
sets)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.descriptor import Descriptor
from tritonclient.grpc import model_config_pb2 as triton_config
from tritonclient.grpc import service_pb2 as triton_service

from attnserve.kserve import grpc_service_pb2, model_config_pb2
from attnserve.v1 import encoder_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent


def test_generated_code_is_up_to_date():
    result = subprocess.run([sys.executable, str(ROOT / "protos/generate.py"), "--check"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr + result.stdout


def numbers(message) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}


def test_the_contract_of_design_md():
    service = pb.DESCRIPTOR.services_by_name["Encoder"]
    assert service.full_name == "attnserve.v1.Encoder"
    assert {m.name: (m.client_streaming, m.server_streaming) for m in service.methods} == {
        "Embed": (False, False), "EmbedStream": (True, True), "GetModelInfo": (False, False),
        "ListModels": (False, False),  # ListModels: added with several models per server
        "Rerank": (False, False),  # Rerank: added with cross-encoders (issue 13)
        "Similarity": (False, False),  # Similarity: TEI's /similarity (issue 22)
        "Classify": (False, False)}  # Classify: TEI's /predict (issue 22)
    assert numbers(pb.EmbedRequest) == {
        "inputs": 1, "pooling": 2, "normalize": 3, "return_token_embeddings": 4, "attention": 5, "truncate": 6,
        "dimensions": 7, "truncation_direction": 8,  # 7, 8: added with the HTTP door
        "model": 9, "prompt_name": 10, "prompt": 11,  # 9-11: several models, prompts
        "task": 12,  # 12: jina-embeddings-v3's task adapters (issue 20)
        "embedding_type": 13, "ranges": 14,  # 13, 14: quantized embeddings (issue 22)
        "sparse": 15,  # 15: SPLADE's sparse embeddings (issue 22)
        "multi_vector": 16,  # 16: ColBERT's vectors (issue 22)
        "late_chunking": 17}  # 17: late chunking (issue 34)
    # truncate is optional (issue 19): unset (the server's --long-inputs) and false differ
    assert pb.EmbedRequest.DESCRIPTOR.fields_by_name["truncate"].has_presence
    assert pb.RerankRequest.DESCRIPTOR.fields_by_name["truncate"].has_presence
    assert numbers(pb.AttentionOptions) == {"layers": 1, "average_heads": 2, "heads": 3,
                                            "analyses": 4, "weights": 5}  # 4, 5: analyses in the server (issue 23)
    assert pb.AttentionOptions.DESCRIPTOR.fields_by_name["weights"].has_presence  # unset: true
    assert numbers(pb.Embedding) == {
        "sentence_embedding": 1, "token_embeddings": 2, "attentions": 3, "tokens": 4, "num_tokens": 5,
        "truncated": 6, "pair_start": 7,  # 7: added with sentence pairs
        "sparse_embedding": 8,  # 8: SPLADE (issue 22)
        "multi_vector": 9,  # 9: ColBERT (issue 22)
        "analyses": 10,  # 10: attention analyses (issue 23)
        "windows": 11, "chunks": 12,  # 11, 12: long inputs' windows, late chunks (issue 34)
        "patches": 13,  # 13: where an image's positions lie (issue 36)
        "reach": 14}  # 14: which keys each layer's masks leave a query (issue 47: causal masks drawn as such)
    assert numbers(pb.LayerReach) == {"behind": 1, "ahead": 2}
    assert all(f.has_presence for f in pb.LayerReach.DESCRIPTOR.fields)  # unset: no bound, apart from 0
    assert numbers(pb.Input) == {"text": 1, "token_ids": 2, "pair": 3, "image": 4}  # 4: an image-text model's image
    assert numbers(pb.Image) == {"data": 1, "url": 2, "mime_type": 3}


THEIRS = {d.full_name: d for module in (triton_service, triton_config)
          for d in [*module.DESCRIPTOR.message_types_by_name.values(), *module.DESCRIPTOR.enum_types_by_name.values()]}


def _messages(descriptor: Descriptor):
    yield descriptor
    for nested in descriptor.nested_types:
        yield from _messages(nested)


def _theirs(full_name: str):
    top, _, rest = full_name.removeprefix("inference.").partition(".")
    found = THEIRS[f"inference.{top}"]
    for part in filter(None, rest.split(".")):
        found = found.nested_types_by_name.get(part) or found.enum_types_by_name[part]
    return found


MESSAGES = [m for f in (grpc_service_pb2.DESCRIPTOR, model_config_pb2.DESCRIPTOR)
            for top in f.message_types_by_name.values() for m in _messages(top)]


@pytest.mark.parametrize("ours", MESSAGES, ids=[m.full_name for m in MESSAGES])
def test_every_kserve_field_is_tritons(ours: Descriptor):
    theirs = _theirs(ours.full_name)
    for field in ours.fields:
        other = theirs.fields_by_number.get(field.number)
        assert other is not None, f"{ours.full_name}.{field.name} = {field.number}: Triton has no such field"
        assert (field.name, field.type, field.is_repeated) == (other.name, other.type, other.is_repeated), field.name
        for kind in ("message_type", "enum_type", "containing_oneof"):
            mine, its = getattr(field, kind), getattr(other, kind)
            assert (mine and (mine.name if kind == "containing_oneof" else mine.full_name)) == (
                its and (its.name if kind == "containing_oneof" else its.full_name)), (field.name, kind)


def test_every_kserve_enum_value_and_method_is_tritons():
    for enum in model_config_pb2.DESCRIPTOR.enum_types_by_name.values():
        assert {v.name: v.number for v in enum.values} == {v.name: v.number for v in _theirs(enum.full_name).values}
    ours = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    theirs = triton_service.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert ours.full_name == theirs.full_name == "inference.GRPCInferenceService"
    for method in ours.methods:
        other = theirs.methods_by_name[method.name]
        assert (method.input_type.full_name, method.output_type.full_name) == (
            other.input_type.full_name, other.output_type.full_name)
    assert {m.name for m in ours.methods} == {"ServerLive", "ServerReady", "ModelReady", "ServerMetadata",
                                             "ModelMetadata", "ModelInfer", "ModelConfig", "ModelStatistics",
                                             "RepositoryIndex"}
