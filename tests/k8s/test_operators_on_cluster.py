"""The distributed mode end to end: a Router question and a LongHorizon question answered by ``loopd server`` and
``loopd operator router|longhorizon`` as separate processes, their Tasks (and Runs) on the real kube-apiserver + etcd,
the server's state in PostgreSQL.

Each process runs with exactly the RBAC the Helm chart grants its ServiceAccount (``tests.k8s.chart``): the server
creates, watches and deletes Tasks; the Router watches them, writes their status and elects its leader on a Lease
— nothing more. The operator authenticates to the server with a token made for ``operator:router``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.e2e.router_support import API_KEY, answer_text, ask, router_model, wait_answer, work_messages
from tests.k8s.chart import chart_component_kubeconfig
from tests.k8s.cluster import KubeCluster
from tests.support.postgres import postgres_dsn, postgres_server
from tests.support.waiting import wait_until

__all__ = ["postgres_dsn", "postgres_server"]  # fixtures

LOOPD = str(Path(sys.executable).parent / "loopd")
QUESTION = "Introduce Liu Bei, Guan Yu, and Zhang Fei"
pytestmark = pytest.mark.timeout(300)


@dataclass
class Process:
    process: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        """SIGTERM (by pid), then SIGKILL after 30 s."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)


def _spawn(command: list[str], log: Path, env: dict[str, str]) -> Process:
    with open(log, "wb") as out:
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    return Process(child, log)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPD_", "OPENAI_", "KUBECONFIG"))}
    env.update({"COLUMNS": "200", **extra})
    return env


@dataclass(frozen=True)
class Deployed:
    url: str
    admin: str
    namespace: str


@contextlib.contextmanager
def deployed(
    cluster: KubeCluster, dsn: str, tmp_path: Path, operator: str, model_env: dict[str, str]
) -> Iterator[Deployed]:
    """`loopd server` on the cluster + PostgreSQL and `loopd operator <operator>` beside it, each a separate
    process with only the chart's RBAC for its component; stopped (by pid) at the end."""
    namespace = f"{operator[:6]}-{int(time.time() * 1000) % 10**9}"
    server_config = chart_component_kubeconfig(cluster, namespace, "server")
    operator_config = chart_component_kubeconfig(cluster, namespace, operator)
    data_dir = tmp_path / "server"
    server = _spawn(
        [
            LOOPD, "--log-level", "info", "server", "--port", "0", "--data-dir", str(data_dir),
            "--database", dsn, "--kube-api", "kubeconfig", "--kubeconfig", str(server_config),
            "--namespace", namespace, "--workspaces", str(tmp_path / "workspaces"),
        ],
        tmp_path / "server.log",
        _env(**model_env),
    )  # fmt: skip
    running: Process | None = None
    try:

        def started() -> dict[str, str] | None:
            if not server.alive():
                raise AssertionError(f"loopd server exited:\n{server.output()}")
            try:
                info = json.loads((data_dir / "server.json").read_text())
            except (OSError, ValueError):
                return None
            return info if info.get("pid") == server.process.pid else None

        info = wait_until(started, timeout=60, what="loopd server to write server.json")
        url, admin = str(info["url"]), Path(info["token_file"]).read_text().strip()
        made = subprocess.run(
            [LOOPD, "token", "create", f"operator:{operator}", "--server", url],
            capture_output=True,
            text=True,
            timeout=60,
            env=_env(LOOPD_TOKEN=admin),
            check=False,
        )
        assert made.returncode == 0, made.stderr
        token = made.stdout.strip().splitlines()[-1].strip()
        running = _spawn(
            [
                LOOPD, "--log-level", "info", "operator", operator, "--server", url, "--kubeconfig",
                str(operator_config), "--namespace", namespace, "--lease-duration", "5",
            ],
            tmp_path / f"{operator}.log",
            _env(LOOPD_TOKEN=token),
        )  # fmt: skip
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin}"}, timeout=30) as client:

            def registered() -> bool:
                assert running is not None
                if not running.alive():
                    raise AssertionError(f"loopd operator {operator} exited:\n{running.output()}")
                actors = client.get("/v1/actors").json()["data"]
                return any(a["kind"] == "operator" and a["key"] == operator for a in actors)

            wait_until(registered, timeout=60, what=f"operator:{operator} to register with loopd server")
        yield Deployed(url, admin, namespace)
    finally:
        if running is not None:
            running.stop()
        server.stop()


