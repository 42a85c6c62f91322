"""The one exception tree: every exception class of loopd is a `LoopdError`, and the cross-layer markers hold."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import loopd
from loopd._infra import errors as errors_module
from loopd._infra.errors import ConflictError, LoopdError, NotFoundError, UnavailableError
from loopd._infra.locking import DataDirBusyError
from loopd.agentue import AgentUEError
from loopd.harness import HarnessError, JournalCorruptError, ModelPermanentError, ModelRetryableError
from loopd.harness import SessionNotFoundError as HarnessSessionNotFound
from loopd.harness.core.codec import CodecError
from loopd.harness.models import PriceTableError
from loopd.resources import AlreadyExists, ResourceError, StoreUnavailable
from loopd.resources import Conflict as ResourceConflict
from loopd.resources import NotFound as ResourceNotFound
from loopd.resources.client import TransportError
from loopd.resources.reconcile import PermanentError, TemporaryError
from loopd.server._errors import LoopServerError, ServerSetupError
from loopd.server.engine import (
    AdapterError,
    CapacityExceeded,
    EngineClosed,
    GateForbidden,
    HarnessEngineError,
    UnknownTarget,
)
from loopd.server.ledger import LaneConflict
from loopd.server.storage import CommitOutcomeUnknown, StorageError, StorageUnavailable
from loopd.server.storage import Conflict as StorageConflict
from loopd.server.storage import NotFound as StorageNotFound

ROOT = Path(__file__).resolve().parents[2]


def _exception_classes() -> list[type[BaseException]]:
    found: list[type[BaseException]] = []
    for info in pkgutil.walk_packages(loopd.__path__, "loopd."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.__name__:
                found.append(value)
    return found


def test_every_exception_class_of_loopd_is_a_loopd_error() -> None:
    classes = _exception_classes()
    assert len(classes) > 60  # the walk really found the tree
    strays = sorted(f"{c.__module__}.{c.__qualname__}" for c in classes if not issubclass(c, LoopdError))
    assert strays == []


@pytest.mark.parametrize(
    ("layer_root", "members"),
    [
        (AgentUEError, ()),
        (HarnessError, (JournalCorruptError, CodecError, PriceTableError, ModelRetryableError)),
        (ResourceError, (ResourceNotFound, TransportError)),
        (LoopServerError, (StorageError, HarnessEngineError, AdapterError, ServerSetupError, LaneConflict)),
    ],
)
def test_each_layer_has_one_subtree_under_the_root(
    layer_root: type[LoopdError], members: tuple[type[LoopdError], ...]
) -> None:
    assert issubclass(layer_root, LoopdError)
    for member in members:
        assert issubclass(member, layer_root)


def test_engine_errors_are_server_errors_not_storage_errors() -> None:
    for cls in (HarnessEngineError, CapacityExceeded, UnknownTarget, GateForbidden, EngineClosed):
        assert issubclass(cls, LoopServerError)
        assert not issubclass(cls, StorageError)
    # what the API answers is unchanged: the type and the retry flag
    assert (CapacityExceeded.type, CapacityExceeded.retryable) == ("too_many_requests", True)
    assert (EngineClosed.type, EngineClosed.retryable) == ("service_unavailable", True)


def test_the_two_not_found_and_conflict_families_share_markers() -> None:
    assert issubclass(StorageNotFound, NotFoundError) and issubclass(ResourceNotFound, NotFoundError)
    assert issubclass(HarnessSessionNotFound, NotFoundError)
    for cls in (StorageConflict, LaneConflict, ResourceConflict, AlreadyExists):
        assert issubclass(cls, ConflictError)
    assert not issubclass(StorageNotFound, ResourceError)
    assert not issubclass(ResourceNotFound, StorageError)


def test_the_resource_api_status_body_is_unchanged() -> None:
    assert ResourceNotFound('tasks.loopd.dev "x" not found').to_status() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'tasks.loopd.dev "x" not found',
        "reason": "NotFound",
        "code": 404,
    }


def test_retryable_is_the_one_retry_flag() -> None:
    for cls in (StorageUnavailable, StoreUnavailable, TransportError, ModelRetryableError, EngineClosed):
        assert issubclass(cls, UnavailableError)
        assert cls.retryable
    assert TemporaryError.retryable
    for permanent in (CommitOutcomeUnknown, StorageNotFound, ModelPermanentError, PermanentError, LoopdError):
        assert not permanent.retryable
    assert ResourceConflict.retryable and not StorageConflict.retryable  # each layer keeps its own policy


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (AgentUEError, ValueError),
        (CodecError, ValueError),
        (PriceTableError, ValueError),
        (ServerSetupError, ValueError),
        (DataDirBusyError, RuntimeError),
    ],
)
def test_builtin_bases_that_callers_catch_are_kept(cls: type[LoopdError], builtin: type[Exception]) -> None:
    assert issubclass(cls, builtin) and issubclass(cls, LoopdError)


def _tree(text: str) -> list[str]:
    """The lines of the first indented block that starts with ``LoopdError``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"\s+LoopdError\b", line))
    indent = len(lines[start]) - len(lines[start].lstrip())
    block = []
    for line in lines[start:]:
        if not line.strip() or len(line) - len(line.lstrip()) < indent:
            break
        block.append(line[indent:].rstrip())
    return block


def test_architecture_doc_draws_the_same_tree_as_the_docstring() -> None:
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    assert errors_module.__doc__ is not None
    assert _tree(doc) == _tree(errors_module.__doc__)
