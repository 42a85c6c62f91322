"""Per-session workspaces (`loopd harness serve --session-workspaces`): each session works in its own directory.

A session started here works in ``<root>/<session id>`` (created 0700). A fork works in:

- ``keep``: its parent's directory, as it is now (nothing restored; the two share it);
- ``new``: ``<root>/<fork id>``, a new directory filled with the parent's snapshot at the fork point;
- ``overwrite``: its parent's directory, put back to that snapshot (the request is the confirmation).

Where a stored session works is read from the journal, so a dormant session (or one of an earlier run of the
server) is restored in the same place: a fork's own first records hold a `WorkspaceForked` naming its directory
(``new`` / ``overwrite``); without one (``keep``) it works where its parent does; a session that is no fork works
in ``<root>/<its id>``.

Who can name a directory: only session ids do, and an id names one only when it is a single plain path segment
(letters, digits, ``.``, ``_``, ``-``, starting with a letter or digit; no ``..``); the directory must resolve inside
``root`` without a symlink on the way, and never be (or hold, or lie inside) a hidden directory such as the data
directory. Anything else is refused (`WorkspaceLocationError`, answered 400) before a file is touched.

Must not do: HTTP; decide what a fork restores (`Rig.fork_session` does).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from loopd.harness._errors import SessionNotFoundError
from loopd.harness.actors import Rig
from loopd.harness.core import codec
from loopd.harness.core.events import WorkspaceForked
from loopd.harness.core.workspace import ForkWorkspace
from loopd.harness.journal import Journal
from loopd.harness.standard import WorkspaceLocationError, check_workspace_location

MAX_FORK_DEPTH: Final = 256
"""How many ancestors a ``keep`` fork's directory is looked up through (forks of forks of …)."""
_FIRST_RECORDS: Final = 4


class SessionWorkspaces:
    """Maps sessions to directories under ``root`` and gives the rig of each (``rebind(base, directory)``)."""

    def __init__(self, root: Path, rebind: Callable[[Rig, Path], Rig], *, hidden: Sequence[Path] = ()) -> None:
        self.root = root.expanduser().resolve()
        self._rebind = rebind
        self._hidden = tuple(path.expanduser().resolve() for path in hidden)
        for path in self._hidden:
            if self.root.is_relative_to(path):
                raise WorkspaceLocationError(f"the session workspaces root {self.root} is inside {path}")

    # --- directories -----------------------------------------------------------------------------------------

    def check_name(self, session_id: str) -> str:
        """``session_id`` when it can name a directory (one plain segment); `WorkspaceLocationError` otherwise."""
        if "/" in session_id or "\\" in session_id:
            raise WorkspaceLocationError(f"session id {session_id!r} cannot name a workspace: no slashes")
        try:
            return check_workspace_location(session_id)
        except WorkspaceLocationError as exc:
            raise WorkspaceLocationError(f"session id {session_id!r} cannot name a workspace directory: {exc}") from exc

    def path_of(self, session_id: str) -> Path:
        """``<root>/<session_id>`` (not created; the name checked)."""
        return self.root / self.check_name(session_id)

    def _checked(self, path: Path) -> Path:
        """``path`` resolved, when it is a directory strictly inside ``root`` reached through no symlink and apart
        from every hidden directory (blocking: run it off the event loop)."""
        if not path.is_relative_to(self.root):
            raise WorkspaceLocationError(f"{path} is outside the session workspaces root {self.root}")
        current = self.root
        for part in path.relative_to(self.root).parts:
            current = current / part
            if current.is_symlink():
                raise WorkspaceLocationError(f"{path} resolves outside {self.root}: {current} is a symlink")
        resolved = path.resolve()
        if not resolved.is_relative_to(self.root) or resolved == self.root:
            raise WorkspaceLocationError(f"{path} resolves outside the session workspaces root {self.root}")
        for hidden in self._hidden:
            if resolved.is_relative_to(hidden) or hidden.is_relative_to(resolved):
                raise WorkspaceLocationError(f"{path} would expose {hidden} to a session's tools")
        return resolved

    def _ensure(self, path: Path) -> tuple[Path, bool]:
        """Create ``path`` (0700) when missing and check it; (the directory, whether it was created here)."""
        checked = self._checked(path)  # before creating anything (a symlink must not be followed)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            checked.mkdir(mode=0o700)
            created = True
        except FileExistsError:
            created = False
        return self._checked(path), created

    async def _directory(self, path: Path) -> tuple[Path, bool]:
        return await asyncio.to_thread(self._ensure, path)

    async def directory_of(self, journal: Journal, session_id: str) -> Path:
        """Where stored session ``session_id`` works (see the module docstring), not created."""
        sid = session_id
        for _ in range(MAX_FORK_DEPTH):
            info = await journal.session(sid)
            if info is None:
                raise SessionNotFoundError(sid)
            if info.parent_id is None:
                return self.path_of(sid)
            for record in await journal.read(sid, info.parent_seq + 1, _FIRST_RECORDS):
                if record.kind == "workspace_forked":
                    event = codec.decode(record.kind, record.version, record.data)
                    assert isinstance(event, WorkspaceForked)
                    return Path(event.directory)
            sid = info.parent_id
        raise WorkspaceLocationError(f"session {session_id} is a fork more than {MAX_FORK_DEPTH} levels deep")

    # --- rigs ------------------------------------------------------------------------------------------------

    async def for_new(self, base: Rig, session_id: str) -> Rig:
        """The rig of a new session: on ``<root>/<session_id>`` (created)."""
        directory, _created = await self._directory(self.path_of(session_id))
        return self._rebind(base, directory)

    async def for_stored(self, base: Rig, session_id: str) -> Rig:
        """The rig of a stored session, on the directory its journal says (created when missing)."""
        directory, _created = await self._directory(await self.directory_of(base.journal, session_id))
        return self._rebind(base, directory)

    async def for_fork(
        self, base: Rig, parent_id: str, fork_id: str, mode: ForkWorkspace
    ) -> tuple[Rig, Callable[[], None]]:
        """The rig a fork is made with, and an undo for a directory created here for it (call it when the fork
        is refused: nothing is left behind)."""
        path = self.path_of(fork_id) if mode == "new" else await self.directory_of(base.journal, parent_id)
        directory, created = await self._directory(path)

        def undo() -> None:
            if created:
                with contextlib.suppress(OSError):  # not empty (something wrote there): keep it
                    directory.rmdir()

        return self._rebind(base, directory), undo
