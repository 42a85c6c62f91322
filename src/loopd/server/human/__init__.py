"""Human Ask / Confirm for loop-server: questions from responders, replies from the asking user, deadlines.

Public face: `HumanService`, its records `Question` / `ReplyResult`, and `human_router`.
"""

from loopd.server.human._routes import human_router
from loopd.server.human._service import DEFAULT_MAX_TIMEOUT, HumanService, Question, ReplyResult

__all__ = ["DEFAULT_MAX_TIMEOUT", "HumanService", "Question", "ReplyResult", "human_router"]
