"""The floor's file helpers (``loopd._infra.files``): private modes and atomic replacement."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from loopd._infra.files import ensure_private_dir, ensure_private_file, write_atomically


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_private_directories_and_files(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)
    ensure_private_dir(loose / "a" / "b")
    assert (mode(loose), mode(loose / "a"), mode(loose / "a" / "b")) == (0o755, 0o700, 0o700)
    ensure_private_dir(loose, tighten=False)
    assert mode(loose) == 0o755
    ensure_private_dir(loose)
    assert mode(loose) == 0o700
    db = loose / "db.sqlite"
    wal = loose / "db.sqlite-wal"
    wal.write_bytes(b"")
    os.chmod(wal, 0o644)
    ensure_private_file(db)
    assert (mode(db), mode(wal), db.read_bytes()) == (0o600, 0o600, b"")


def test_write_atomically_replaces_all_or_nothing(tmp_path: Path) -> None:
    target = tmp_path / "rules.json"
    write_atomically(target, b"one")
    write_atomically(target, b"two")
    assert target.read_bytes() == b"two"
    assert mode(target) == 0o600
    with pytest.raises(OSError):
        write_atomically(tmp_path / "missing" / "rules.json", b"three")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rules.json"]  # no temporary file left behind
