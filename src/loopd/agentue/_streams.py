"""Named streams: one `StreamState` per `stream_id`, routed before anything else. Pure.

Each stream has its own model, seq and block ids; `start`, `error` and `end` are scoped to their own stream and
there is no order across streams. Omitted and empty `stream_id` both address the unnamed stream (keyed "").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NoReturn

from loopd.agentue._errors import AgentUEValidationError
from loopd.agentue._events import Event
from loopd.agentue._model import Model
from loopd.agentue._reducer import StreamState, _stream_key, reduce


class Streams(Mapping[str, StreamState]):
    """An immutable map `stream_id -> StreamState`; `apply` returns a new container."""

    __slots__ = ("_states",)
    _states: dict[str, StreamState]

    def __init__(self, states: Mapping[str, StreamState] | None = None) -> None:
        checked = dict(states or {})
        for key, state in checked.items():
            if state.stream_id != key:
                raise AgentUEValidationError(
                    "streams", f"the state of stream {state.stream_id!r} is filed under {key!r}"
                )
        object.__setattr__(self, "_states", checked)

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError("Streams is immutable")

    def __getitem__(self, stream_id: str) -> StreamState:
        return self._states[stream_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._states)

    def __len__(self) -> int:
        return len(self._states)

    def state(self, stream_id: str | None = None) -> StreamState:
        """The state of a stream; an unknown stream is an empty, not-started state."""
        key = stream_id or ""
        return self._states.get(key) or StreamState(stream_id=key)

    def model(self, stream_id: str | None = None) -> Model | None:
        return self.state(stream_id).model

    def apply(self, event: Event | Mapping[str, Any]) -> Streams:
        """Route `event` to its stream and reduce it there (raises `AgentUERejectedError`; self is unchanged)."""
        key = _stream_key(event)
        before = self.state(key)
        after = reduce(before, event)
        if after is before:
            return self
        states = dict(self._states)
        states[key] = after
        return Streams(states)

    def __repr__(self) -> str:
        return f"Streams({self._states!r})"


def fold_streams(events: Iterable[Event | Mapping[str, Any]], initial: Streams | None = None) -> Streams:
    """Apply `events` in order to a (by default empty) `Streams`."""
    streams = initial if initial is not None else Streams()
    for event in events:
        streams = streams.apply(event)
    return streams
