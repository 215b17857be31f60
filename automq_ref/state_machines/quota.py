"""Client quotas, pure: which quota applies to a client, how fast it has been going, and how long
it is throttled for, with the rules of Kafka's ``ClientQuotaManager``.

*Entities.* A quota is set on an entity: a user, a client id, or both, each either named or the
default (``None`` here: ``<default>`` in Kafka's tools). A request of user ``u`` with client id
``c`` is held to the first quota set of, in this order (Kafka's precedence)::

    user=u, client-id=c          user=u, client-id=<default>      user=u
    user=<default>, client-id=c  user=<default>, client-id=<default>  user=<default>
    client-id=c                  client-id=<default>

*Rates.* Bytes are counted in :data:`QUOTA_WINDOW_NUM` windows of :data:`QUOTA_WINDOW_SIZE_MS`
each (``quota.window.num``, ``quota.window.size.seconds``); the rate is their sum over the time
they cover, taken as at least ``(windows - 1)`` whole windows (Kafka's ``Rate`` with
``SampledStat``), so one burst at start-up is not read as an infinite rate.

*Throttling.* A client over its quota ``Q`` at rate ``R`` is throttled for
``(R - Q) / Q * W`` ms, ``W`` the span the rate was measured over, at most the whole span of
the windows (Kafka's ``QuotaUtils.throttleTime`` and ``boundedThrottleTime``): long enough that,
sending nothing meanwhile, its rate falls back to the quota.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Final

PRODUCER_BYTE_RATE: Final = "producer_byte_rate"
CONSUMER_BYTE_RATE: Final = "consumer_byte_rate"
QUOTA_KEYS: Final = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE)
USER: Final = "user"
CLIENT_ID: Final = "client-id"
QUOTA_WINDOW_NUM: Final = 11
QUOTA_WINDOW_SIZE_MS: Final = 1000


@dataclass(frozen=True, slots=True)
class QuotaEntity:
    """An entity a quota is set on: each part absent (not part of it), or a name, or the
    default (``DEFAULT``)."""

    user: str | None = None  # None: not part of the entity
    client_id: str | None = None
    user_default: bool = False
    client_id_default: bool = False

    def parts(self) -> tuple[tuple[str, str | None], ...]:
        """(entity type, name or None for the default), in Kafka's order: user first."""
        found: list[tuple[str, str | None]] = []
        if self.user is not None or self.user_default:
            found.append((USER, None if self.user_default else self.user))
        if self.client_id is not None or self.client_id_default:
            found.append((CLIENT_ID, None if self.client_id_default else self.client_id))
        return tuple(found)

    @classmethod
    def of(cls, parts: Mapping[str, str | None]) -> QuotaEntity:
        """From (entity type -> name, None for the default); ValueError for another type or
        none."""
        unknown = sorted(set(parts) - {USER, CLIENT_ID})
        if unknown or not parts:
            raise ValueError(
                f"an entity is a {USER}, a {CLIENT_ID} or both"
                + (f", not {', '.join(unknown)}" if unknown else "")
            )
        entity = cls()
        if USER in parts:
            name = parts[USER]
            entity = replace(entity, user=name, user_default=name is None)
        if CLIENT_ID in parts:
            name = parts[CLIENT_ID]
            entity = replace(entity, client_id=name, client_id_default=name is None)
        return entity


def precedence(user: str, client_id: str) -> tuple[QuotaEntity, ...]:
    """The entities whose quota a request of ``user`` (the principal's name; empty for an
    unauthenticated client, whose user quotas are the default's) and ``client_id`` is held to,
    the first set one winning."""
    named_user = QuotaEntity(user=user) if user else QuotaEntity(user_default=True)
    return (
        replace(named_user, client_id=client_id),
        replace(named_user, client_id_default=True),
        named_user,
        QuotaEntity(user_default=True, client_id=client_id),
        QuotaEntity(user_default=True, client_id_default=True),
        QuotaEntity(user_default=True),
        QuotaEntity(client_id=client_id),
        QuotaEntity(client_id_default=True),
    )


def quota_for(
    quotas: Mapping[QuotaEntity, Mapping[str, float]], user: str, client_id: str, key: str
) -> tuple[QuotaEntity, float] | None:
    """The entity and value of the quota ``key`` the request is held to; None: no quota."""
    for entity in precedence(user, client_id):
        values = quotas.get(entity)
        if values is not None and key in values:
            return entity, values[key]
    return None


@dataclass(frozen=True, slots=True)
class Samples:
    """Amounts counted per window: (window start ms, amount), oldest first."""

    windows: tuple[tuple[int, float], ...] = ()


def record(
    samples: Samples,
    now_ms: int,
    amount: float,
    *,
    window_ms: int = QUOTA_WINDOW_SIZE_MS,
    count: int = QUOTA_WINDOW_NUM,
) -> Samples:
    """``samples`` with ``amount`` counted at ``now_ms``; windows older than ``count`` windows
    are dropped."""
    windows = [w for w in samples.windows if now_ms - w[0] < window_ms * count]
    if windows and now_ms - windows[-1][0] < window_ms:
        start, total = windows[-1]
        windows[-1] = (start, total + amount)
    else:
        windows.append((now_ms, amount))
    return Samples(tuple(windows[-count:]))


def measured_span_ms(
    samples: Samples,
    now_ms: int,
    *,
    window_ms: int = QUOTA_WINDOW_SIZE_MS,
    count: int = QUOTA_WINDOW_NUM,
) -> int:
    """The span the rate is taken over: since the oldest window began, and at least
    ``count - 1`` whole windows."""
    oldest = samples.windows[0][0] if samples.windows else now_ms
    elapsed = max(now_ms - oldest, 0)
    whole = elapsed // window_ms
    if whole < count - 1:
        elapsed += (count - 1 - whole) * window_ms
    return elapsed


def rate(
    samples: Samples,
    now_ms: int,
    *,
    window_ms: int = QUOTA_WINDOW_SIZE_MS,
    count: int = QUOTA_WINDOW_NUM,
) -> float:
    """Amount per second over the windows still counted at ``now_ms``."""
    live = [w for w in samples.windows if now_ms - w[0] < window_ms * count]
    span = measured_span_ms(Samples(tuple(live)), now_ms, window_ms=window_ms, count=count)
    return sum(amount for _, amount in live) * 1000.0 / span


def throttle_ms(
    samples: Samples,
    now_ms: int,
    quota: float,
    *,
    window_ms: int = QUOTA_WINDOW_SIZE_MS,
    count: int = QUOTA_WINDOW_NUM,
) -> int:
    """How long a client whose counts are ``samples`` is throttled at ``now_ms`` under
    ``quota`` (per second): 0 within it."""
    observed = rate(samples, now_ms, window_ms=window_ms, count=count)
    if observed <= quota:
        return 0
    if quota <= 0:
        return window_ms * count
    live = Samples(tuple(w for w in samples.windows if now_ms - w[0] < window_ms * count))
    span = measured_span_ms(live, now_ms, window_ms=window_ms, count=count)
    throttle = round((observed - quota) / quota * span)
    return int(min(max(throttle, 0), window_ms * count))
