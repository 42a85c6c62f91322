"""`loopd run`'s session settings: ``/mode [NAME]``, ``/model [NAME]`` and ``/loop [NAME]``.

Without a name each shows the current setting and the choices; with one it changes the setting for the rest of
the session (journaled: a resumed session keeps it). A mode or model change applies from the loop's next step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from loopd.harness import HarnessError

if TYPE_CHECKING:
    from loopd.cli._run_view import RunView
    from loopd.harness import Session

SETTING_COMMANDS: Final = frozenset({"/mode", "/model", "/loop"})


def is_setting_command(text: str) -> bool:
    """Whether a line typed at the prompt is one of the setting commands (with or without an argument)."""
    return text.split(maxsplit=1)[0] in SETTING_COMMANDS if text.startswith("/") else False


async def setting_command(session: Session, view: RunView, text: str) -> None:
    """Show or change a setting; what goes wrong (an unknown mode, model or loop) is one line."""
    command, _, argument = text.partition(" ")
    name = argument.strip()
    loop = session.default_loop
    actor = session.actors[loop]
    config = actor.config
    try:
        if command == "/mode":
            if not name:
                current = config.mode_of(actor.state)
                choices = ", ".join(config.modes) or "none"
                view.note(f"loop {loop}: mode {current or '(none)'} · modes: {choices} · /mode NAME switches")
                return
            await session.set_loop_mode(name)
            view.note(f"loop {loop}: mode {name} from its next step")
        elif command == "/model":
            if not name:
                allowed = f" · allowed: {', '.join(config.models)}" if config.models else ""
                view.note(f"loop {loop}: model {config.model_of(actor.state)}{allowed} · /model NAME switches")
                return
            await session.change_loop_inference(name)
            view.note(f"loop {loop}: model {name} from its next model call")
        else:
            if not name:
                view.note(f"active loop: {loop} · loops: {', '.join(session.loops)} · /loop NAME switches")
                return
            await session.set_active_loop(name)
            view.note(f"active loop: {name} (your messages go there)")
    except HarnessError as exc:
        view.warning(str(exc))
