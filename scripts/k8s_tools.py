#!/usr/bin/env python3
"""Build and cache the Kubernetes binaries the real-API-server tests need: kube-apiserver, kubectl,
kube-controller-manager (garbage collection, namespace finalization), etcd, helm.

Each tool is compiled from its published Go module (the only place this machine can get it from) into
``${XDG_CACHE_HOME:-~/.cache}/loopd/k8s-tools/<tool>-<version>/<tool>``, so only the first run pays the build.
A build writes a small Go module next to the binary (``src/``: a ``go.mod`` that requires the tool's module at a
pinned version, with ``replace`` lines where the tool needs them) and runs ``go mod tidy`` + ``go build`` under
``nice -n 10`` with ``-trimpath``. Builds of one tool are serialised by a file lock, so parallel test workers or
two shells never build the same binary twice; the binary appears atomically (written aside, then renamed).

Usage::

    python scripts/k8s_tools.py path TOOL   # absolute path of TOOL; builds it first if missing
    python scripts/k8s_tools.py ensure      # every tool, in the order of TOOLS; prints each build time
    python scripts/k8s_tools.py versions    # the pinned versions

TOOL: kube-apiserver, etcd, kubectl, kube-controller-manager, helm.

Progress goes to stderr; ``path`` prints only the path on stdout. The Go toolchain comes from ``$GO`` or ``go`` on
``PATH``. A binary is kept while the build recipe recorded beside it (``fingerprint``: go.mod, sources, ldflags)
is this script's; otherwise it is rebuilt and replaced by an atomic rename (running copies are unaffected). This
script must not download anything but Go modules (through ``go`` itself).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

KUBERNETES_VERSION = "v1.37.2"
# The staging modules k8s.io/kubernetes replaces with ./staging/... in its own go.mod; published as v0.X.Y.
_STAGING_VERSION = "v0.37.2"
_STAGING_MODULES = (
    "api",
    "apiextensions-apiserver",
    "apimachinery",
    "apiserver",
    "cli-runtime",
    "client-go",
    "cloud-provider",
    "cluster-bootstrap",
    "code-generator",
    "component-base",
    "component-helpers",
    "controller-manager",
    "cri-api",
    "cri-client",
    "cri-streaming",
    "csi-translation-lib",
    "dynamic-resource-allocation",
    "endpointslice",
    "externaljwt",
    "kms",
    "kube-aggregator",
    "kube-controller-manager",
    "kube-proxy",
    "kube-scheduler",
    "kubectl",
    "kubelet",
    "metrics",
    "mount-utils",
    "pod-security-admission",
    "sample-apiserver",
    "streaming",
)
ETCD_VERSION = "v3.6.16"
HELM_VERSION = "v3.22.0"
_GO_DIRECTIVE = "1.26.0"

_ETCD_MAIN = """// Command etcd: the etcd server, built from its published module (loopd's test toolchain).
package main

