"""deploy/kserve/ read strictly into KServe's own typed models (its Python SDK): an unknown field, a value of the
wrong type or a required field left out fails, naming where.

The SDK pins protobuf below the 7 attnserve needs, so .ci/run runs this file in a venv with only the SDK, pytest and
pyyaml (`--noconftest`: nothing of attnserve imported), and the suite's own run skips it.
"""

from __future__ import annotations

import re

import pytest

from tests.kserve_files import of_kind, resources, without_kserve

kserve = pytest.importorskip("kserve", reason="KServe's SDK conflicts with attnserve's protobuf; .ci/run runs this "
                                              "file in a venv of its own")
k8s_models = pytest.importorskip("kubernetes.client")

# The SDK's names of JSON's types; "object" is anything (a Kubernetes IntOrString, a raw extension).
PRIMITIVES = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "object": (object,),
              "datetime": (str,), "date": (str,)}


def strict(data, kind: str, where: str):
    """data as the SDK's type `kind` ("V1alpha1ServingRuntime", "list[V1Container]" or the Kubernetes client's
    "List[...]", "dict(str, str)" or "Dict[str, ...]", "int"...), every key checked first (the SDK's own
    ApiClient.deserialize drops unknown ones), built with the SDK's constructors (which refuse a missing field)."""
    if (inner := re.fullmatch(r"[lL]ist\[(.*)\]", kind)) is not None:
        assert isinstance(data, list), f"{where}: a list expected, got {data!r}"
        return [strict(item, inner[1], f"{where}[{i}]") for i, item in enumerate(data)]
    if (inner := re.fullmatch(r"dict\(([^,]*), (.*)\)|Dict\[([^,]*), (.*)\]", kind)) is not None:
        assert isinstance(data, dict), f"{where}: a map expected, got {data!r}"
        return {key: strict(value, inner[2] or inner[4], f"{where}.{key}") for key, value in data.items()}
    if kind in PRIMITIVES:
        assert isinstance(data, PRIMITIVES[kind]) and not (kind in ("int", "float") and isinstance(data, bool)), \
            f"{where}: {kind} expected, got {data!r}"
        return data
    # A type the SDK names: KServe's own, else the Kubernetes client's (V1Container, V1ObjectMeta, ...).
    klass = getattr(kserve.models, kind, None) or getattr(k8s_models, kind, None)
    assert klass is not None, f"neither kserve.models nor kubernetes.client has {kind}"
    assert isinstance(data, dict), f"{where}: a {kind} object expected, got {data!r}"
    fields = {json_name: attribute for attribute, json_name in klass.attribute_map.items()}
    unknown = sorted(set(data) - set(fields))
    assert not unknown, f"{where}: {kind} has no field {', '.join(unknown)}"
    values = {fields[key]: strict(value, klass.openapi_types[fields[key]], f"{where}.{key}")
              for key, value in data.items()}
    try:
        return klass(**values)
    except ValueError as e:  # the SDK's client-side validation: a required field missing, a value not allowed
        pytest.fail(f"{where}: {kind}: {e}")


def test_the_servingruntime_and_the_inferenceservices_are_kserves():
    found = resources()
    (runtime,) = of_kind(found, "ServingRuntime")
    typed_runtime = strict(without_kserve(runtime), "V1alpha1ServingRuntime", runtime["_file"])
    assert isinstance(typed_runtime.spec.containers[0], k8s_models.V1Container)
    formats = [f.name for f in typed_runtime.spec.supported_model_formats]
    assert formats == ["attnserve"]
    services = of_kind(found, "InferenceService")
    assert services
    for service in services:
        model = strict(without_kserve(service), "V1beta1InferenceService", service["_file"]).spec.predictor.model
        assert model.model_format.name in formats and model.protocol_version in typed_runtime.spec.protocol_versions


@pytest.mark.parametrize(("broken", "says"), [
    ({"protocolVersion": ["v2"]}, "has no field protocolVersion"),
    ({"containers": [{"image": "i"}]}, "name"),
    ({"containers": [{"name": "c", "ports": [{"containerPort": "8080"}]}]}, "int expected"),
    ({"supportedModelFormats": [{"name": "attnserve", "autoselect": True}]}, "autoselect"),
])
def test_a_mistyped_field_fails(broken, says):
    """The check itself: what it must refuse, on a runtime it takes."""
    runtime = {"apiVersion": "serving.kserve.io/v1alpha1", "kind": "ServingRuntime", "metadata": {"name": "x"},
               "spec": {"containers": [{"name": "kserve-container", "image": "i"}]}}
    strict(runtime, "V1alpha1ServingRuntime", "ok")
    with pytest.raises((AssertionError, pytest.fail.Exception), match=says):
        strict(runtime | {"spec": runtime["spec"] | broken}, "V1alpha1ServingRuntime", "broken")
