"""Where loopd keeps its state by default (shared by every command).

The private-file helpers live in the floor (``loopd._infra.files``) and are re-exported here for the commands.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from loopd._infra.files import PRIVATE_DIR_MODE, PRIVATE_FILE_MODE, ensure_private_dir, ensure_private_file

__all__ = [
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "default_data_dir",
    "ensure_private_dir",
    "ensure_private_file",
]


def default_data_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$LOOPD_DATA_DIR``, else ``$XDG_DATA_HOME/loopd``, else ``~/.local/share/loopd``."""
    source = os.environ if env is None else env
    if source.get("LOOPD_DATA_DIR"):
        return Path(source["LOOPD_DATA_DIR"]).expanduser()
    base = source.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base).expanduser() / "loopd"
