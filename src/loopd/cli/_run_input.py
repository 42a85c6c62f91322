"""Lines from the terminal (or a pipe, or a file) for `loopd run`, read without blocking the event loop.

The terminal stays in its ordinary line mode: the tty driver does the editing, echo and Ctrl-C / Ctrl-D, and this
module never changes a terminal setting, so nothing can be left behind in a bad state. A read waits for the
descriptor to become readable (`loop.add_reader`) and only then reads; descriptors that cannot be polled (regular
files, ``/dev/null``) never block, so they are read directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import termios
from typing import Final

from loopd._infra.errors import LoopdError

_READ_SIZE: Final = 64 * 1024
_MAX_LINE: Final = 1024 * 1024


class InputInterrupted(LoopdError):
    """A pending read was interrupted (Ctrl-C): whatever was typed so far is discarded."""


class LineInput:
    """Reads lines from ``fd``; ``interactive`` when it is a terminal a person types into."""

    def __init__(self, fd: int, *, interactive: bool) -> None:
        self._fd = fd
        self.interactive = interactive
        self._buffer = bytearray()
        self._eof = False
        self._waiter: asyncio.Future[None] | None = None

    @classmethod
    def for_stdin(cls) -> LineInput:
        fd = 0
        try:
            interactive = os.isatty(fd)
        except OSError:
            interactive = False
        return cls(fd, interactive=interactive)

    async def readline(self) -> str | None:
        """The next line without its line break; None at end of input (Ctrl-D on an empty terminal line).

        A terminal's end of input is not final: the next call reads again. Raises `InputInterrupted` when
        `interrupt` is called while waiting.
        """
        while True:
            newline = self._buffer.find(b"\n")
            if newline >= 0:
                line = bytes(self._buffer[:newline])
                del self._buffer[: newline + 1]
                return _decode(line)
            if self._eof:
                return self._take_rest()
            if len(self._buffer) > _MAX_LINE:
                return self._take_rest()  # an endless line is cut rather than held in memory
            await self._wait_readable()
            try:
                chunk = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""  # a closed or unusable descriptor is the end of input
            if chunk:
                self._buffer += chunk
            elif self.interactive:
                return self._take_rest()
            else:
                self._eof = True

    def interrupt(self) -> None:
        """Wake a pending `readline` with `InputInterrupted` and drop buffered input."""
        self._buffer.clear()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(InputInterrupted())

    def discard_pending(self) -> None:
        """Drop input typed ahead (before a permission question, so a stray Enter cannot answer it)."""
        self._buffer.clear()
        if self.interactive:
            with contextlib.suppress(termios.error, OSError):
                termios.tcflush(self._fd, termios.TCIFLUSH)

    def _take_rest(self) -> str | None:
        if not self._buffer:
            return None
        rest = bytes(self._buffer)
        self._buffer.clear()
        return _decode(rest)

    async def _wait_readable(self) -> None:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()

        def ready() -> None:
            if not waiter.done():
                waiter.set_result(None)

        try:
            loop.add_reader(self._fd, ready)
        except (PermissionError, ValueError, OSError):
            return  # not pollable (a regular file, /dev/null) or closed: a read does not block
        self._waiter = waiter
        try:
            await waiter
        finally:
            self._waiter = None
            loop.remove_reader(self._fd)


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace").rstrip("\r")
