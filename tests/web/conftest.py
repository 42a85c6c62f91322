"""Fixtures of the web UI suite: the in-process loop-server rig (serving tests) — the browser tests start their own
`loopd up` and Debian's chromium once per module (tests/web/browser.py)."""

from __future__ import annotations

from tests.server_http.support import backend_fixture, clock, postgres_server, rig, shared_postgres_dsn

backend = backend_fixture("sqlite")

__all__ = ["backend", "clock", "postgres_server", "rig", "shared_postgres_dsn"]
