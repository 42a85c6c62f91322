"""Sandboxes for the commands tools run: the seam, an unconfined implementation and bubblewrap.

A `Sandbox` turns a command line into one that runs confined (`wrap`), names itself for start-up reports
(`name`, `describe`) and says which process groups hold the wrapped command, so a graceful SIGTERM reaches it
(`command_groups`). `resolve_sandbox` picks one from a mode — ``auto`` (the default: bubblewrap when it is
installed and works, else none), ``bubblewrap`` (required: `SandboxUnavailableError` when it cannot run) or
``none`` — read from ``LOOPD_SANDBOX`` unless given.

Under bubblewrap (Linux) a command sees:

- the system directories read-only (``/usr``, ``/bin``, ``/sbin``, ``/lib*``, ``/opt``, ``/etc`` with the
  password-hash, sudoers and SSH host-key files masked; with the network, the resolver's directory in ``/run``),
  a minimal ``/dev``, a fresh ``/proc`` of its own pid namespace (no other process is visible, so no
  ``/proc/<pid>/environ``), and a private, empty ``/tmp``;
- the workspace read-write at its own path (the working directory), with ``.git`` and ``.loopd`` re-bound
  read-only (``.loopd``, where the gate rules live, is created first when missing, so a command cannot create
  it to grant itself permissions); any ``hidden`` directory that lies inside a bound tree (e.g. a data
  directory inside the workspace) is covered by an empty tmpfs;
- nothing else: not the user's home, not the data directory, not the host's ``/tmp``; no network unless the
  sandbox was built with ``network=True`` (``LOOPD_SANDBOX_NETWORK=1``); no capabilities (even as root).

bwrap runs in the tool's process group; the command runs in a session of its own inside the sandbox
(``--new-session``), led by bwrap's pid-1 process, whose death (``--die-with-parent``, or the end of the command)
kills everything left in the sandbox. The environment is the one the tool passes to bwrap (already scrubbed);
bwrap hands it to the command unchanged. Values are deliberately not put on bwrap's command line, which any
local user can read in ``ps``.

This module must not import the tools that use it.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, Protocol, runtime_checkable

from loopd.harness._errors import HarnessError

SandboxMode = Literal["auto", "bubblewrap", "none"]
SANDBOX_MODES: Final[tuple[SandboxMode, ...]] = ("auto", "bubblewrap", "none")
SANDBOX_ENV: Final = "LOOPD_SANDBOX"
NETWORK_ENV: Final = "LOOPD_SANDBOX_NETWORK"
PROBE_TIMEOUT: Final = 5.0
READ_ONLY_IN_WORKSPACE: Final = (".git", ".loopd")
"""Workspace entries a sandboxed command may read but not change (when they exist; ``.loopd`` is created)."""

_CREATED_IF_MISSING: Final = frozenset({".loopd"})
_SYSTEM_DIRS: Final = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/etc")
_MASKED_FILES: Final = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/ssh/ssh_host_*_key",
)
"""Secrets in /etc that root (the harness's user in CI and containers) could still read: masked (globs allowed)."""
_RESOLVER_DIRS: Final = ("/run/systemd/resolve", "/run/resolvconf")
"""Where /etc/resolv.conf often points: bound read-only when the network is allowed, so names resolve."""
_MASKED_DIRS: Final = ("/etc/ssl/private", "/etc/sudoers.d")


class SandboxError(HarnessError):
    """The sandbox configuration is wrong (an unknown mode)."""


class SandboxUnavailableError(SandboxError):
    """The sandbox that was asked for cannot run on this machine."""


@runtime_checkable
class Sandbox(Protocol):
    """Confines the commands a tool runs. Implementations are immutable and cheap to call."""

    @property
    def name(self) -> str:
        """``bubblewrap`` or ``none``."""
        ...

    def describe(self) -> str:
        """One line for start-up reports, e.g. ``sandbox: bubblewrap``."""
        ...

    def wrap(self, argv: Sequence[str], *, workspace: Path, hidden: Sequence[Path] = ()) -> list[str]:
        """The command line that runs ``argv`` confined to ``workspace``, with ``hidden`` directories unseen."""
        ...

    def command_groups(self, pid: int) -> list[int]:
        """Process groups besides ``pid``'s own that hold the wrapped command (``pid`` = what was started)."""
        ...


class Unconfined:
    """No sandbox: the command runs as the harness's user with the harness's view of the machine."""

    @property
    def name(self) -> str:
        return "none"

    def describe(self) -> str:
        return "sandbox: none — commands run unconfined"

    def wrap(self, argv: Sequence[str], *, workspace: Path, hidden: Sequence[Path] = ()) -> list[str]:
        return list(argv)

    def command_groups(self, pid: int) -> list[int]:
        return []

    def __repr__(self) -> str:
        return "Unconfined()"


UNCONFINED: Final = Unconfined()


@dataclass(frozen=True, slots=True)
class BubblewrapSandbox:
    """Commands run under bubblewrap (see the module docstring for what they see)."""

    executable: str = "/usr/bin/bwrap"
    network: bool = False

    @property
    def name(self) -> str:
        return "bubblewrap"

    def describe(self) -> str:
        return "sandbox: bubblewrap" + (" (network allowed)" if self.network else "")

    def wrap(self, argv: Sequence[str], *, workspace: Path, hidden: Sequence[Path] = ()) -> list[str]:
        root = Path(os.path.realpath(workspace))
        args = [self.executable, "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        args += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if not self.network:
            args.append("--unshare-net")
        mounts: list[tuple[str, list[str]]] = []  # (where, bwrap arguments)
        bound: list[Path] = [root]
        for directory in _SYSTEM_DIRS:
            if os.path.islink(directory):
                mounts.append((directory, ["--symlink", os.readlink(directory), directory]))
            elif os.path.isdir(directory):
                mounts.append((directory, ["--ro-bind", directory, directory]))
                bound.append(Path(directory))
        mounts += _masks()
        if self.network:
            mounts += [(d, ["--ro-bind-try", d, d]) for d in _RESOLVER_DIRS]
        mounts += [("/dev", ["--dev", "/dev"]), ("/proc", ["--proc", "/proc"]), ("/tmp", ["--tmpfs", "/tmp"])]
        mounts.append((str(root), ["--bind", str(root), str(root)]))
        for entry in READ_ONLY_IN_WORKSPACE:
            target = root / entry
            if entry in _CREATED_IF_MISSING and not os.path.lexists(target):
                with contextlib.suppress(FileExistsError):
                    target.mkdir(mode=0o700)
            # Only a real directory or file: a symlink would bind its (outside) target into the sandbox.
            if os.path.lexists(target) and not os.path.islink(target):
                mounts.append((str(target), ["--ro-bind", str(target), str(target)]))
        mounts += [(str(d), ["--tmpfs", str(d)]) for d in _visible(hidden, bound)]
        # bwrap mounts in order and a mount hides what is below it: parents first, so a workspace in /tmp sits on
        # the fresh /tmp, and a workspace above a system directory (``/`` itself) stays under the read-only one.
        for _, mount in sorted(mounts, key=lambda item: len(Path(item[0]).parts)):
            args += mount
        args += ["--chdir", str(root), "--"]
        return args + list(argv)

    def command_groups(self, pid: int) -> list[int]:
        # bwrap's pid-1 process is bwrap's child and leads the command's session (--new-session).
        return child_pids(pid)


def _masks() -> list[tuple[str, list[str]]]:
    mounts: list[tuple[str, list[str]]] = []
    for pattern in _MASKED_FILES:
        for path in sorted(glob.glob(pattern)):
            if os.path.isfile(path) and not os.path.islink(path):
                mounts.append((path, ["--ro-bind", "/dev/null", path]))
    for path in _MASKED_DIRS:
        if os.path.isdir(path) and not os.path.islink(path):
            mounts.append((path, ["--tmpfs", path]))
    return mounts


def _visible(hidden: Iterable[Path], bound: Sequence[Path]) -> list[Path]:
    """The hidden directories that exist inside a bound tree (the others are not in the sandbox at all)."""
    found: list[Path] = []
    for path in hidden:
        real = Path(os.path.realpath(path))
        if real.is_dir() and not real.is_symlink() and any(real.is_relative_to(b) for b in bound):
            found.append(real)
    return found


def child_pids(pid: int) -> list[int]:
    """The pids of ``pid``'s children (Linux ``/proc``); empty when they cannot be read."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN: look at every process's parent
        return _children_by_scan(pid)
    except OSError:
        return []
    return [int(field) for field in text.split() if field.isdigit()]


def _children_by_scan(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                # /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may hold spaces and parentheses.
                fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    found.append(int(entry.name))
    return found


def resolve_sandbox(
    mode: str | None = None,
    *,
    network: bool | None = None,
    environ: Mapping[str, str] | None = None,
) -> Sandbox:
    """The sandbox for ``mode`` (default: ``$LOOPD_SANDBOX``, else ``auto``).

    Raises `SandboxError` for an unknown mode and `SandboxUnavailableError` when ``bubblewrap`` is required but
    is missing or does not work here.
    """
    env = os.environ if environ is None else environ
    chosen = (mode or env.get(SANDBOX_ENV) or "auto").strip().lower()
    if chosen not in SANDBOX_MODES:
        raise SandboxError(
            f"unknown sandbox {chosen!r}: use one of {', '.join(SANDBOX_MODES)} (--sandbox, {SANDBOX_ENV})"
        )
    if network is None:
        network = env.get(NETWORK_ENV, "").strip().lower() in {"1", "true", "yes", "allow"}
    if chosen == "none":
        return UNCONFINED
    problem = bubblewrap_problem(network=network)
    if problem is None:
        executable = shutil.which("bwrap") or "/usr/bin/bwrap"
        return BubblewrapSandbox(executable=executable, network=network)
    if chosen == "bubblewrap":
        raise SandboxUnavailableError(f"sandbox bubblewrap is unavailable: {problem}")
    return UNCONFINED


def bubblewrap_problem(*, network: bool = False) -> str | None:
    """Why bubblewrap cannot confine commands here, or None when it can (probed once per process)."""
    if not sys.platform.startswith("linux"):
        return "bubblewrap needs Linux"
    executable = shutil.which("bwrap")
    if executable is None:
        return "bwrap is not installed (Debian/Ubuntu package: bubblewrap)"
    return _probe(executable, network)


@functools.cache
def _probe(executable: str, network: bool) -> str | None:
    sandbox = BubblewrapSandbox(executable=executable, network=network)
    with tempfile.TemporaryDirectory(prefix="loopd-sandbox-probe-") as workspace:
        argv = sandbox.wrap(["true"], workspace=Path(workspace))
        try:
            done = subprocess.run(
                argv,
                env={"PATH": "/usr/bin:/bin"},
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=PROBE_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return f"{executable} did not finish a trivial command within {PROBE_TIMEOUT:g}s"
        except OSError as exc:
            return f"{executable} cannot be started ({exc})"
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip().splitlines()
        return f"{executable} failed a trivial command ({detail[-1] if detail else f'exit {done.returncode}'})"
    return None
