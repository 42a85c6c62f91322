"""The engine's and the responder's public faces: the names the composition root wires."""

from __future__ import annotations

import loopd.server.engine as engine
import loopd.server.responder as responder


def test_the_engine_exports_what_the_server_wires() -> None:
    for name in (
        "HarnessEngine",
        "CallRequest",
        "BuiltinHarnessAdapter",
        "RemoteHarnessAdapter",
        "OpenAIModelAdapter",
        "HarnessAdapter",
        "AdapterRun",
        "engine_router",
        "CapacityExceeded",
        "UnknownTarget",
        "GateForbidden",
    ):
        assert name in engine.__all__ and hasattr(engine, name)
    assert sorted(engine.__all__) == sorted(set(engine.__all__))
    assert all(not name.startswith("_") for name in engine.__all__)


def test_the_responder_exports_its_reconciler_and_port() -> None:
    assert {"HarnessResponder", "ChatPort"} <= set(responder.__all__)
    assert all(hasattr(responder, name) for name in responder.__all__)


def test_engine_errors_carry_their_api_type() -> None:
    assert (engine.CapacityExceeded.type, engine.CapacityExceeded.retryable) == ("too_many_requests", True)
    assert engine.UnknownTarget.type == "invalid_request"
    assert engine.GateForbidden.type == "forbidden"
    assert engine.EngineClosed.type == "service_unavailable"
