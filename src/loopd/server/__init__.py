"""loop-server: conversations, messages, Task delivery, Harness Engine, Human Ask/Confirm, registry, ledger.

Public face (what the CLI and embedders use): `open_loop_server` (everything of `loopd up` but its operators, i.e.
`loopd server`, running for an ``async with`` block) with its `UpSettings` and the `RunningServer` it yields;
`check_exposure` and its `ExposureRefused`, `WorkspaceLocationError`, `default_workspaces`; `DEFAULT_PORT`;
`resolve_kube_api` (where Tasks live), `resolve_namespace` (in which namespace) and `ServerSetupError` (settings the
server refuses). The ``server.json`` a running server records is read and written by ``loopd._paths`` (clients read it
without importing the server). The configuration file is ``loopd.server.config``. The subpackages are the server's
parts, layered bottom to top (checked by import-linter): ``storage``; ``streams`` | ``ledger`` | ``http``; ``chat`` |
``engine`` | ``registry`` | ``webui`` | ``config``; ``human``; ``responder`` | ``audit``; ``app``; the composition
root (``_composition``).

Must not import: loopd.operators, loopd.runtime, loopd.cli.
"""

from loopd.server._composition import (
    DEFAULT_PORT,
    ExposureRefused,
    KubeApiMode,
    RunningServer,
    UpSettings,
    WorkspaceLocationError,
    check_exposure,
    default_workspaces,
    open_loop_server,
    resolve_kube_api,
    resolve_namespace,
)
from loopd.server._errors import ServerSetupError

__all__ = [
    "DEFAULT_PORT",
    "ExposureRefused",
    "KubeApiMode",
    "RunningServer",
    "ServerSetupError",
    "UpSettings",
    "WorkspaceLocationError",
    "check_exposure",
    "default_workspaces",
    "open_loop_server",
    "resolve_kube_api",
    "resolve_namespace",
]
