"""Where loopd keeps its state by default (shared by every command), and ``server.json``: what a running `loopd up`
records in its data directory so that clients on this machine (`loopd chat`, the operators, loop-runtime) find its
URL and its admin token file — readable without importing the server.

The private-file helpers live in the floor (``loopd._infra.files``) and are re-exported here for the commands.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from loopd._infra.files import PRIVATE_DIR_MODE, PRIVATE_FILE_MODE, ensure_private_dir, ensure_private_file

__all__ = [
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "SERVER_FILE",
    "default_data_dir",
    "ensure_private_dir",
    "ensure_private_file",
    "read_server_file",
    "write_server_file",
]

SERVER_FILE: Final = "server.json"


def default_data_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$LOOPD_DATA_DIR``, else ``$XDG_DATA_HOME/loopd``, else ``~/.local/share/loopd``."""
    source = os.environ if env is None else env
    if source.get("LOOPD_DATA_DIR"):
        return Path(source["LOOPD_DATA_DIR"]).expanduser()
    base = source.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base).expanduser() / "loopd"


def read_server_file(data_dir: Path) -> dict[str, Any] | None:
    """What a running `loopd up` recorded about itself in ``data_dir`` (None when nothing readable is recorded)."""
    try:
        data = json.loads((data_dir / SERVER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_server_file(data_dir: Path, info: Mapping[str, Any]) -> None:
    """Record ``info`` as ``data_dir``'s ``server.json`` (replaced at once: a reader sees the old or the new)."""
    tmp = data_dir / f".{SERVER_FILE}.tmp"
    tmp.write_text(json.dumps(dict(info), indent=2) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, data_dir / SERVER_FILE)
