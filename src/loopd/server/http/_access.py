"""Credentials the server issues and keeps: actor tokens, browser cookies for remote peers, one-time sign-in codes.

* **Actor tokens** bind one ``operator:<key>`` or ``harness:<key>`` identity; the admin creates them
  (``loopd token create``). A caller presenting one is that actor and nothing else.
* **Browser cookies** issued through a sign-in link are recorded; a browser on another machine is signed in only
  by a recorded cookie. (Cookies minted automatically for a loopback browser are not recorded: they count only on
  loopback.)
* **Sign-in codes** are single-use and expire after ``signin_ttl`` seconds; redeeming one records a new cookie in
  the same transaction, so two redemptions of one code cannot both succeed.

Only SHA-256 digests of secrets are stored (migration 4's tables), so a copy of the database signs nobody in, and
a secret is found by its digest: how long a lookup takes says nothing about the secret. A token found valid is
remembered (by digest) for ``token_cache_seconds`` (2 s), so an operator's burst of requests reads the table once;
a revocation on this server forgets them at once, one on another replica within that time.
Must not do: decide who may call what (the security middleware and the routes do).
"""

from __future__ import annotations

import hashlib
import secrets
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final, Literal

from loopd._infra.clock import Clock, SystemClock
from loopd.server.http._identity import Identity
from loopd.server.storage import Database, InvalidRecord

DEFAULT_SIGNIN_TTL: Final = 600.0
MAX_SIGNIN_TTL: Final = 24 * 3600.0
CookieIssuer = Literal["signin"]


def secret_digest(secret: str) -> str:
    """The stored form of a secret: SHA-256, hex."""
    return hashlib.sha256(secret.encode()).hexdigest()


