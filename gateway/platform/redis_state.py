"""What several gateway replicas must share, in Redis (--redis-url): client secrets (single use across
replicas), Idempotency-Key answers, rate-limit buckets, each key's open sessions (--max-sessions-per-key)
and the replica directory (replica id -> URL, for forwarding a hangup or a resume to the replica that owns
the call or session).

Every read-modify-write is one Lua script, so two replicas racing on the same key see one winner; the
buckets use Redis' clock, not the replicas'. Keys expire by themselves (secrets at their expiry,
idempotency records after their TTL, replica entries and session seats unless refreshed), so nothing needs
a sweeper.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

log = logging.getLogger(__name__)

PREFIX = "gw:"
REPLICA_TTL_S = 15  # a replica refreshes its entry every REPLICA_TTL_S / 3

# KEYS: secret, owner's set; ARGV: digest, record, expires_at (s), now (s), max outstanding, ttl (ms)
_MINT = """
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[4])
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[5]) then
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  return {0, first[2]}
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[6])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[6])
return {1, '0'}
"""
# KEYS: secret; ARGV: key prefix of the owners' sets, digest
_TAKE = """
local value = redis.call('GET', KEYS[1])
if not value then return false end
redis.call('DEL', KEYS[1])
redis.call('ZREM', ARGV[1] .. cjson.decode(value)['owner'], ARGV[2])
return value
"""
# KEYS: record; ARGV: fingerprint, created, ttl (ms). A new record is "pending" (no response yet).
_BEGIN = """
local value = redis.call('GET', KEYS[1])
if value then return value end
redis.call('SET', KEYS[1], cjson.encode({fingerprint=ARGV[1], created=tonumber(ARGV[2])}), 'PX', ARGV[3])
return false
"""
# KEYS: record; ARGV: the response (JSON). The record keeps its fingerprint and expiry.
_FINISH = """
local value = redis.call('GET', KEYS[1])
if not value then return 0 end
local record = cjson.decode(value)
record['response'] = cjson.decode(ARGV[1])
redis.call('SET', KEYS[1], cjson.encode(record), 'KEEPTTL')
return 1
"""
# KEYS: bucket; ARGV: capacity, refill per second, cost. Returns {taken (0/1), tokens left * 1000}.
_TAKE_TOKENS = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1e6
local capacity, rate, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'updated')
local tokens = tonumber(state[1]) or capacity
local updated = tonumber(state[2]) or t
tokens = math.min(capacity, tokens + math.max(0, t - updated) * rate)
local taken = 0
if tokens >= cost then tokens = tokens - cost; taken = 1 end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'updated', tostring(t))
redis.call('PEXPIRE', KEYS[1], math.ceil((capacity / rate) * 1000) + 1000)
return {taken, math.floor(tokens * 1000)}
"""

