"""Whether objects are freed by reference counting alone — the moment their last reference goes — rather than left
in a reference cycle for the cyclic garbage collector (which, in a busy server, means full collections that walk
every live object)."""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """The cyclic collector paused for the block (so that only reference counting frees anything), then restored."""
    with _collector(False):
        yield


@contextlib.contextmanager
def collector_on() -> Iterator[None]:
    """The cyclic collector on for the block (whatever it was before), then as it was: for tests of what turns it
    off and on."""
    with _collector(True):
        yield


@contextlib.contextmanager
def _collector(enabled: bool) -> Iterator[None]:
    was_enabled = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        yield
    finally:
        (gc.enable if was_enabled else gc.disable)()


class Watch:
    """Weak references to objects under test; `alive` lists those not freed yet."""

    def __init__(self) -> None:
        self._refs: list[tuple[str, weakref.ref[Any]]] = []

    def add(self, what: str, obj: Any) -> None:
        self._refs.append((what, weakref.ref(obj)))

    def alive(self) -> list[str]:
        return [what for what, ref in self._refs if ref() is not None]
