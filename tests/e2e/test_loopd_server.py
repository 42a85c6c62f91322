"""`loopd server` as real processes: the loop-server alone, configured by a file.

- a chat answered by harness targets defined only in the configuration file (a built-in rig and a plain model),
  which `/v1/actors` lists instead of the default assistant; ``/healthz`` and ``/readyz`` answer without a token; a
  token the file names for ``operator:router`` (``auth.actor_tokens``) authenticates as it;
- a remote target (a `loopd harness serve` process with a token) named only in the configuration file answers;
- `loopd server` + `loopd operator router` as two processes over the server's embedded Kubernetes API: the Liu Bei
  question answered by the Router through the server's assistant;
- a second `loopd server` on the same data directory is refused in one line;
- two `loopd server --database postgresql://…` replicas on one throwaway PostgreSQL: a question asked on replica A
  is a Task that replica B's embedded Kubernetes API shows, and B's HTTP API streams the answer to its end.
"""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import ssl
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopd.harness.models import ScriptedServer, ServerReply
from tests.support.model_thread import scripted_model_thread
from tests.support.postgres import free_port, postgres_dsn, postgres_server
from tests.support.titles import is_title_request
from tests.support.waiting import wait_until

from .conftest import LOOPD, UpProcess, env_for, start_up
from .router_support import HEROES, QUESTION, answer_text, ask, start_router, wait_answer, wait_registered

__all__ = ["postgres_dsn", "postgres_server"]


