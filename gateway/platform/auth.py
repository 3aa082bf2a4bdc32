"""API keys from the configuration, and short-lived client secrets that open one Realtime session."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.platform.redis_state import SecretRecord
from gateway.protocol.errors import ApiError

if TYPE_CHECKING:
    from gateway.platform.redis_state import RedisState
    from gateway.platform.storage.durable_state import DurableState
    from gateway.platform.storage.schema import ClientSecretRow

EPHEMERAL_PREFIX = "ek_"
MINTED_SESSION_ID = "id"  # kept in a secret's stored session configuration, taken out at look-up
# Browsers cannot set headers on a WebSocket; OpenAI's clients pass the key as a subprotocol.
WS_KEY_SUBPROTOCOL = "openai-insecure-api-key."


@dataclass(frozen=True)
class Principal:
    """Who is calling: an API key (by a short, non-secret id) or an ephemeral secret."""

    key_id: str
    ephemeral_session: dict[str, Any] | None = None
    ephemeral_session_id: str | None = None  # the session id minted with the secret
    secret: str | None = None  # the client secret it came with, spent when its session opens (`spend`)


@dataclass
class _ClientSecret:
    session: dict[str, Any]
    expires_at: float
    owner: str


@dataclass
class Authenticator:
    api_keys: list[str]
    max_secrets_per_key: int  # outstanding (minted, neither used nor expired) client secrets
    _secrets: dict[str, _ClientSecret] = field(default_factory=dict)  # by the secret's SHA-256
    journal: DurableState | None = None  # writes the secrets behind us, so that they survive a restart
    shared: RedisState | None = None  # --redis-url: the secrets live there, single use across replicas

    def restore(self, rows: list[ClientSecretRow]) -> None:
        for row in rows:
            self._secrets[row.digest] = _ClientSecret(session=row.session, expires_at=row.expires_at, owner=row.owner)

    @property
    def enabled(self) -> bool:
        return bool(self.api_keys)

    async def authenticate(self, token: str | None, *, allow_ephemeral: bool = False) -> Principal:
        """Check a bearer token. With no keys configured every caller is anonymous and allowed."""
        if token and allow_ephemeral and token.startswith(EPHEMERAL_PREFIX):
            return await self._look_up(token)
        if not self.enabled:
            return Principal("anonymous")
        if not token:
            raise _unauthorized("Missing API key: send 'Authorization: Bearer <key>'.")
        for key in self.api_keys:
            if hmac.compare_digest(token.encode(), key.encode()):
                return Principal(key_id=f"key_{hash_prefix(key)}")
        raise _unauthorized("Incorrect API key provided.")

    async def mint(self, owner: Principal, session: dict[str, Any], ttl_s: float) -> tuple[str, float]:
        value = EPHEMERAL_PREFIX + secrets.token_urlsafe(24)
        now = time.time()
        expires_at = now + ttl_s
        if self.shared is not None:
            earliest = await self.shared.mint_secret(secret_digest(value), SecretRecord(owner.key_id, session, expires_at),
                                                     now, self.max_secrets_per_key)
            if earliest is not None:
                raise self._too_many(self.max_secrets_per_key, earliest)
            return value, expires_at
        self._forget_expired()
        outstanding = [secret.expires_at for secret in self._secrets.values() if secret.owner == owner.key_id]
        if len(outstanding) >= self.max_secrets_per_key:
            raise self._too_many(len(outstanding), min(outstanding))
        self._secrets[secret_digest(value)] = _ClientSecret(session=session, expires_at=expires_at, owner=owner.key_id)
        if self.journal is not None:
            self.journal.secret_minted(secret_digest(value), owner.key_id, session, expires_at)
        return value, expires_at

    @staticmethod
    def _too_many(count: int, earliest_expiry: float) -> ApiError:
        return ApiError(
            "too_many_client_secrets",
            f"This key has {count} unused client secrets, its maximum; retry when one is used or expires.",
            type="rate_limit_error",
            status=429,
            retry_after_s=earliest_expiry - time.time(),
        )

    async def spend(self, principal: Principal) -> None:
        """A client secret opens exactly one session: it is spent when that session opens, not before,
        so that a request that fails (a bad SDP offer, a full gateway) leaves it usable."""
        if principal.secret is None:
            return
        if self.shared is not None:
            if await self.shared.take_secret(secret_digest(principal.secret)) is None:
                raise _unauthorized("The client secret was used by another request meanwhile.")
            return
        if self._secrets.pop(secret_digest(principal.secret), None) is None:
            raise _unauthorized("The client secret was used by another request meanwhile.")
        if self.journal is not None:
            self.journal.secret_spent(secret_digest(principal.secret))

    async def _look_up(self, token: str) -> Principal:
        if self.shared is not None:
            secret: _ClientSecret | SecretRecord | None = await self.shared.get_secret(secret_digest(token))
        else:
            self._forget_expired()
            secret = self._secrets.get(secret_digest(token))
        if secret is None:
            raise _unauthorized("The client secret is unknown, expired or already used.")
        session = dict(secret.session)
        # The id announced when the secret was minted is the session's, not a field a client may set.
        session_id = session.pop(MINTED_SESSION_ID, None)
        return Principal(key_id=secret.owner, ephemeral_session=session, secret=token, ephemeral_session_id=session_id)

    def _forget_expired(self) -> None:
        now = time.time()
        for value in [value for value, secret in self._secrets.items() if secret.expires_at <= now]:
            del self._secrets[value]


def secret_digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def hash_prefix(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:8]


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def token_from_subprotocols(subprotocols: list[str]) -> str | None:
    for protocol in subprotocols:
        if protocol.startswith(WS_KEY_SUBPROTOCOL):
            return protocol[len(WS_KEY_SUBPROTOCOL) :]
    return None


def _unauthorized(message: str) -> ApiError:
    return ApiError("invalid_api_key", message, status=401)
