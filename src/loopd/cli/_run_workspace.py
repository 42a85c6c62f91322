"""`loopd run`'s workspace commands: ``/undo`` (put the workspace back to before the last turn) and ``/diff``.

Both work on the session's workspace snapshots (`loopd.harness.snapshots`), taken at every turn's start and end
unless ``loopd run --snapshots off``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from loopd.harness import HarnessError

if TYPE_CHECKING:
    from loopd.cli._run_view import RunView
    from loopd.harness import Session

WORKSPACE_COMMANDS: Final = frozenset({"/undo", "/diff"})


async def workspace_command(session: Session, view: RunView, command: str) -> None:
    """Run ``/undo`` or ``/diff``; what goes wrong is one line (nothing to undo, a turn running, snapshots off)."""
    if not session.workspace.enabled:
        view.warning("workspace snapshots are off (loopd run --snapshots off): nothing to undo or compare")
        return
    try:
        if command == "/undo":
            ref = await session.workspace.undo()
            view.note(f"the workspace is back to before the last turn (snapshot {ref[:12]}); /undo again goes further")
        else:
            diff = await session.workspace.diff()
            if diff:
                view.text(diff if diff.endswith("\n") else diff + "\n")
            else:
                view.note("no changes since the snapshot before the last turn")
    except HarnessError as exc:
        view.warning(str(exc))
