"""Fixtures: the loop-server rig of tests/server_http (SQLite and PostgreSQL) for the fork routes."""

from __future__ import annotations

from tests.server_http.support import backend_fixture, clock, postgres_server, rig, shared_postgres_dsn

backend = backend_fixture("sqlite", "postgres")

__all__ = ["backend", "clock", "postgres_server", "rig", "shared_postgres_dsn"]