import (
\t"os"

\t"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
\tetcdmain.Main(os.Args)
}
"""


class ToolError(RuntimeError):
    """A tool could not be built (no Go toolchain, a failed ``go`` command) or is unknown."""


@dataclass(frozen=True)
class GoTool:
    """How to build one binary from a Go module: what to require, what to replace, which package is ``main``."""

    name: str
    version: str
    module: str
    package: str
    replaces: tuple[tuple[str, str, str], ...] = ()  # (module, replacement module, version)
    main_source: str | None = None  # a main.go of our own when the module has no main package to build
    extra_imports: tuple[str, ...] = field(default=())  # other packages tidy must keep (tools sharing the module)
    ldflags: tuple[str, ...] = ()  # e.g. -X lines stamping the version the binary reports

    def go_mod(self) -> str:
        """The generated go.mod: our module, the pinned requirement, the replace lines."""
        lines = [f"module loopd.local/k8s-tools/{self.name}", "", f"go {_GO_DIRECTIVE}", ""]
        lines.append(f"require {self.module} {self.version}")
        if self.replaces:
            lines += ["", "replace ("]
            lines += [f"\t{old} => {new} {version}" for old, new, version in self.replaces]
            lines.append(")")
        return "\n".join(lines) + "\n"

    def sources(self) -> dict[str, str]:
        """The Go files of the generated module (a main, or a build-tagged file importing the tool's package)."""
        if self.main_source is not None:
            return {"main.go": self.main_source}
        imports = "".join(f'\t_ "{pkg}"\n' for pkg in (self.package, *self.extra_imports))
        return {"tools.go": f"//go:build tools\n\npackage tools\n\nimport (\n{imports})\n"}

    def build_target(self) -> str:
        """The package ``go build`` compiles."""
        return "." if self.main_source is not None else self.package

    def fingerprint(self) -> str:
        """A digest of the build recipe (go.mod, sources, target, ldflags): a cached binary made by another recipe
        (an older version of this script, or by hand) is rebuilt."""
        recipe = json.dumps([self.go_mod(), self.sources(), self.build_target(), list(self.ldflags)], sort_keys=True)
        return hashlib.sha256(recipe.encode()).hexdigest()[:16]


_KUBE_REPLACES = tuple((f"k8s.io/{m}", f"k8s.io/{m}", _STAGING_VERSION) for m in _STAGING_MODULES)
_KUBE_MAJOR, _KUBE_MINOR = KUBERNETES_VERSION.lstrip("v").split(".")[:2]
# What `/version` and `kubectl version` report (a module build otherwise says v0.0.0-master).
_KUBE_LDFLAGS = tuple(
    f"-X k8s.io/component-base/version.{key}={value}"
    for key, value in (
        ("gitVersion", KUBERNETES_VERSION),
        ("gitMajor", _KUBE_MAJOR),
        ("gitMinor", _KUBE_MINOR),
        ("gitTreeState", "clean"),
    )
)

# helm's own Makefile stamps its version and the Kubernetes version it assumes (.Capabilities.KubeVersion in
# `helm template`, the deprecated-API checks of `helm lint`) from its client-go (v0.37 → 1.37); unstamped it says v1.20.
_HELM_KUBE_MINOR = "37"
_HELM_LDFLAGS = (
    f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",
    "-X helm.sh/helm/v3/internal/version.gitTreeState=clean",
    "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1",
    f"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor={_HELM_KUBE_MINOR}",
    "-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1",
    f"-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor={_HELM_KUBE_MINOR}",
)

TOOLS: dict[str, GoTool] = {
    "kube-apiserver": GoTool(
        name="kube-apiserver",
        version=KUBERNETES_VERSION,
        module="k8s.io/kubernetes",
        package="k8s.io/kubernetes/cmd/kube-apiserver",
        replaces=_KUBE_REPLACES,
        ldflags=_KUBE_LDFLAGS,
    ),
    "etcd": GoTool(
        name="etcd",
        version=ETCD_VERSION,
        module="go.etcd.io/etcd/server/v3",
        package="go.etcd.io/etcd/server/v3/etcdmain",
        main_source=_ETCD_MAIN,
    ),
    "kubectl": GoTool(
        name="kubectl",
        version=KUBERNETES_VERSION,
        module="k8s.io/kubernetes",
        package="k8s.io/kubernetes/cmd/kubectl",
        replaces=_KUBE_REPLACES,
        ldflags=_KUBE_LDFLAGS,
    ),
    "kube-controller-manager": GoTool(
        name="kube-controller-manager",
        version=KUBERNETES_VERSION,
        module="k8s.io/kubernetes",
        package="k8s.io/kubernetes/cmd/kube-controller-manager",
        replaces=_KUBE_REPLACES,
        ldflags=_KUBE_LDFLAGS,
    ),
    "helm": GoTool(
        name="helm",
        version=HELM_VERSION,
        module="helm.sh/helm/v3",
        package="helm.sh/helm/v3/cmd/helm",
        ldflags=_HELM_LDFLAGS,
    ),
}


def cache_root() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/loopd/k8s-tools``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "loopd" / "k8s-tools"


def tool_dir(tool: GoTool) -> Path:
    """Where one version of one tool lives."""
    return cache_root() / f"{tool.name}-{tool.version}"


def binary_path(tool: GoTool) -> Path:
    """The cached binary (it may not exist yet)."""
    return tool_dir(tool) / tool.name


def _log(message: str) -> None:
    print(f"k8s_tools: {message}", file=sys.stderr, flush=True)


def _go() -> str:
    go = os.environ.get("GO") or shutil.which("go")
    if not go:
        raise ToolError("no Go toolchain: install Go (go1.26 or newer) or set $GO")
    return go


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(argv: Sequence[str], *, cwd: Path, env: dict[str, str], timeout: float) -> None:
    _log("$ " + " ".join(argv))
    try:
        result = subprocess.run(
            ["nice", "-n", "10", *argv],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ToolError(f"{' '.join(argv)} did not finish within {timeout:.0f} s") from exc
    if result.returncode != 0:
        tail = "\n".join(result.stdout.splitlines()[-40:])
        raise ToolError(f"{' '.join(argv)} failed (exit {result.returncode}):\n{tail}")


def build_seconds(tool: GoTool) -> float | None:
    """How long the first build of this tool version took (Go's build cache was cold for its packages), if known."""
    try:
        return float((tool_dir(tool) / "build-seconds").read_text().strip())
    except (OSError, ValueError):
        return None


def _is_current(tool: GoTool) -> bool:
    binary = binary_path(tool)
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        return False
    try:
        return (tool_dir(tool) / "fingerprint").read_text().strip() == tool.fingerprint()
    except OSError:
        return False


def ensure_tool(name: str, *, timeout: float = 3600.0) -> tuple[Path, float | None]:
    """Return (binary path, seconds this call spent building or None when it was cached); build if missing."""
    tool = TOOLS.get(name)
    if tool is None:
        raise ToolError(f"unknown tool {name!r}; known: {', '.join(sorted(TOOLS))}")
    binary = binary_path(tool)
    directory = tool_dir(tool)
    if _is_current(tool):
        return binary, None
    with _locked(directory / ".lock"):
        if _is_current(tool):  # another process built it while we waited
            return binary, None
        if binary.exists():
            _log(f"rebuilding {binary}: it was made by another build recipe")
        go = _go()
        src = directory / "src"
        src.mkdir(parents=True, exist_ok=True)
        (src / "go.mod").write_text(tool.go_mod())
        for stale in src.glob("*.go"):
            stale.unlink()
        for filename, text in tool.sources().items():
            (src / filename).write_text(text)
        env = dict(os.environ)
        env["GOFLAGS"] = "-trimpath -buildvcs=false"  # cgo as the machine has it (the build cache is shared)
        started = time.monotonic()
        _log(f"building {tool.name} {tool.version} from {tool.module} (first run only; this can take many minutes)")
        _run([go, "mod", "tidy"], cwd=src, env=env, timeout=timeout)
        partial = directory / f".{tool.name}.partial"
        ldflags = ["-ldflags", " ".join(("-s", "-w", *tool.ldflags))]
        _run([go, "build", *ldflags, "-o", str(partial), tool.build_target()], cwd=src, env=env, timeout=timeout)
        partial.chmod(0o755)
        partial.replace(binary)
        elapsed = time.monotonic() - started
        (directory / "fingerprint").write_text(tool.fingerprint() + "\n")
        if build_seconds(tool) is None:  # the first build's time (a later rebuild reuses Go's build cache)
            (directory / "build-seconds").write_text(f"{elapsed:.1f}\n")
        _log(f"built {binary} in {elapsed:.0f} s")
        return binary, elapsed


def _cmd_path(name: str) -> int:
    binary, _ = ensure_tool(name)
    print(binary)
    return 0


def _cmd_ensure(names: Sequence[str]) -> int:
    for name in names or list(TOOLS):
        binary, elapsed = ensure_tool(name)
        tool = TOOLS[name]
        if elapsed is not None:
            print(f"{name} {tool.version}: built in {elapsed:.0f} s -> {binary}")
        else:
            first = build_seconds(tool)
            note = f" (its first build took {first:.0f} s)" if first is not None else ""
            print(f"{name} {tool.version}: cached{note} -> {binary}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: ``path TOOL``, ``ensure [TOOL...]``, ``versions``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    path = sub.add_parser("path", help="print the absolute path of a tool, building it first if missing")
    path.add_argument("tool", choices=sorted(TOOLS))
    ensure = sub.add_parser("ensure", help="build every missing tool (or the named ones); print build times")
    ensure.add_argument("tools", nargs="*", metavar="TOOL", help=", ".join(sorted(TOOLS)))
    sub.add_parser("versions", help="print the pinned versions")
    args = parser.parse_args(argv)
    try:
        if args.command == "path":
            return _cmd_path(args.tool)
        if args.command == "ensure":
            return _cmd_ensure(args.tools)
        for name, tool in TOOLS.items():
            print(f"{name} {tool.version} ({tool.module})")
        return 0
    except ToolError as exc:
        _log(f"error: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