def _time_text(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


TOKEN_CACHE_SECONDS: Final = 2.0
"""How long a token found valid is trusted without reading the table again (revocations elsewhere wait this long)."""
TOKEN_CACHE_SIZE: Final = 1024
"""Tokens remembered at most (the least recently used is forgotten first)."""
MIN_ADOPTED_TOKEN: Final = 32
"""Characters an adopted token (`AccessStore.adopt_token`) has at least."""


@dataclass(frozen=True)
class SigninCode:
    code: str
    expires_at: datetime


class AccessStore:
    """The server's issued credentials, in its database."""

    def __init__(
        self,
        db: Database,
        *,
        signin_ttl: float = DEFAULT_SIGNIN_TTL,
        token_cache_seconds: float = TOKEN_CACHE_SECONDS,
        clock: Clock | None = None,
    ) -> None:
        if not (0 < signin_ttl <= MAX_SIGNIN_TTL):
            raise ValueError(f"signin_ttl must be positive and at most {MAX_SIGNIN_TTL:.0f} seconds")
        if token_cache_seconds < 0:
            raise ValueError("token_cache_seconds must not be negative")
        self._db = db
        self._ttl = timedelta(seconds=signin_ttl)
        self._cache_seconds = token_cache_seconds
        self._clock = clock or SystemClock()
        self._known: OrderedDict[str, tuple[float, Identity]] = OrderedDict()
        """Token digest → (monotonic time it was read, its actor): valid tokens read recently."""
        self._revocations = 0
        """Bumped when a revocation starts and when it ends: a lookup that overlapped one is not remembered."""

    # -- actor tokens --------------------------------------------------------------------------------------

    async def create_token(self, actor: Identity) -> str:
        """A new token that authenticates as ``actor`` (an operator or a harness); only its digest is kept."""
        if actor.kind == "user":
            raise InvalidRecord("actor tokens are for operator:<key> or harness:<key>; users sign in with a link")
        token = secrets.token_urlsafe(32)
        async with self._db.transaction() as tx:
            await tx.execute(
                "INSERT INTO access_tokens (token_hash, actor_kind, actor_key, created_at) VALUES (?, ?, ?, ?)",
                (secret_digest(token), actor.kind, actor.key, _time_text(tx.now())),
            )
        return token

    async def adopt_token(self, actor: Identity, token: str) -> None:
        """Accept ``token``, made elsewhere (e.g. a Kubernetes Secret shared with an operator), as ``actor``'s own;
        only its digest is kept. Idempotent (replicas starting together may all adopt it). `InvalidRecord` for a
        user, a token shorter than `MIN_ADOPTED_TOKEN` characters, or one already bound to another actor."""
        if actor.kind == "user":
            raise InvalidRecord("actor tokens are for operator:<key> or harness:<key>; users sign in with a link")
        if len(token.strip()) < MIN_ADOPTED_TOKEN or token != token.strip():
            raise InvalidRecord(f"a token for {actor.text} needs at least {MIN_ADOPTED_TOKEN} characters, no spaces")
        digest = secret_digest(token)
        async with self._db.transaction() as tx:
            await tx.execute(
                "INSERT INTO access_tokens (token_hash, actor_kind, actor_key, created_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (token_hash) DO NOTHING",
                (digest, actor.kind, actor.key, _time_text(tx.now())),
            )
            row = await tx.fetch_one("SELECT actor_kind, actor_key FROM access_tokens WHERE token_hash = ?", (digest,))
        if row is None or (row[0], row[1]) != (actor.kind, actor.key):
            raise InvalidRecord(f"this token already authenticates another actor than {actor.text}")

    async def revoke_tokens(self, actor: Identity) -> int:
        """Forget every token of ``actor``; returns how many there were."""
        self._revocations += 1  # before and after: a lookup racing the delete must not keep the old answer
        self._known.clear()
        try:
            async with self._db.transaction() as tx:
                return await tx.execute(
                    "DELETE FROM access_tokens WHERE actor_kind = ? AND actor_key = ?", (actor.kind, actor.key)
                )
        finally:
            self._revocations += 1
            self._known.clear()

    async def token_actor(self, token: str) -> Identity | None:
        """The actor ``token`` authenticates (trusted), or None. A valid token is remembered briefly (see above);
        an unknown one is read every time (nothing to gain from remembering a guess)."""
        digest = secret_digest(token)
        now = self._clock.monotonic()
        known = self._known.get(digest)
        if known is not None and now - known[0] < self._cache_seconds:
            self._known.move_to_end(digest)
            return known[1]
        revocations = self._revocations
        async with self._db.transaction(read_only=True) as tx:
            row = await tx.fetch_one("SELECT actor_kind, actor_key FROM access_tokens WHERE token_hash = ?", (digest,))
        if row is None:
            self._known.pop(digest, None)
            return None
        identity = Identity(row[0], row[1], trusted=True)
        if self._cache_seconds > 0 and revocations == self._revocations:
            self._known[digest] = (now, identity)
            self._known.move_to_end(digest)
            while len(self._known) > TOKEN_CACHE_SIZE:
                self._known.popitem(last=False)
        return identity

    # -- browser cookies -----------------------------------------------------------------------------------

    async def cookie_issued(self, cookie: str) -> bool:
        """Whether this server issued ``cookie`` through a sign-in link."""
        async with self._db.transaction(read_only=True) as tx:
            row = await tx.fetch_one("SELECT 1 FROM browser_cookies WHERE cookie_hash = ?", (secret_digest(cookie),))
        return row is not None

    # -- sign-in codes -------------------------------------------------------------------------------------

    async def create_signin_code(self) -> SigninCode:
        """A new one-time code, valid for ``signin_ttl`` seconds (expired codes are dropped here)."""
        code = secrets.token_urlsafe(32)
        async with self._db.transaction() as tx:
            now = tx.now()
            expires_at = now + self._ttl
            await tx.execute("DELETE FROM signin_codes WHERE expires_at <= ?", (_time_text(now),))
            await tx.execute(
                "INSERT INTO signin_codes (code_hash, created_at, expires_at) VALUES (?, ?, ?)",
                (secret_digest(code), _time_text(now), _time_text(expires_at)),
            )
        return SigninCode(code, expires_at)

    async def redeem_signin_code(self, code: str, cookie: str) -> bool:
        """Use ``code`` once: when it is known, unused and unexpired, record ``cookie`` as issued and return True.

        The check and the use are one conditional UPDATE, so of two concurrent redemptions exactly one wins.
        """
        async with self._db.transaction() as tx:
            now = _time_text(tx.now())
            used = await tx.execute(
                "UPDATE signin_codes SET used_at = ? WHERE code_hash = ? AND used_at IS NULL AND expires_at > ?",
                (now, secret_digest(code), now),
            )
            if used != 1:
                return False
            await tx.execute(
                "INSERT INTO browser_cookies (cookie_hash, issued_by, created_at) VALUES (?, ?, ?)",
                (secret_digest(cookie), "signin", now),
            )
        return True
