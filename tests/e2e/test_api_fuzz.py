"""OpenAPI-driven fuzzing of the running `loopd up` API (schemathesis): bounded, loopback only, never a 5xx."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from .conftest import UpProcess, start_up

MAX_EXAMPLES = 30
PARTS = 3  # the operations are fuzzed in this many tests over one server, each well inside the per-test timeout


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    root = Path(tmp_path_factory.mktemp("fuzz"))
    running = start_up(root / "data", root, "fuzz")
    try:
        yield running
    finally:
        running.kill(signal.SIGTERM)


def _check(case: schemathesis.Case, server: UpProcess, seen: dict[int, int]) -> None:
    headers = {"Authorization": f"Bearer {server.token}", "Accept": "application/json"}
    response = case.call(headers=headers, timeout=15)
    where = f"{case.method} {case.formatted_path}"
    seen[response.status_code] = seen.get(response.status_code, 0) + 1
    assert response.status_code < 500, f"{where} -> {response.status_code}: {response.text}"
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == {"error"} and {"type", "message"} <= set(body["error"]), (where, body)


@pytest.mark.parametrize("part", range(PARTS))
def test_no_request_gets_a_server_error(fuzz_server: UpProcess, part: int) -> None:
    schema = schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json")
    listed = [result.ok() for result in schema.get_all_operations()]
    # Streams never end by themselves; their framing is tested directly elsewhere.
    fuzzed = [operation for operation in listed if not operation.path.endswith("/stream")]
    assert len(fuzzed) >= 20, "the API document lists the routes"
    operations = 0
    seen: dict[int, int] = {}
    for operation in fuzzed[part::PARTS]:
        operations += 1

        @given(case=operation.as_strategy())
        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def fuzz(case: schemathesis.Case) -> None:
            _check(case, fuzz_server, seen)

        fuzz()
    print(f"part {part}: {operations} operations, responses by status: {dict(sorted(seen.items()))}")
    assert sum(seen.values()) >= operations * 5, seen
    assert any(200 <= status < 300 for status in seen) and any(400 <= status < 500 for status in seen), seen
