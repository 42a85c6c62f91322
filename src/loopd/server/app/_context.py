"""`ServerContext`: everything one loop-server process serves from, built by the composition root.

Must not do: build anything (``loopd.server._composition`` does).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from loopd.server.chat import ChatRequests, ConversationReader, TaskApi
from loopd.server.http import ServerSecurity
from loopd.server.human import HumanService
from loopd.server.registry import RegistryService
from loopd.server.storage import Database
from loopd.server.streams import ConversationBus


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class ServerContext:
    db: Database
    bus: ConversationBus
    security: ServerSecurity
    conversations: ConversationReader
    chat: ChatRequests
    task_api: TaskApi
    human: HumanService
    registry: RegistryService
    clock: Callable[[], datetime] = field(default=_utc_now)
