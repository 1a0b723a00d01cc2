"""The declared contracts, held at run time by every implementation: what the core needs of a served model
(server/contract.py) by the in-process models and by a front-door worker's of `serve --workers N`
(server/workers/front.py) over the same artifacts; the session interface (engine/session.py Session) by
onnxruntime's sessions and OpenVINO's. mypy checks the same statically (.ci/typecheck); this holds the members and
their signatures where mypy does not run, and the core to the contract alone."""

from __future__ import annotations

import asyncio
import inspect

import numpy as np
import pytest

from attnserve.config import ServerConfig
from attnserve.engine.openvino_session import OpenVINOPort, OpenVINOSession
from attnserve.engine.session import CPU, GraphPort, Session, open_graph, open_session
from attnserve.server import contract, core
from attnserve.server.metrics import Metrics
from attnserve.server.models import ModelInfo, Models, ServedModel
from attnserve.server.workers.front import EngineLink, RemoteModels
from attnserve.server.workers.supervisor import model_table


def members(protocol: type) -> dict[str, object]:
    """A Protocol's members as declared: its methods and properties."""
    return {name: value for name, value in vars(protocol).items() if not name.startswith("_")}


def check(implementation: object, protocol: type) -> None:
    """Every member of the protocol on the implementation; each method with the protocol's parameters (names,
    defaults, async or not: what a caller of the protocol may rely on), and any more only with defaults
    (onnxruntime's run_options)."""
    assert isinstance(implementation, protocol), f"{type(implementation).__name__} is no {protocol.__name__}"
    for name, declared in members(protocol).items():
        held = getattr(implementation, name)
        if not inspect.isfunction(declared):
            continue
        where = f"{type(implementation).__name__}.{name}"
        assert inspect.iscoroutinefunction(held) == inspect.iscoroutinefunction(declared), where
        wanted = list(inspect.signature(declared).parameters.values())[1:]  # without self
        given = list(inspect.signature(held).parameters.values())
        assert len(given) >= len(wanted), f"{where}{inspect.signature(held)}: the contract has {wanted}"
        more = given[len(wanted):]
        assert all(p.default is not inspect.Parameter.empty for p in more), f"{where}: {more} without defaults"
        for want, got in zip(wanted, given[:len(wanted)], strict=True):
            if want.kind != inspect.Parameter.POSITIONAL_ONLY:  # a positional-only one may be named otherwise
                assert got.name == want.name, f"{where}: {got.name} for the contract's {want.name}"
            assert got.default == want.default, f"{where}: {got.name}={got.default!r}, the contract's {want.default!r}"


def check_models(models: object) -> None:
    check(models, contract.ModelsContract)
    assert isinstance(models, contract.ModelsContract)
    for model in models.all:
        check(model, contract.ModelContract)
        engine, batcher = model.for_task(None)
        assert engine is model.engine and batcher is model.batcher
        check(engine, contract.EngineContract)
        check(batcher, contract.BatcherContract)
        check(model.metrics, contract.MetricsContract)
        check(model.metrics.statistics, contract.StatisticsContract)


@pytest.fixture
def both(engine):
    """(the models in this process, a front-door worker's over their table), as supervisor.py and worker.py build
    them; the worker's link is never connected (nothing here is sent)."""
    local = Models([ServedModel("minilm", ("alias",), engine, ServerConfig(), Metrics())])
    link = EngineLink("ipc:///nonexistent/attnserve-engine.sock", lambda: None)
    try:
        yield local, RemoteModels(model_table(local), link)
    finally:
        asyncio.run(link.close())
        for model in local.all:
            model.inference.shutdown(wait=True)


def test_both_implementations_hold_the_contract(both):
    local, remote = both
    check_models(local)
    check_models(remote)
    assert remote.names == local.names == ["minilm", "alias"]
    assert remote.get("alias").info == local.get("alias").info and remote.default.pooling == local.default.pooling


def test_the_core_names_the_contract_alone():
    """The core reads models through the contract (mypy then checks both implementations for what it reads): it
    imports no implementation's class."""
    implementations = {"attnserve.server.models", "attnserve.server.batcher", "attnserve.engine.engine",
                       "attnserve.server.workers.front", "attnserve.server.metrics", "attnserve.server.statistics"}
    leaked = [name for name, value in vars(core).items()
              if inspect.isclass(value) and value.__module__ in implementations and value is not ModelInfo]
    assert not leaked, f"server/core.py imports {leaked}: type it against server/contract.py"


def test_every_session_holds_the_session_interface(engine):
    """onnxruntime's session, the arena-per-run one over it (export's verification), and the engine's graph as
    opened for its backend (OpenVINO's where ATTNSERVE_TEST_GRAPH runs one: conftest.py)."""
    variant = engine.embeddings_variant
    path = engine.manifest.path(variant.file)
    plain = open_session(path, CPU)
    sessions = [plain, open_session(path, CPU, arena="per_run"),
                open_graph(path, variant.backend, variant.precision, engine.provider)]
    feed = {"input_ids": np.array([[101, 7592, 102]], np.int64), "attention_mask": np.ones((1, 3), np.int64)}
    if "token_type_ids" in {i.name for i in plain.get_inputs()}:
        feed["token_type_ids"] = np.zeros((1, 3), np.int64)
    want = plain.run(["sentence_embedding"], feed)[0]
    for session in sessions:
        check(session, Session)
        assert all(isinstance(port, GraphPort) for port in [*session.get_inputs(), *session.get_outputs()])
        assert [i.name for i in session.get_inputs()] == [i.name for i in plain.get_inputs()]
        assert len(session.get_outputs()) == len(plain.get_outputs())
        got = session.run(["sentence_embedding"], feed)[0]
        assert got.shape == want.shape
        assert float(got[0] @ want[0]) / float(np.linalg.norm(got) * np.linalg.norm(want)) > 0.999  # bf16's too


def test_openvino_session_declares_the_interface():
    """Without OpenVINO installed: the class has every member of Session, with its parameters (run's are
    positional), and its ports are GraphPorts."""
    for name, declared in members(Session).items():
        held = getattr(OpenVINOSession, name)
        wanted = list(inspect.signature(declared).parameters)
        assert len(inspect.signature(held).parameters) == len(wanted), name
    assert isinstance(OpenVINOPort("input_ids"), GraphPort)