# A key's open sessions: a sorted set of seat ids scored by expiry (ms, Redis' clock), pushed forward by the
# replica that holds each; a crashed replica's seats lapse. KEYS: the set; ARGV: seat id, cap, ttl (ms).
_TAKE_SEAT = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""
# KEYS: the sets of the seats a replica holds; ARGV: their ids (one per key, in order), then ttl (ms). Only
# seats already there are pushed forward (XX): a refresh that races a seat's take or give-back must not add it.
_REFRESH_SEATS = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local ttl = tonumber(ARGV[#ARGV])
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, 'XX', ms + ttl, ARGV[i])
  redis.call('PEXPIRE', key, ttl)
end
return #KEYS
"""


@dataclass(frozen=True)
class SecretRecord:
    owner: str
    session: dict[str, Any]
    expires_at: float


class RedisState:
    def __init__(self, url: str) -> None:
        self.redis: Redis = Redis.from_url(url, decode_responses=True)
        self._mint = self.redis.register_script(_MINT)
        self._take = self.redis.register_script(_TAKE)
        self._begin = self.redis.register_script(_BEGIN)
        self._finish = self.redis.register_script(_FINISH)
        self._take_tokens = self.redis.register_script(_TAKE_TOKENS)
        self._take_seat = self.redis.register_script(_TAKE_SEAT)
        self._refresh_seats = self.redis.register_script(_REFRESH_SEATS)

    async def ping(self) -> None:
        await self.redis.ping()

    async def close(self) -> None:
        await self.redis.aclose()

    # -- client secrets ----------------------------------------------------------------------------------
    async def mint_secret(self, digest: str, record: SecretRecord, now: float, max_outstanding: int) -> float | None:
        """Store a secret unless its owner has `max_outstanding` unexpired ones: then the earliest expiry."""
        ttl_ms = max(1, int((record.expires_at - now) * 1000))
        value = json.dumps({"owner": record.owner, "session": record.session, "expires_at": record.expires_at})
        stored, earliest = await self._mint(
            keys=[f"{PREFIX}secret:{digest}", f"{PREFIX}secrets:{record.owner}"],
            args=[digest, value, record.expires_at, now, max_outstanding, ttl_ms])
        return None if int(stored) else float(earliest)

    async def get_secret(self, digest: str) -> SecretRecord | None:
        value = await self.redis.get(f"{PREFIX}secret:{digest}")
        return _secret(_text(value)) if value else None

    async def take_secret(self, digest: str) -> SecretRecord | None:
        """The secret, removed in the same step: of two replicas taking it, one gets it."""
        value = await self._take(keys=[f"{PREFIX}secret:{digest}"], args=[f"{PREFIX}secrets:", digest])
        return _secret(value) if value else None

    # -- idempotency -------------------------------------------------------------------------------------
    async def begin_idempotent(self, owner: str, key_digest: str, fingerprint: str, created: float,
                               ttl_s: float) -> dict[str, Any] | None:
        """None when this request is the first (a pending record now stands); else the record found."""
        value = await self._begin(keys=[_idempotency_key(owner, key_digest)],
                                  args=[fingerprint, created, max(1, int(ttl_s * 1000))])
        return json.loads(value) if value else None

    async def finish_idempotent(self, owner: str, key_digest: str, response: dict[str, Any] | None) -> None:
        """The first request's answer (a replay gets it), or None: it failed, a retry runs for real."""
        key = _idempotency_key(owner, key_digest)
        if response is None:
            await self.redis.delete(key)
        else:
            await self._finish(keys=[key], args=[json.dumps(response)])

    # -- rate limits -------------------------------------------------------------------------------------
    async def take_tokens(self, bucket: str, capacity: float, per_second: float, cost: float = 1.0) -> tuple[bool, float]:
        taken, left = await self._take_tokens(keys=[f"{PREFIX}rate:{bucket}"], args=[capacity, per_second, cost])
        return bool(int(taken)), int(left) / 1000.0

    # -- session seats (--max-sessions-per-key) -----------------------------------------------------------
    async def take_seat(self, key_id: str, seat_id: str, cap: int, ttl_s: float) -> bool:
        """A seat among the key's `cap`, held for `ttl_s` unless refreshed; False when all are taken."""
        taken = await self._take_seat(keys=[_seats_key(key_id)], args=[seat_id, cap, max(1, int(ttl_s * 1000))])
        return bool(int(taken))

    async def refresh_seats(self, seats: list[tuple[str, str]], ttl_s: float) -> None:
        """Each (key id, seat id) held for `ttl_s` more."""
        if seats:
            await self._refresh_seats(keys=[_seats_key(key_id) for key_id, _ in seats],
                                      args=[*(seat_id for _, seat_id in seats), max(1, int(ttl_s * 1000))])

    async def give_back_seat(self, key_id: str, seat_id: str) -> None:
        await self.redis.zrem(_seats_key(key_id), seat_id)

    # -- replicas ----------------------------------------------------------------------------------------
    async def announce_replica(self, replica_id: str, url: str) -> None:
        await self.redis.set(f"{PREFIX}replica:{replica_id}", url, ex=REPLICA_TTL_S)

    async def withdraw_replica(self, replica_id: str) -> None:
        await self.redis.delete(f"{PREFIX}replica:{replica_id}")

    async def replica_url(self, replica_id: str) -> str | None:
        value = await self.redis.get(f"{PREFIX}replica:{replica_id}")
        return None if value is None else _text(value)


def _secret(value: str) -> SecretRecord:
    data = json.loads(value)
    return SecretRecord(owner=data["owner"], session=data["session"], expires_at=float(data["expires_at"]))


def _idempotency_key(owner: str, key_digest: str) -> str:
    return f"{PREFIX}idem:{owner}:{key_digest}"


def _seats_key(key_id: str) -> str:
    return f"{PREFIX}seats:{key_id}"


def _text(value: bytes | str) -> str:
    """A Redis reply as text (the client decodes responses, but its types allow bytes)."""
    return value.decode() if isinstance(value, bytes) else value
