"""The registry of loop-server: operators and harnesses under a stable key with a lease, and the picker's list.

Public face: `RegistryService`, `ActorInfo` (also the type of the server's built-in targets) and
`registry_router`.
"""

from loopd.server.registry._routes import registry_router
from loopd.server.registry._service import ActorInfo, ActorKind, RegistryService

__all__ = ["ActorInfo", "ActorKind", "RegistryService", "registry_router"]