def start_server(
    data_dir: Path,
    tmp_path: Path,
    name: str = "server",
    *,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> UpProcess:
    """``loopd server --port 0`` on ``data_dir`` (plus ``args``; ``env`` over `env_for`), once it serves."""
    return start_up(data_dir, tmp_path, name, args=args, env=env, command="server")


@pytest.fixture
def stopping() -> Iterator[list[UpProcess]]:
    """Servers to stop (SIGTERM, by pid) at the end of the test."""
    started: list[UpProcess] = []
    yield started
    for server in started:
        server.kill(signal.SIGTERM)


def _conversation_message(client: httpx.Client, conversation_id: str, message_id: str) -> dict[str, Any]:
    page = client.get(f"/v1/conversations/{conversation_id}/messages", params={"limit": 200})
    assert page.status_code == 200, page.text
    return next(m for m in page.json()["data"] if m["id"] == message_id)


def _embedded_task(server: UpProcess, task_id: str) -> httpx.Response:
    """GET the Task from ``server``'s embedded Kubernetes API with its admin token."""
    endpoint = (server.data_dir / "resources-api" / "endpoint").read_text().strip()
    trust = ssl.create_default_context(cafile=str(server.data_dir / "resources-api" / "ca.crt"))
    headers = {"Authorization": f"Bearer {server.token}"}
    with httpx.Client(base_url=endpoint, headers=headers, verify=trust, timeout=10.0) as api:
        return api.get(f"/apis/loopd.dev/v1alpha1/namespaces/default/tasks/{task_id}")


ROUTER_TOKEN = "r" * 48
CONFIG = """\
kubernetes:
  api: embedded
auth:
  actor_tokens:
    - {actor: "operator:router", token_env: LOOPD_TEST_ROUTER_TOKEN}
harnesses:
  - key: scribe
    kind: builtin
    title: Scribe
    model: {name: demo}
    tools: [read_file, list_dir]
  - key: plain
    kind: model
    title: Plain model
    model: {name: gpt-4o-mini, base_url: "BASE_URL"}
    system_prompt: Answer in one line.
"""


def test_a_chat_is_answered_by_harness_targets_defined_only_in_the_config_file(
    tmp_path: Path, stopping: list[UpProcess]
) -> None:
    model = ScriptedServer(lambda request: ServerReply(text=f"plain answer to: {request.last_user_text}"))
    with scripted_model_thread(model, name="plain-model") as base_url:
        config = tmp_path / "loopd.yaml"
        config.write_text(CONFIG.replace("BASE_URL", base_url))
        server = start_server(
            tmp_path / "data", tmp_path, args=["--config", str(config)], env={"LOOPD_TEST_ROUTER_TOKEN": ROUTER_TOKEN}
        )
        stopping.append(server)
        assert httpx.get(server.url + "/healthz", timeout=10).json() == {"ok": True}
        assert httpx.get(server.url + "/readyz", timeout=10).status_code == 200
        me = httpx.get(server.url + "/v1/me", headers={"Authorization": f"Bearer {ROUTER_TOKEN}"}, timeout=10)
        assert me.json() == {"kind": "operator", "key": "router", "trusted": True}  # the Secret's token is adopted
        with server.client() as client:
            actors = {(a["kind"], a["key"]): a for a in client.get("/v1/actors").json()["data"]}
            assert set(actors) == {("harness", "scribe"), ("harness", "plain")}, actors  # no default assistant
            assert actors["harness", "plain"]["display_name"] == "Plain model"

            asked = ask(client, "hello from the config file", target="harness:scribe")
            message = wait_answer(client, asked, timeout=45)
            assert message["status"] == "completed", (message, server.log.read_text())
            assert answer_text(message).strip(), message

            asked = ask(client, "what is two plus two", target="harness:plain")
            message = wait_answer(client, asked, timeout=45)
            assert message["status"] == "completed", (message, server.log.read_text())
            assert answer_text(message) == "plain answer to: what is two plus two"
        # The plain model was asked with the configured system prompt.
        assert any(
            m.get("role") == "system" and m.get("content") == "Answer in one line."
            for request in model.requests
            for m in request.messages
        ), model.requests


def test_a_remote_harness_named_in_the_config_file_answers(tmp_path: Path, stopping: list[UpProcess]) -> None:
    port, token = free_port(), "p" * 40
    peer_log = tmp_path / "peer.log"
    command = [LOOPD, "harness", "serve", "--port", str(port), "--workspace", str(tmp_path / "peer-ws")]
    with open(peer_log, "wb") as out:
        peer = subprocess.Popen(
            [*command, "--data-dir", str(tmp_path / "peer-data"), "--sandbox", "none"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**env_for(tmp_path / "peer-home"), "LOOPD_HARNESS_TOKEN": token},
        )
    try:
        peer_url = f"http://127.0.0.1:{port}"

        def peer_up() -> bool:
            if peer.poll() is not None:
                raise AssertionError(f"loopd harness serve exited:\n{peer_log.read_text()}")
            try:
                return httpx.get(peer_url + "/healthz", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(peer_up, timeout=60, what="loopd harness serve to answer")
        config = tmp_path / "remote.yaml"
        config.write_text(
            "auth:\n  actor_tokens:\n    - {actor: 'operator:other', token_env: LOOPD_TEST_OTHER_TOKEN}\n"
            "harnesses:\n"
            f"  - {{key: peer, kind: remote, title: Peer, url: '{peer_url}', token_env: LOOPD_TEST_PEER_TOKEN}}\n"
        )
        other_token = "o" * 48
        server = start_server(
            tmp_path / "data",
            tmp_path,
            args=["--config", str(config)],
            env={"LOOPD_TEST_PEER_TOKEN": token, "LOOPD_TEST_OTHER_TOKEN": other_token},
        )
        stopping.append(server)
        with server.client() as client:
            actors = client.get("/v1/actors").json()["data"]
            assert [(a["kind"], a["key"], a["display_name"]) for a in actors] == [("harness", "peer", "Peer")]
            asked = ask(client, "hello remote peer", target="harness:peer")
            message = wait_answer(client, asked, timeout=45)
            assert message["status"] == "completed", (message, server.log.read_text(), peer_log.read_text())
            assert "hello remote peer" in answer_text(message)  # the demo model behind the peer echoes it
            # The peer's model call is in this server's ledger with its full request and reply, for the asker only.
            tree = client.get("/v1/ledger/tree", params={"task_id": asked.task_id})
            assert tree.status_code == 200, tree.text
            attempts = [
                attempt
                for lane in tree.json()["lanes"]
                for turn in lane["turns"]
                for action in turn["actions"]
                for attempt in action["attempts"]
                if attempt["request"]
            ]
            assert attempts, tree.json()
            query = {"task_id": asked.task_id, "attempt_id": attempts[0]["id"]}
            full = client.get("/v1/ledger/attempt", params=query)
            assert full.status_code == 200, full.text
            assert "hello remote peer" in full.json()["request"]["messages"][-1]["content"]
            assert "hello remote peer" in full.json()["reply"]["text"]
            assert token not in full.text  # the peer's token never reaches the ledger
        other = httpx.get(
            server.url + "/v1/ledger/attempt",
            params=query,
            headers={"Authorization": f"Bearer {other_token}"},
            timeout=10,
        )
        assert other.status_code in (403, 404), other.text
        assert httpx.get(server.url + "/v1/ledger/attempt", params=query, timeout=10).status_code == 401
        # The peer hands the records only to its token's holder.
        peer_auth = {"Authorization": f"Bearer {token}"}
        [session] = httpx.get(peer_url + "/v1/sessions", headers=peer_auth, timeout=10).json()["items"]
        session_calls = f"{peer_url}/v1/sessions/{session['id']}/model-calls"
        assert httpx.get(session_calls, timeout=10).status_code == 401
        assert httpx.get(session_calls, headers=peer_auth, timeout=10).json()["items"]
    finally:
        if peer.poll() is None:
            peer.send_signal(signal.SIGTERM)
        peer.wait(timeout=30)


def test_loopd_server_and_a_standalone_router_answer_through_the_embedded_api(
    tmp_path: Path, stopping: list[UpProcess]
) -> None:
    server = start_server(tmp_path / "data", tmp_path)
    stopping.append(server)
    router = start_router(server, tmp_path, args=["--metrics-port", "0"])
    try:
        with server.client() as client:
            wait_registered(client, router)
            asked = ask(client, QUESTION)
            message = wait_answer(client, asked, timeout=50)
            assert message["status"] == "completed", (message, router.output(), server.log.read_text())
            text = answer_text(message)
            assert all(hero in text for hero in HEROES), text
        wait_until(lambda: _embedded_task(server, asked.task_id).status_code == 404, what="the Task to be deleted")
        _check_operator_metrics(router.output())
    finally:
        router.kill(signal.SIGTERM)


def _check_operator_metrics(output: str) -> None:
    """``--metrics-port 0``: the Router printed where its metrics are — on loopback, with no flag saying so — and a
    scrape there shows its reconciles; no other interface of this machine answers on that port."""
    found = re.search(r"metrics: (http://([^/:]+):(\d+))/metrics", output)
    assert found is not None, output
    url, host, port = found.group(1), found.group(2), int(found.group(3))
    assert host == "127.0.0.1"
    scraped = httpx.get(url + "/metrics", timeout=10)
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain")
    counts = [line for line in scraped.text.splitlines() if line.startswith("loopd_reconcile_seconds_count")]
    assert any('component="router"' in line and float(line.rsplit(" ", 1)[1]) > 0 for line in counts), counts
    address = _outward_address()
    if address is not None:  # a machine without another interface has nothing more to check
        with pytest.raises(OSError), socket.create_connection((address, port), timeout=5):
            pass


def _outward_address() -> str | None:
    """This machine's address on its default route (a UDP socket's local end; nothing is sent), unless loopback."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("10.255.255.255", 1))
        address = str(probe.getsockname()[0])
        return None if address.startswith("127.") else address
    return None


def test_a_second_server_on_the_same_data_directory_is_refused(tmp_path: Path, stopping: list[UpProcess]) -> None:
    server = start_server(tmp_path / "data", tmp_path)
    stopping.append(server)
    done = subprocess.run(
        [LOOPD, "server", "--data-dir", str(server.data_dir), "--port", "0"],
        env=env_for(server.data_dir),
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    lines = [line for line in done.stderr.decode().splitlines() if line.strip()]
    assert done.returncode == 1 and len(lines) == 1, done.stderr.decode()
    assert "loopd server" in lines[0] and "Traceback" not in lines[0], lines


@pytest.mark.postgres
def test_two_servers_on_one_postgresql_share_a_task(
    tmp_path: Path, postgres_dsn: str, stopping: list[UpProcess]
) -> None:
    # The model answers slowly, so the Task still exists while replica B is asked about it.
    model = ScriptedServer(lambda request: ServerReply(text="the shared answer", delay=3.0))
    with scripted_model_thread(model, name="slow-model") as base_url:
        config = tmp_path / "replicas.yaml"
        config.write_text(
            "kubernetes: {api: embedded}\n"
            "harnesses:\n"
            f"  - {{key: slow, kind: model, model: {{name: gpt-4o-mini, base_url: '{base_url}'}}}}\n"
        )
        env = {"LOOPD_DATABASE_URL": postgres_dsn, "LOOPD_CONFIG": str(config)}
        a = start_server(tmp_path / "a", tmp_path, "replica-a", env=env)
        stopping.append(a)
        b = start_server(tmp_path / "b", tmp_path, "replica-b", env=env)
        stopping.append(b)
        assert not (tmp_path / "a" / "resources.db").exists()  # the embedded store lives in PostgreSQL
        with a.client() as on_a, b.client() as on_b:
            asked = ask(on_a, "shared between replicas", target="harness:slow")
            seen = _embedded_task(b, asked.task_id)  # replica B's embedded API serves the same store
            assert seen.status_code == 200, seen.text
            assert seen.json()["spec"]["target"] == {"kind": "harness", "key": "slow"}
            message = wait_answer(on_b, asked, timeout=45)  # read through replica B
            assert message["status"] == "completed", (message, a.log.read_text(), b.log.read_text())
            assert answer_text(message) == "the shared answer"
            assert _conversation_message(on_a, asked.conversation_id, asked.response_id)["status"] == "completed"
        wait_until(lambda: _embedded_task(a, asked.task_id).status_code == 404, what="the Task to be deleted")
        # Answered once, by one of the replicas (the conversation's title is a model call of its own).
        answers = [r for r in model.requests if not is_title_request(r)]
        assert len(answers) == 1, model.requests
