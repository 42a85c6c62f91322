"""How harness errors are answered over HTTP: `from_harness`, the transport's translation to the error envelope.

The envelope itself (`ApiError`, its types and statuses) is the floor's (``loopd._infra.http_errors``); this
transport answers with these types:

    type                    status  when
    invalid_request         400     malformed JSON, wrong types, bad query/header values (also 405); a mode,
                                    model or loop the rig does not declare; a fork at a
                                    seq past the session's end or inside a turn (the message names the last
                                    settled seq before it); a fork's workspace that cannot be restored as
                                    asked (no snapshots, none at the seq, ``new`` on a directory with files),
                                    a session id that cannot name its own workspace directory
    cursor_ahead            400     a resume cursor (``Last-Event-ID``, ``from_seq``) past the last stored event:
                                    the client holds a cursor of another session or server; start again
    unauthorized            401     missing or wrong bearer token (with ``WWW-Authenticate: Bearer``)
    forbidden               403     a tokenless server asked for by a non-loopback ``Host``
    not_found               404     unknown route, session, open gate or queued input
    conflict                409     an Idempotency-Key reused with another body; an input that already ran; a
                                    fork's session id that is taken
    payload_too_large       413     the body is larger than the configured cap
    unsupported_media_type  415     a write whose body is not JSON
    too_many_requests       429     back-pressure: a full mailbox, a busy writer, the live-session cap
    service_unavailable     503     a faulted or closed session, a journal that cannot be read
    internal_error          500     a bug (never for bad input)

Must not do: decide *whether* something is an error (routes and the registry do that).
"""

from __future__ import annotations

from loopd._infra.http_errors import ApiError
from loopd.harness._errors import (
    ForkPointError,
    ForkWorkspaceError,
    HarnessError,
    JournalError,
    MailboxFullError,
    ModelError,
    SessionBusyError,
    SessionClosedError,
    SessionFaultError,
    SessionNotFoundError,
    SubscriptionLostError,
    UnknownSettingError,
)
from loopd.harness.standard import WorkspaceLocationError


def from_harness(exc: HarnessError) -> ApiError:
    """Translate a harness error raised under a route (the most specific class first)."""
    message = str(exc)
    match exc:
        case SessionNotFoundError():
            return ApiError("not_found", message)
        case ForkPointError() | ForkWorkspaceError() | WorkspaceLocationError():
            return ApiError("invalid_request", message)
        case MailboxFullError():
            return ApiError("too_many_requests", f"{message}; retry shortly", headers={"Retry-After": "1"})
        case SessionBusyError():
            return ApiError("too_many_requests", message, headers={"Retry-After": "1"})
        case SessionFaultError():
            return ApiError("service_unavailable", f"{message}; POST .../restore to bring the session back")
        case SessionClosedError():
            return ApiError("service_unavailable", message)
        case UnknownSettingError():
            return ApiError("invalid_request", message)
        case SubscriptionLostError() | JournalError() | ModelError():
            return ApiError("service_unavailable", message)
        case _:
            # The session refused the command for a reason of its own (e.g. a rig that lacks a loop).
            return ApiError("conflict", message)
