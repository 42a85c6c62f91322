"""The ledger over HTTP: what agents did for a task, a conversation or a harness call, with cost roll-ups.

`ledger_router(ledger, tasks=..., conversations=...)`: ``GET /v1/ledger`` (lanes, events, unresolved attempts,
usage) and ``GET /v1/ledger/usage``. A user sees the trail of their own conversations and tasks; token callers see all.
"""

from loopd.server.audit._routes import ledger_router

__all__ = ["ledger_router"]
