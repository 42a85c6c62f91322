"""Run the real ``kubectl`` against a kubeconfig, isolated and with timeouts.

Each ``Kubectl`` has its own ``HOME`` and ``--cache-dir`` (kubectl caches discovery for hours), never reads the
user's kubeconfig, and kills whatever it started. With ``CI=true`` a missing kubectl must fail the run: use
``find_kubectl()`` + ``tests.support.availability.missing()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

DEFAULT_KUBECTL = "/usr/bin/kubectl"


def find_kubectl() -> str | None:
    candidate = os.environ.get("LOOPD_KUBECTL") or DEFAULT_KUBECTL
    if os.access(candidate, os.X_OK):
        return candidate
    return shutil.which("kubectl")


@dataclass(frozen=True)
class KubectlResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


class KubectlProcess:
    """A long-running kubectl (``get -w``): read lines with a timeout, then ``stop()``."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process

    async def readline(self, timeout: float = 15.0) -> str:
        assert self._process.stdout is not None
        async with asyncio.timeout(timeout):
            line = await self._process.stdout.readline()
        return line.decode()

    async def read_until(self, predicate: str, timeout: float = 15.0) -> list[str]:
        """Lines read until one contains ``predicate`` (inclusive)."""
        lines: list[str] = []
        async with asyncio.timeout(timeout):
            while True:
                line = await self.readline(timeout)
                if not line:
                    raise AssertionError(f"kubectl exited before printing {predicate!r}; got {lines!r}")
                lines.append(line)
                if predicate in line:
                    return lines

    async def stop(self) -> None:
        if self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.terminate()
            try:
                async with asyncio.timeout(5):
                    await self._process.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self._process.kill()
                await self._process.wait()


class Kubectl:
    def __init__(self, binary: str, kubeconfig: Path, home: Path) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self._env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "KUBECONFIG": str(kubeconfig),
            "LANG": "C.UTF-8",
        }

    def _argv(self, args: tuple[str, ...]) -> list[str]:
        return [self.binary, f"--cache-dir={self.home / 'cache'}", "--request-timeout=20s", *args]

    async def run(self, *args: str, stdin: str | None = None, timeout: float = 30.0) -> KubectlResult:
        process = await asyncio.create_subprocess_exec(
            *self._argv(args),
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self._env,
            cwd=str(self.home),
        )
        try:
            async with asyncio.timeout(timeout):
                out, err = await process.communicate(stdin.encode() if stdin is not None else None)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            raise AssertionError(f"kubectl {' '.join(args)} timed out after {timeout}s") from None
        return KubectlResult(process.returncode or 0, out.decode(), err.decode())

    async def ok(self, *args: str, stdin: str | None = None, timeout: float = 30.0) -> str:
        """Run and require exit code 0; returns stdout."""
        result = await self.run(*args, stdin=stdin, timeout=timeout)
        if result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.output}")
        return result.stdout

    async def start(self, *args: str) -> KubectlProcess:
        process = await asyncio.create_subprocess_exec(
            *self._argv(args),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=self._env,
            cwd=str(self.home),
        )
        return KubectlProcess(process)
