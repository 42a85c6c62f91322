"""Where loopd keeps its state by default (shared by every command)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def default_data_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$LOOPD_DATA_DIR``, else ``$XDG_DATA_HOME/loopd``, else ``~/.local/share/loopd``."""
    source = os.environ if env is None else env
    if source.get("LOOPD_DATA_DIR"):
        return Path(source["LOOPD_DATA_DIR"]).expanduser()
    base = source.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base).expanduser() / "loopd"
