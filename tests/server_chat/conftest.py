"""Fixtures: a loop-server rig (database + in-memory Task API + app) per test."""

from __future__ import annotations

from tests.server_http.support import backend_fixture, clock, postgres_server, rig, shared_postgres_dsn

backend = backend_fixture("sqlite", "postgres")

__all__ = ["backend", "clock", "postgres_server", "rig", "shared_postgres_dsn"]
