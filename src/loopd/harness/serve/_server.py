"""Running the API: `open_harness_server` (the floor's `open_http_server`), and `serve` for the standard rig.

Shutdown order (Ctrl-C / SIGTERM, or leaving `open_harness_server`): stop accepting connections and end the event
streams → let in-flight requests finish (up to ``graceful_timeout``) → the app's lifespan shuts every live session
down (drained, ``session_stopped`` journaled) → `serve` closes the rig (journal, model).

Refusal rule: a server bound to a non-loopback host must have a token (`check_bind`); on loopback it is optional.

Must not do: parse command lines or print (the CLI does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from loopd._infra.http import is_loopback
from loopd._infra.redaction import Redactor
from loopd._infra.serving import RunningServer, open_http_server
from loopd.harness._errors import HarnessError
from loopd.harness.serve._app import IDEMPOTENCY_FILE, create_app
from loopd.harness.serve._model_calls import MODEL_CALLS_FILE
from loopd.harness.serve._workspaces import SessionWorkspaces
from loopd.harness.standard import HarnessSettings, default_data_dir, open_standard_rig, rig_on


class InsecureBindError(HarnessError, ValueError):
    """Refused: serving a non-loopback address without a bearer token (or with an empty one)."""


def check_bind(host: str, token: str | None) -> None:
    """Raise `InsecureBindError` unless ``host`` is loopback or a non-empty ``token`` is set."""
    if token is not None and not token.strip():
        raise InsecureBindError("the token is empty; pass a real token or none")
    if token is None and not is_loopback(host):
        raise InsecureBindError(
            f"refusing to serve {host!r} without a token: anyone who can reach it could run tools in your "
            "workspace. Set --token (or LOOPD_HARNESS_TOKEN), or bind 127.0.0.1"
        )


open_harness_server: Final = open_http_server
"""`open_http_server` under the name this transport has always used; `create_app` sets the shutdown step."""


async def serve(
    settings: HarnessSettings,
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    *,
    on_ready: Callable[[RunningServer], None] | None = None,
    handle_signals: bool = True,
    session_workspaces: bool = False,
    **app_options: Any,
) -> None:
    """Serve the standard rig for ``settings`` until SIGINT/SIGTERM, then shut down gracefully.

    Raises `InsecureBindError` before binding anything when ``host`` is not loopback and there is no token.
    Idempotency keys are kept in ``<data_dir>/serve-idempotency.db`` beside the journal, the sessions' model-call
    records in ``<data_dir>/serve-model-calls.db``. ``session_workspaces``:
    each session works in its own directory under ``settings.workspace`` (`SessionWorkspaces`), never one holding
    or inside the data directory; `WorkspaceLocationError` before binding when the root is inside it.
    """
    check_bind(host, token)
    # What leaves in the model-call records: the built-in secret shapes, the token and the model's own keys.
    keys = (settings.model.api_key, settings.model.anthropic_api_key)
    literals = [token or "", *(key.get_secret_value() for key in keys if key is not None)]
    app_options.setdefault("redactor", Redactor(literals=literals))
    if session_workspaces:
        hidden = (settings.data_dir, default_data_dir(), *settings.hidden)
        app_options["workspaces"] = SessionWorkspaces(
            settings.workspace, lambda base, directory: rig_on(base, settings, directory), hidden=hidden
        )
    app_options.setdefault("model_calls_path", settings.data_dir / MODEL_CALLS_FILE)  # kept across restarts
    async with open_standard_rig(settings) as rig:
        app = create_app(rig, token=token, idempotency_path=settings.data_dir / IDEMPOTENCY_FILE, **app_options)
        async with open_harness_server(app, host=host, port=port, handle_signals=handle_signals) as running:
            if on_ready is not None:
                on_ready(running)
            await running.wait()
