"""A real Kubernetes API server for tests: etcd + kube-apiserver on loopback, started from cached binaries.

``start_cluster()`` starts etcd (free loopback ports, a temporary data directory, no fsync) and kube-apiserver on
127.0.0.1 with a generated CA and serving certificate, a static token file (an admin token in ``system:masters``),
``--authorization-mode=RBAC``, service-account signing keys (so TokenRequest works) and a service IP range; it waits
for ``/readyz``, then starts kube-controller-manager with only the garbage collector, the namespace controller and
the service-account controller (owned objects are deleted with their owner, deleted namespaces are finalized, each
namespace gets its ``default`` ServiceAccount), and returns a ``KubeCluster``. ``KubeCluster.stop()`` ends the
processes by pid. Without a cached kube-controller-manager the cluster still starts (``has_controller_manager`` is
False) and none of that happens.

The binaries come from ``scripts/k8s_tools.py`` (built from their Go modules and cached per version); this module
only looks them up, it never builds (``make test-k8s`` runs ``scripts/k8s_tools.py ensure`` first).
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import importlib.util
import ipaddress
import json
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from tests.support.kubectl import find_kubectl

REPO = Path(__file__).resolve().parents[2]
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
ADMIN_USER = "loopd-test-admin"


class ClusterError(RuntimeError):
    """The cluster could not be started (a binary missing, a process exited, /readyz never answered)."""


def _load_tools() -> ModuleType:
    loaded = sys.modules.get("loopd_k8s_tools")
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location("loopd_k8s_tools", REPO / "scripts" / "k8s_tools.py")
    if spec is None or spec.loader is None:
        raise ClusterError("scripts/k8s_tools.py is missing")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is being made
    spec.loader.exec_module(module)
    return module


def cached_tool(name: str) -> Path | None:
    """The cached binary of ``name`` (``scripts/k8s_tools.py``), or None when it has not been built yet."""
    tools = _load_tools()
    path: Path = tools.binary_path(tools.TOOLS[name])
    return path if path.is_file() and os.access(path, os.X_OK) else None


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# -- certificates --------------------------------------------------------------------------------------------


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write_pki(directory: Path) -> dict[str, Path]:
    """A CA, a serving certificate for 127.0.0.1/localhost/kubernetes signed by it, and a service-account key pair."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "loopd-test-ca")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    serving_key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    ]
    serving_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(serving_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    files = {
        "ca": directory / "ca.crt",
        "serving_cert": directory / "apiserver.crt",
        "serving_key": directory / "apiserver.key",
        "sa_key": directory / "sa.key",
        "sa_pub": directory / "sa.pub",
    }
    files["ca"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files["serving_cert"].write_bytes(serving_cert.public_bytes(serialization.Encoding.PEM))
    files["serving_key"].write_bytes(_pem_key(serving_key))
    files["sa_key"].write_bytes(_pem_key(sa_key))
    files["sa_pub"].write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    for path in files.values():
        path.chmod(0o600)
    return files


# -- the cluster ---------------------------------------------------------------------------------------------


def render_kubeconfig(server: str, ca_pem: str, token: str, *, namespace: str = "default", user: str = "user") -> str:
    """A kubeconfig (one cluster, one user with a bearer token, one current context) as YAML."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "loopd-test",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem.encode()).decode(),
                },
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [
            {"name": "loopd-test", "context": {"cluster": "loopd-test", "user": user, "namespace": namespace}}
        ],
        "current-context": "loopd-test",
    }
    return yaml.safe_dump(config, sort_keys=False)


@dataclass
class _Process:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    argv: tuple[str, ...]

    def alive(self) -> bool:
        return self.process.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM by pid, then SIGKILL after ``timeout`` s; reaps the process."""
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=timeout)


@dataclass
class KubeCluster:
    """A running etcd + kube-apiserver. ``server`` is the HTTPS URL, ``ca_path`` the CA of its serving certificate,
    ``admin_token`` a bearer token in ``system:masters``, ``kubeconfig`` an admin kubeconfig file."""

    server: str
    ca_path: Path
    admin_token: str
    kubeconfig: Path
    kubectl_path: Path
    workdir: Path
    etcd_url: str
    has_controller_manager: bool = False
    _processes: list[_Process] = field(default_factory=list, repr=False)
    _sa_counter: int = field(default=0, repr=False)

    @property
    def ca_pem(self) -> str:
        """The CA certificate (PEM)."""
        return self.ca_path.read_text()

    def kubeconfig_text(self, token: str, *, namespace: str = "default") -> str:
        """A kubeconfig for this cluster with ``token`` as the bearer token."""
        return render_kubeconfig(self.server, self.ca_pem, token, namespace=namespace)

    def kubeconfig_dict(self, token: str | None = None, *, namespace: str = "default") -> dict[str, Any]:
        """The same kubeconfig, parsed (what ``open_http_client`` / ``open_runtime`` accept)."""
        config: dict[str, Any] = yaml.safe_load(self.kubeconfig_text(token or self.admin_token, namespace=namespace))
        return config

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        kubeconfig: Path | None = None,
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl (the cached v1.37 build) with the admin kubeconfig (or ``kubeconfig``); ``check``: raise
        ``AssertionError`` with its output when it exits non-zero."""
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.workdir / "home"),
            "KUBECONFIG": str(kubeconfig or self.kubeconfig),
        }
        argv = [str(self.kubectl_path), "--cache-dir", str(self.workdir / "kubectl-cache"), *args]
        result = subprocess.run(
            argv, input=input, capture_output=True, text=True, env=env, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} exited {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
            )
        return result

    def apply(
        self,
        manifests: str | Sequence[Mapping[str, Any]],
        *,
        namespace: str | None = None,
        kubeconfig: Path | None = None,
    ) -> str:
        """``kubectl apply -f -`` of YAML text or of parsed objects (namespaced objects without a namespace go to
        ``namespace``, else the kubeconfig's, ``default``); its output."""
        text = manifests if isinstance(manifests, str) else yaml.safe_dump_all(list(manifests), sort_keys=False)
        where = ["--namespace", namespace] if namespace else []
        return self.kubectl("apply", *where, "-f", "-", input=text, kubeconfig=kubeconfig).stdout

    def create_namespace(self, prefix: str = "t") -> str:
        """A new namespace with a unique name."""
        name = f"{prefix}-{secrets.token_hex(4)}"
        self.kubectl("create", "namespace", name)
        return name

    def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        token: str | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, dict[str, Any]]:
        """One API call (JSON in, JSON out) with the admin token (or ``token``): (HTTP status, decoded body).
        ``content_type``: e.g. ``application/merge-patch+json`` for a PATCH."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {token or self.admin_token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        context = ssl.create_default_context(cafile=str(self.ca_path))
        try:
            with urllib.request.urlopen(req, context=context, timeout=30) as response:
                return response.status, _json_or_empty(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, _json_or_empty(exc.read())

    def service_account_token(self, namespace: str, name: str, *, expiration_seconds: int = 7200) -> str:
        """A TokenRequest token of ServiceAccount ``namespace/name`` (which must exist)."""
        status, body = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": expiration_seconds},
            },
        )
        if status != 201:
            raise AssertionError(f"TokenRequest for {namespace}/{name} answered {status}: {body}")
        token: str = body["status"]["token"]
        return token

    def service_account_kubeconfig(
        self, namespace: str, name: str, *, create_namespace: bool = True, expiration_seconds: int = 7200
    ) -> Path:
        """Create ServiceAccount ``namespace/name`` (and its namespace) if missing, and write a kubeconfig that
        authenticates as it with a TokenRequest token: it has exactly the RBAC bound to that account."""
        if create_namespace:
            self.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        status, body = self.request(
            "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": name}}
        )
        if status not in (201, 409):
            raise AssertionError(f"creating ServiceAccount {namespace}/{name} answered {status}: {body}")
        token = self.service_account_token(namespace, name, expiration_seconds=expiration_seconds)
        self._sa_counter += 1
        path = self.workdir / "kubeconfigs" / f"sa-{self._sa_counter}-{namespace}-{name}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(self.kubeconfig_text(token, namespace=namespace))
        path.chmod(0o600)
        return path

    def restart_apiserver(self, *, timeout: float = 120.0) -> None:
        """Stop kube-apiserver (SIGTERM by pid) and start it again with the same flags, port and etcd; return once
        ``/readyz`` answers. Clients see their connections and watches end, then the same API come back."""
        index = next(i for i, p in enumerate(self._processes) if p.name == "kube-apiserver")
        old = self._processes[index]
        old.stop()
        new = _spawn("kube-apiserver", old.argv, self.workdir)
        self._processes[index] = new
        _wait(
            "kube-apiserver /readyz after a restart",
            lambda: _apiserver_ready(self.server, self.ca_path, self.admin_token),
            [new],
            timeout,
        )

    def alive(self) -> bool:
        """Every process still runs."""
        return all(p.alive() for p in self._processes)

    def stop(self) -> None:
        """Stop kube-controller-manager, kube-apiserver, then etcd (by pid)."""
        for process in reversed(self._processes):
            process.stop()


def _json_or_empty(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw or b"{}")
    except ValueError:
        return {"raw": raw.decode(errors="replace")}
    return value if isinstance(value, dict) else {"value": value}


def _spawn(name: str, argv: Sequence[str], workdir: Path) -> _Process:
    log = workdir / f"{name}.log"
    with log.open("ab") as handle:
        process = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT, cwd=workdir
        )
    return _Process(name, process, log, tuple(argv))


def _wait(what: str, check: Any, processes: Sequence[_Process], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        for process in processes:
            if not process.alive():
                raise ClusterError(
                    f"{process.name} exited ({process.process.returncode}) while waiting for {what}:\n{process.tail()}"
                )
        if check():
            return
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}:\n{p.tail()}" for p in processes)
            raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}\n{tails}")
        time.sleep(0.2)


def _etcd_healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as response:
            return bool(json.loads(response.read()).get("health") == "true")
    except (OSError, ValueError):
        return False


def _apiserver_ready(server: str, ca: Path, token: str) -> bool:
    req = urllib.request.Request(server + "/readyz")
    req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, context=ssl.create_default_context(cafile=str(ca)), timeout=5) as response:
            return bool(response.status == 200)
    except (OSError, ValueError):
        return False


def start_cluster(workdir: Path, *, timeout: float = 180.0, attempts: int = 3) -> KubeCluster:
    """Start etcd + kube-apiserver under ``workdir`` from the cached binaries; ``ClusterError`` if a binary is
    missing or they do not become ready within ``timeout`` s (a port taken between probing and binding is retried
    ``attempts`` times)."""
    binaries: dict[str, Path] = {}
    for name in ("etcd", "kube-apiserver", "kubectl"):
        path = cached_tool(name)
        if path is None and name == "kubectl":  # the distribution's kubectl will do if the v1.37 build is missing
            system = find_kubectl()
            path = Path(system) if system else None
        if path is None:
            raise ClusterError(f"{name} is not built: run `python scripts/k8s_tools.py ensure` (or `make test-k8s`)")
        binaries[name] = path
    manager = cached_tool("kube-controller-manager")
    if manager is not None:
        binaries["kube-controller-manager"] = manager
    last: ClusterError | None = None
    for attempt in range(attempts):
        try:
            return _start_once(workdir / f"try{attempt}", binaries, timeout)
        except ClusterError as exc:
            last = exc
            if "address already in use" not in str(exc):
                raise
    assert last is not None
    raise last


def _start_once(workdir: Path, binaries: Mapping[str, Path], timeout: float) -> KubeCluster:
    workdir.mkdir(parents=True)
    (workdir / "home").mkdir()
    pki = _write_pki(workdir)
    admin_token = secrets.token_urlsafe(24)
    tokens = workdir / "tokens.csv"
    tokens.write_text(f'{admin_token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
    tokens.chmod(0o600)

    client_port, peer_port, secure_port = free_port(), free_port(), free_port()
    etcd_url = f"http://127.0.0.1:{client_port}"
    peer_url = f"http://127.0.0.1:{peer_port}"
    processes: list[_Process] = []
    try:
        etcd = _spawn(
            "etcd",
            [
                str(binaries["etcd"]),
                "--name=loopd-test",
                f"--data-dir={workdir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=loopd-test={peer_url}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
            workdir,
        )
        processes.append(etcd)
        _wait("etcd /health", lambda: _etcd_healthy(etcd_url), processes, timeout)
        server = f"https://127.0.0.1:{secure_port}"
        apiserver = _spawn(
            "kube-apiserver",
            [
                str(binaries["kube-apiserver"]),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={secure_port}",
                f"--tls-cert-file={pki['serving_cert']}",
                f"--tls-private-key-file={pki['serving_key']}",
                f"--cert-dir={workdir / 'certs'}",
                f"--token-auth-file={tokens}",
                "--authorization-mode=RBAC",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={pki['sa_pub']}",
                f"--service-account-signing-key-file={pki['sa_key']}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                "--v=1",
            ],
            workdir,
        )
        processes.append(apiserver)
        _wait("kube-apiserver /readyz", lambda: _apiserver_ready(server, pki["ca"], admin_token), processes, timeout)
        kubeconfig = workdir / "admin.kubeconfig"
        kubeconfig.write_text(render_kubeconfig(server, pki["ca"].read_text(), admin_token, user=ADMIN_USER))
        kubeconfig.chmod(0o600)
        if "kube-controller-manager" in binaries:
            processes.append(
                _spawn(
                    "kube-controller-manager",
                    [
                        str(binaries["kube-controller-manager"]),
                        f"--kubeconfig={kubeconfig}",
                        "--controllers=garbagecollector,namespace,serviceaccount",
                        "--leader-elect=false",
                        "--use-service-account-credentials=false",
                        "--secure-port=0",
                        "--v=1",
                    ],
                    workdir,
                )
            )
    except BaseException:
        for process in reversed(processes):
            process.stop()
        raise
    return KubeCluster(
        server=server,
        ca_path=pki["ca"],
        admin_token=admin_token,
        kubeconfig=kubeconfig,
        kubectl_path=binaries["kubectl"],
        workdir=workdir,
        etcd_url=etcd_url,
        has_controller_manager="kube-controller-manager" in binaries,
        _processes=processes,
    )


@contextlib.contextmanager
def running_cluster(workdir: Path, *, timeout: float = 180.0) -> Iterator[KubeCluster]:
    """``start_cluster`` for a ``with`` block; stops both processes at the end."""
    cluster = start_cluster(workdir, timeout=timeout)
    try:
        yield cluster
    finally:
        cluster.stop()
