"""A tiny content-addressed object store for workspace snapshots.

Layout under the store's root (``<data dir>/snapshots``)::

    objects/ab/cdef…    file contents and directory trees, named by the SHA-256 of their bytes (written once)
    cache/<workspace>.json   the stat cache of one workspace: path → (size, mtime_ns, inode, digest)

A directory tree is a JSON object ``{"v": 1, "entries": [[name, type, mode, size, digest-or-target], …]}`` sorted by
name (type ``f`` file, ``x`` executable file, ``d`` directory, ``l`` symlink whose target is kept as text); the
snapshot's ref is the digest of the workspace's root tree. An unchanged directory keeps its digest, so a snapshot
after a 10-file change writes those 10 files and the trees on their paths, nothing else. A file whose
(size, mtime_ns, inode) matches the cache is not read again; an entry modified less than `_RACY_SECONDS` before
the snapshot is not cached (its next change might keep the same mtime).

Restore writes only inside the workspace: every name in a tree is one plain path component (no ``/``, ``..``,
``.`` or NUL), the directories it writes through are checked with ``lstat`` (a symlink on the way is replaced,
never followed), and files are written to a temporary name and renamed into place (a rename replaces a symlink,
it does not write through it). Excluded names (default ``.loopd``, ``.git``) are neither snapshotted nor touched.

Blocking file work runs in a worker thread (`asyncio.to_thread`) under a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import hashlib
import json
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from loopd._infra.files import ensure_private_dir
from loopd.harness._errors import HarnessError

DEFAULT_EXCLUDES: Final = frozenset({".loopd", ".git"})
_RACY_SECONDS: Final = 2.0
_CHUNK: Final = 1024 * 1024
_TIMEOUT: Final = 600.0
_DIFF_MAX_BYTES: Final = 256 * 1024

Entry = tuple[str, str, int, int, str]  # name, type, mode bits, size, digest (or symlink target)


class SnapshotError(HarnessError):
    """A snapshot cannot be taken, read or restored (a missing ref, a corrupt tree, an unsafe path)."""


@dataclass(frozen=True, slots=True)
class SnapshotResult:
    """A stored snapshot: its ``ref``, how many files it holds, and the bytes the store did not hold before."""

    ref: str
    files: int
    bytes_new: int
    objects_new: int
    hashed: int
    """Files read and hashed (the others matched the stat cache)."""


@dataclass(frozen=True, slots=True)
class Change:
    """One path that differs between two snapshots: ``added``, ``removed`` or ``modified``."""

    status: str
    path: str


def _safe_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name and "\0" not in name


class SnapshotStore:
    """The object store at ``root`` for the workspace ``workspace``."""

    def __init__(self, root: Path, workspace: Path, *, excludes: frozenset[str] = DEFAULT_EXCLUDES) -> None:
        self.root = root
        self.workspace = workspace.resolve()
        self.excludes = excludes
        self._objects = root / "objects"
        key = hashlib.sha256(str(self.workspace).encode()).hexdigest()[:24]
        self._cache_file = root / "cache" / f"{key}.json"
        self._lock = asyncio.Lock()

    # --- async face ----------------------------------------------------------------------------------------

    async def checkpoint(self) -> SnapshotResult:
        """Snapshot the workspace now."""
        async with self._lock, asyncio.timeout(_TIMEOUT):
            return await asyncio.to_thread(self.checkpoint_sync)

    async def restore(self, ref: str) -> None:
        """Put the workspace back to snapshot ``ref`` (files not in it are removed; excluded names are kept)."""
        async with self._lock, asyncio.timeout(_TIMEOUT):
            await asyncio.to_thread(self.restore_sync, ref)

    async def changes(self, old: str, new: str) -> list[Change]:
        async with asyncio.timeout(_TIMEOUT):
            return await asyncio.to_thread(self.changes_sync, old, new)

    async def diff(self, old: str, new: str) -> str:
        async with asyncio.timeout(_TIMEOUT):
            return await asyncio.to_thread(self.diff_sync, old, new)

    # --- objects -------------------------------------------------------------------------------------------

    def _object_path(self, digest: str) -> Path:
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise SnapshotError(f"not a snapshot ref: {digest!r}")
        return self._objects / digest[:2] / digest[2:]

    def has(self, digest: str) -> bool:
        return self._object_path(digest).exists()

    def _put_bytes(self, data: bytes) -> tuple[str, int]:
        """Store ``data``; (digest, bytes newly written)."""
        digest = hashlib.sha256(data).hexdigest()
        path = self._object_path(digest)
        if path.exists():
            return digest, 0
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return digest, len(data)

    def _put_file(self, path: Path) -> tuple[str, int]:
        """Hash a workspace file and store it unless the store holds it; (digest, bytes newly written, -1: held)."""
        h = hashlib.sha256()
        fd, tmp = tempfile.mkstemp(dir=self._objects, prefix=".tmp-")
        size = 0
        try:
            with os.fdopen(fd, "wb") as out, open(path, "rb") as src:
                while chunk := src.read(_CHUNK):
                    h.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
            digest = h.hexdigest()
            target = self._object_path(digest)
            if target.exists():
                os.unlink(tmp)
                return digest, -1
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, target)
            return digest, size
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def read_object(self, digest: str) -> bytes:
        try:
            return self._object_path(digest).read_bytes()
        except FileNotFoundError:
            raise SnapshotError(f"snapshot object {digest[:12]} is missing from {self.root}") from None

    def read_tree(self, digest: str) -> list[Entry]:
        """The entries of tree ``digest``, checked: every name one plain path component, known types."""
        try:
            body = json.loads(self.read_object(digest))
            entries = [tuple(e) for e in body["entries"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise SnapshotError(f"snapshot tree {digest[:12]} is corrupt: {exc}") from exc
        checked: list[Entry] = []
        for e in entries:
            if len(e) != 5 or not isinstance(e[0], str) or e[1] not in ("f", "x", "d", "l"):
                raise SnapshotError(f"snapshot tree {digest[:12]} has a malformed entry")
            if not _safe_name(e[0]):
                raise SnapshotError(f"snapshot tree {digest[:12]} names an unsafe path {e[0]!r}")
            checked.append((e[0], e[1], int(e[2]), int(e[3]), str(e[4])))
        return checked

    # --- checkpoint ----------------------------------------------------------------------------------------

    def _load_cache(self) -> dict[str, list[Any]]:
        try:
            data = json.loads(self._cache_file.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def _save_cache(self, cache: dict[str, list[Any]]) -> None:
        self._cache_file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self._cache_file.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            json.dump(cache, f, separators=(",", ":"))
        os.replace(tmp, self._cache_file)

    def checkpoint_sync(self) -> SnapshotResult:
        """`checkpoint`, in the calling thread."""
        ensure_private_dir(self.root)  # copies of the workspace's files: the owner alone reads them
        self._objects.mkdir(parents=True, exist_ok=True)
        old_cache = self._load_cache()
        new_cache: dict[str, list[Any]] = {}
        racy_after = time.time_ns() - int(_RACY_SECONDS * 1e9)
        totals = {"files": 0, "bytes": 0, "objects": 0, "hashed": 0}

        def walk(directory: Path, prefix: str) -> str:
            entries: list[Entry] = []
            try:
                with os.scandir(directory) as it:
                    items = sorted(it, key=lambda d: d.name)
            except OSError as exc:
                raise SnapshotError(f"cannot read {directory}: {exc}") from exc
            for item in items:
                if not prefix and item.name in self.excludes:
                    continue
                rel = prefix + item.name
                try:
                    st = item.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # removed while we walked
                if stat.S_ISLNK(st.st_mode):
                    entries.append((item.name, "l", 0, 0, os.readlink(item.path)))
                elif stat.S_ISDIR(st.st_mode):
                    entries.append((item.name, "d", 0, 0, walk(Path(item.path), rel + "/")))
                elif stat.S_ISREG(st.st_mode):
                    kind = "x" if st.st_mode & 0o111 else "f"
                    key = [st.st_size, st.st_mtime_ns, st.st_ino]
                    cached = old_cache.get(rel)
                    if cached is not None and cached[:3] == key:
                        digest = cached[3]
                    else:
                        digest, written = self._put_file(Path(item.path))
                        totals["hashed"] += 1
                        if written >= 0:
                            totals["bytes"] += written
                            totals["objects"] += 1
                    if st.st_mtime_ns < racy_after:
                        new_cache[rel] = [*key, digest]
                    entries.append((item.name, kind, 0, st.st_size, digest))
                    totals["files"] += 1
                # sockets, fifos and devices are not snapshotted
            body = json.dumps({"v": 1, "entries": entries}, separators=(",", ":")).encode()
            digest, written = self._put_bytes(body)
            if written:
                totals["bytes"] += written
                totals["objects"] += 1
            return digest

        ref = walk(self.workspace, "")
        self._save_cache(new_cache)
        return SnapshotResult(
            ref=ref,
            files=totals["files"],
            bytes_new=totals["bytes"],
            objects_new=totals["objects"],
            hashed=totals["hashed"],
        )

    # --- restore -------------------------------------------------------------------------------------------

    def restore_sync(self, ref: str) -> None:
        """`restore`, in the calling thread."""
        self.read_tree(ref)  # a missing or corrupt root fails before anything is touched
        root = self.workspace
        st = os.lstat(root)
        if not stat.S_ISDIR(st.st_mode):
            raise SnapshotError(f"the workspace {root} is not a directory")
        cache = self._load_cache()
        try:
            self._restore_dir(root, ref, top=True, prefix="", cache=cache)
        finally:
            self._save_cache(cache)  # rewritten files left it: they are hashed again next time

    def _restore_dir(
        self, directory: Path, digest: str, *, top: bool, prefix: str, cache: dict[str, list[Any]]
    ) -> None:
        entries = {e[0]: e for e in self.read_tree(digest)}
        with os.scandir(directory) as it:
            present = {d.name: d for d in it}
        for name, item in present.items():
            if top and name in self.excludes:
                continue
            wanted = entries.get(name)
            is_dir = item.is_dir(follow_symlinks=False)
            if wanted is None or (wanted[1] == "d") != is_dir or item.is_symlink():
                _remove(Path(item.path))
        for name, (_, kind, _mode, _size, value) in entries.items():
            if top and name in self.excludes:
                continue
            target = directory / name
            if kind == "d":
                if not _is_real_dir(target):
                    with contextlib.suppress(FileNotFoundError):
                        _remove(target)
                    target.mkdir()
                self._restore_dir(target, value, top=False, prefix=f"{prefix}{name}/", cache=cache)
            elif kind == "l":
                if os.path.lexists(target):
                    _remove(target)
                os.symlink(value, target)
            else:
                self._write_file(target, value, executable=kind == "x", rel=prefix + name, cache=cache)

    def _write_file(
        self, target: Path, digest: str, *, executable: bool, rel: str, cache: dict[str, list[Any]]
    ) -> None:
        cached = cache.pop(rel, None)
        try:
            st = os.lstat(target)
            unchanged = cached is not None and cached[:3] == [st.st_size, st.st_mtime_ns, st.st_ino]
            if stat.S_ISREG(st.st_mode) and unchanged and cached is not None and cached[3] == digest:
                _set_exec(target, executable, st.st_mode)
                cache[rel] = cached  # the stat cache vouches for it: not read again
                return
            if stat.S_ISREG(st.st_mode) and st.st_size == os.stat(self._object_path(digest)).st_size:
                h = hashlib.sha256()
                with open(target, "rb") as f:
                    while chunk := f.read(_CHUNK):
                        h.update(chunk)
                if h.hexdigest() == digest:
                    _set_exec(target, executable, st.st_mode)
                    return
        except FileNotFoundError:
            pass
        data = self.read_object(digest)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".loopd-restore-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o755 if executable else 0o644)
            os.replace(tmp, target)  # replaces a symlink itself, never its target
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    # --- diff ----------------------------------------------------------------------------------------------

    def files(self, ref: str) -> dict[str, tuple[str, str]]:
        """Every file and symlink of snapshot ``ref``: path → (type, digest or target)."""
        out: dict[str, tuple[str, str]] = {}
        for path, kind, value in self._iter(ref, ""):
            out[path] = (kind, value)
        return out

    def _iter(self, digest: str, prefix: str) -> Iterator[tuple[str, str, str]]:
        for name, kind, _mode, _size, value in self.read_tree(digest):
            if kind == "d":
                yield from self._iter(value, f"{prefix}{name}/")
            else:
                yield f"{prefix}{name}", kind, value

    def changes_sync(self, old: str, new: str) -> list[Change]:
        a, b = self.files(old), self.files(new)
        out = [Change("removed", p) for p in a if p not in b]
        out += [Change("added", p) for p in b if p not in a]
        out += [Change("modified", p) for p in a if p in b and a[p] != b[p]]
        return sorted(out, key=lambda c: c.path)

    def diff_sync(self, old: str, new: str) -> str:
        """A unified diff from ``old`` to ``new`` (binary and large files are named, not shown)."""
        a, b = self.files(old), self.files(new)
        parts: list[str] = []
        for change in self.changes_sync(old, new):
            before = self._text(a.get(change.path))
            after = self._text(b.get(change.path))
            if before is None or after is None:
                parts.append(f"{change.status}: {change.path} (binary or large)\n")
                continue
            for line in difflib.unified_diff(
                before.splitlines(keepends=True),
                after.splitlines(keepends=True),
                fromfile=f"a/{change.path}" if change.status != "added" else "/dev/null",
                tofile=f"b/{change.path}" if change.status != "removed" else "/dev/null",
            ):
                parts.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
        return "".join(parts)

    def _text(self, entry: tuple[str, str] | None) -> str | None:
        if entry is None:
            return ""
        kind, value = entry
        if kind == "l":
            return f"-> {value}\n"
        if os.stat(self._object_path(value)).st_size > _DIFF_MAX_BYTES:
            return None
        try:
            return self.read_object(value).decode("utf-8")
        except UnicodeDecodeError:
            return None

    # --- garbage collection --------------------------------------------------------------------------------

    def reachable(self, refs: set[str]) -> set[str]:
        """Every object the snapshots ``refs`` need (missing ones are skipped)."""
        seen: set[str] = set()
        stack = [r for r in refs if self.has(r)]
        while stack:
            digest = stack.pop()
            if digest in seen:
                continue
            seen.add(digest)
            try:
                entries = self.read_tree(digest)
            except SnapshotError:
                continue
            for _name, kind, _mode, _size, value in entries:
                if kind == "d":
                    stack.append(value)
                elif kind in ("f", "x"):
                    seen.add(value)
        return seen


def collect_garbage(root: Path, live_refs: set[str], *, grace_seconds: float = 3600.0) -> tuple[int, int]:
    """Delete every object under ``root`` not reachable from ``live_refs``; (objects deleted, bytes freed).

    Objects younger than ``grace_seconds`` are kept: a snapshot being taken right now is not in a journal yet.
    The stat caches are dropped (they may name deleted objects): the next snapshot of each workspace hashes again.
    """
    store = SnapshotStore(root, root)
    keep = store.reachable(live_refs)
    cutoff = time.time() - grace_seconds
    deleted = freed = 0
    caches = root / "cache"
    if caches.is_dir():
        for cache in caches.iterdir():
            with contextlib.suppress(FileNotFoundError):
                cache.unlink()
    objects = root / "objects"
    if not objects.is_dir():
        return 0, 0
    for sub in objects.iterdir():
        if not sub.is_dir():
            continue
        for path in sub.iterdir():
            digest = sub.name + path.name
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            if digest in keep or st.st_mtime > cutoff:
                continue
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                deleted += 1
                freed += st.st_size
    return deleted, freed


def _is_real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _remove(path: Path) -> None:
    """Remove a file, a symlink (not its target) or a directory tree (symlinks inside are unlinked, not followed)."""
    if _is_real_dir(path):
        import shutil

        shutil.rmtree(path)
    else:
        path.unlink()


def _set_exec(path: Path, executable: bool, mode: int) -> None:
    has = bool(mode & 0o111)
    if has != executable:
        os.chmod(path, 0o755 if executable else 0o644)