@pytest.fixture
def server_and_router(
    kube_cluster: KubeCluster, loopd_crds: list[str], postgres_dsn: str, tmp_path: Path
) -> Iterator[tuple[str, str, str]]:
    """(server URL, admin token, namespace): `loopd server` on the cluster + PostgreSQL, and a Router beside it."""
    with router_model(work_delay=1.5) as model:  # the Task stays open long enough to be seen on the cluster
        env = {"LOOPD_MODEL": "gpt-4o-mini", "OPENAI_BASE_URL": model.base_url, "OPENAI_API_KEY": API_KEY}
        with deployed(kube_cluster, postgres_dsn, tmp_path, "router", env) as found:
            yield found.url, found.admin, found.namespace


def test_a_router_question_is_answered_by_separate_processes_over_the_real_api_server(
    kube_cluster: KubeCluster, server_and_router: tuple[str, str, str]
) -> None:
    url, admin, namespace = server_and_router
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin}"}, timeout=30) as client:
        asked = ask(client, QUESTION)

        def listed() -> bool:
            found = kube_cluster.kubectl("get", "tasks.loopd.dev", "-n", namespace, "-o", "json", check=True)
            return asked.task_id in [item["metadata"]["name"] for item in json.loads(found.stdout)["items"]]

        # The Task is a real custom resource on the real API server while the Router works on it.
        wait_until(listed, timeout=30, what=f"Task {asked.task_id} in `kubectl get tasks -n {namespace}`")
        message = wait_answer(client, asked, timeout=120)
        assert message["status"] == "completed", message
        text = answer_text(message)
        for name in ("Liu Bei", "Guan Yu", "Zhang Fei"):
            assert name in text, text
        work = work_messages(client, asked.task_id)
        assert len(work) >= 4, work  # the plan and the three parallel calls, shown in the work conversation
    status = kube_cluster.request("GET", f"/apis/loopd.dev/v1alpha1/namespaces/{namespace}/tasks/{asked.task_id}")
    # Completed Tasks are collected; one still present must say it finished.
    if status[0] == 200:
        conditions = {c["type"]: c["status"] for c in status[1].get("status", {}).get("conditions", [])}
        assert conditions, status[1]
    else:
        assert status[0] == 404, status


def test_a_longhorizon_question_runs_its_run_on_the_real_api_server(
    kube_cluster: KubeCluster, loopd_crds: list[str], postgres_dsn: str, tmp_path: Path
) -> None:
    """`loopd server` (its demo model knows LongHorizon's roles) and `loopd operator longhorizon`: the Run, its
    Execution and its Audit are custom resources on the real API server, and the Run ends Succeeded."""
    with (
        deployed(kube_cluster, postgres_dsn, tmp_path, "longhorizon", {"LOOPD_MODEL": "demo"}) as found,
        httpx.Client(base_url=found.url, headers={"Authorization": f"Bearer {found.admin}"}, timeout=30) as client,
    ):
        asked = ask(client, "Create hello.txt containing hello world", target="operator:longhorizon")
        message = wait_answer(client, asked, timeout=180)
        assert message["status"] == "completed", message
        got = kube_cluster.kubectl("get", "runs,executions,audits", "-n", found.namespace, "-o", "json")
        items = json.loads(got.stdout)["items"]
        runs = [i for i in items if i["kind"] == "Run"]
        assert [r["metadata"]["name"] for r in runs] == [asked.task_id], items
        assert runs[0]["status"]["phase"] == "Succeeded", runs[0]["status"]
        kinds = sorted(i["kind"] for i in items)
        assert kinds.count("Execution") >= 1 and kinds.count("Audit") >= 1, kinds
        # kubectl's printer columns come from the CRDs the chart installs
        table = kube_cluster.kubectl("get", "runs", "-n", found.namespace).stdout
        assert "Succeeded" in table and asked.task_id in table, table
