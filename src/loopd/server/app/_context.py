"""`ServerContext`: everything one loop-server process serves from, built by the composition root.

Must not do: build anything (``loopd.server._composition`` does).
"""

from __future__ import annotations

from dataclasses import dataclass

from loopd._infra.clock import Clock
from loopd._infra.metrics import Metrics
from loopd.server.chat import ChatRequests, ConversationReader, TaskApi
from loopd.server.http import ServerSecurity
from loopd.server.human import HumanService
from loopd.server.registry import RegistryService
from loopd.server.storage import Database
from loopd.server.streams import ConversationBus


@dataclass(frozen=True)
class ServerContext:
    """The services one loop-server serves from; ``clock`` is the database's, the one they all run on."""

    db: Database
    bus: ConversationBus
    security: ServerSecurity
    conversations: ConversationReader
    chat: ChatRequests
    task_api: TaskApi
    human: HumanService
    registry: RegistryService
    metrics: Metrics | None = None
    """This server's Prometheus instruments (served at ``/metrics``); None serves no metrics."""

    @property
    def clock(self) -> Clock:
        """The process's one clock: the database's (the composition root gives the same one to the engine, the
        bus and reconcile), so stamps, deadlines and the sweepers' intervals never disagree."""
        return self.db.clock
