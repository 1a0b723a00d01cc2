"""attnserve's KServe v2 protos (protos/attnserve/kserve/) against Triton's own, as tritonclient.grpc ships them: every
service method, message, field and enum value here exists there with the same name, number, type and cardinality,
so the two read each other's bytes. Fields Triton has and attnserve leaves out are the part attnserve never sets."""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import Descriptor, EnumDescriptor
from tritonclient.grpc import model_config_pb2 as triton_config
from tritonclient.grpc import service_pb2 as triton_service

from attnserve.kserve import grpc_service_pb2, model_config_pb2

OURS = (grpc_service_pb2.DESCRIPTOR, model_config_pb2.DESCRIPTOR)
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


MESSAGES = [m for f in OURS for top in f.message_types_by_name.values() for m in _messages(top)]


@pytest.mark.parametrize("ours", MESSAGES, ids=[m.full_name for m in MESSAGES])
def test_every_field_is_tritons(ours: Descriptor):
    theirs = _theirs(ours.full_name)
    for field in ours.fields:
        other = theirs.fields_by_number.get(field.number)
        assert other is not None, f"{ours.full_name}.{field.name} = {field.number}: Triton has no such field"
        assert (field.name, field.type, field.is_repeated) == (other.name, other.type, other.is_repeated), field.name
        if field.message_type is not None:
            assert field.message_type.full_name == other.message_type.full_name, field.name
        if field.enum_type is not None:
            assert field.enum_type.full_name == other.enum_type.full_name, field.name
        assert (field.containing_oneof and field.containing_oneof.name) == (
            other.containing_oneof and other.containing_oneof.name), field.name


def test_every_enum_value_is_tritons():
    enums: list[EnumDescriptor] = [*model_config_pb2.DESCRIPTOR.enum_types_by_name.values()]
    for enum in enums:
        theirs = _theirs(enum.full_name)
        assert {v.name: v.number for v in enum.values} == {v.name: v.number for v in theirs.values}


def test_every_method_is_tritons():
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
