"""Client quotas on the broker: produce and fetch byte rates per user and client id, kept in the
controller KV (so every broker of a cluster holds its clients to the same quotas), managed with
DescribeClientQuotas and AlterClientQuotas, and enforced as Kafka enforces them.

The quotas are the KV's ``quotas/...`` records (:mod:`automq_ref.formats.client_quota`), read from
the followed image whenever it changed. Which quota applies, the rates and the throttle times are
:mod:`automq_ref.state_machines.quota`'s. The user of a request is its connection's principal's
name (``User:alice``: ``alice``; a connection without a login is ``ANONYMOUS``, held to the
default user's quotas).

*Enforcement* (Kafka's, KIP-219). A Produce's record bytes and a Fetch response's bytes are
counted against the client's quota; when it is over, the response says for how long it is
throttled (``throttle_time_ms``) and:

- to a client that throttles itself (Produce v6+, Fetch v8+), the response goes at once and the
  connection is muted: its next request is not taken before the throttle time has passed;
- to an older client, the response itself is held back that long.

Counting is per quota entity as Kafka's sensors count: every client of a user held to that user's
quota shares it; a default quota is each user's (or client id's) own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.client_quota import (
    QUOTA_KEY_PREFIX,
    ClientQuotaFormatError,
    decode_quotas,
    encode_quotas,
    parse_quota_key,
    quota_key,
)
from automq_ref.io.clock import Clock
from automq_ref.io.metadata.client import ControllerClient, ControllerError
from automq_ref.io.metadata.view import MetadataView
from automq_ref.kafka.handlers.authorize import AclOperation, cluster_allowed, cluster_operation
from automq_ref.kafka.request import ApiKey, Context, Request
from automq_ref.kafka.responses import Response, respond
from automq_ref.kafka.server import Peer, Reply
from automq_ref.state_machines import quota as q
from automq_ref.state_machines import stream_metadata as sm

# The first versions at which the client throttles itself (KIP-219).
SELF_THROTTLING: Final = {int(ApiKey.PRODUCE): 6, int(ApiKey.FETCH): 8}
# Quota keys Kafka knows for user and client-id entities; only the byte rates are served.
KAFKA_QUOTA_KEYS: Final = (*q.QUOTA_KEYS, "request_percentage", "controller_mutation_rate")
MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY = 0, 1, 2


def user_of(peer: Peer) -> str:
    principal = peer.session.principal or "User:ANONYMOUS"
    return principal.partition(":")[2] or "ANONYMOUS"


class ClientQuotas:
    """The quotas of the followed image, the clients' byte counts, and the throttling."""

    def __init__(self, view: MetadataView, clock: Clock) -> None:
        self._view = view
        self._clock = clock
        self._version = -1
        self._table: dict[q.QuotaEntity, dict[str, float]] = {}
        self._samples: dict[tuple[str, q.QuotaEntity], q.Samples] = {}

    def table(self) -> dict[q.QuotaEntity, dict[str, float]]:
        """Entity -> quota key -> value, as of the image."""
        if self._view.version != self._version:
            self._version = self._view.version
            self._table = quota_table(self._view.image.kv)
        return self._table

    def throttle_ms(self, key: str, peer: Peer, client_id: str | None, amount: int) -> int:
        """Count ``amount`` bytes of quota ``key`` for the request's client; how long it is
        throttled now (0: within its quota, or no quota applies)."""
        table = self.table()
        if not table:
            return 0
        user, client = user_of(peer), client_id or ""
        found = q.quota_for(table, user, client, key)
        if found is None:
            return 0
        entity, value = found
        # The sensor of this client under that entity: a default part counts per name.
        sensor = q.QuotaEntity(
            user=user if entity.user is not None or entity.user_default else None,
            client_id=client if entity.client_id is not None or entity.client_id_default else None,
        )
        now = int(self._clock.monotonic_s() * 1000)
        samples = q.record(self._samples.get((key, sensor), q.Samples()), now, amount)
        self._samples[(key, sensor)] = samples
        return q.throttle_ms(samples, now, value)

    async def throttled(self, request: Request, throttle_ms: int) -> None:
        """Apply a throttle the response carries: mute the connection (a self-throttling
        client's version) or hold the response back (an older one)."""
        if throttle_ms <= 0:
            return
        first = SELF_THROTTLING.get(request.api_key)
        if first is not None and request.api_version >= first:
            session = request.peer.session
            until = self._clock.monotonic_s() + throttle_ms / 1000
            session.muted_until_s = max(session.muted_until_s, until)
            return
        await asyncio.sleep(throttle_ms / 1000)

    async def until_unmuted(self, peer: Peer) -> None:
        """Wait out the connection's mute, if any (before its next request is taken)."""
        left = peer.session.muted_until_s - self._clock.monotonic_s()
        if left > 0:
            await asyncio.sleep(left)


def quota_table(kv: Mapping[str, bytes]) -> dict[q.QuotaEntity, dict[str, float]]:
    """The quota records of a KV (a malformed one is skipped: it names no entity a client can
    match)."""
    table: dict[q.QuotaEntity, dict[str, float]] = {}
    for key, value in kv.items():
        if not key.startswith(QUOTA_KEY_PREFIX):
            continue
        try:
            parts = parse_quota_key(key)
            if parts is not None:
                table[q.QuotaEntity.of(dict(parts))] = decode_quotas(value)
        except (ClientQuotaFormatError, ValueError):
            continue
    return table


# ------------------------------------------------------------------------- typed responses


@dataclass(frozen=True, slots=True)
class EntityData:
    entity_type: str
    entity_name: str | None


@dataclass(frozen=True, slots=True)
class ValueData:
    key: str
    value: float


@dataclass(frozen=True, slots=True)
class EntryData:
    entity: Sequence[EntityData]
    values: Sequence[ValueData]


@dataclass(frozen=True, slots=True)
class DescribeClientQuotasResponse(Response):
    API_KEY = ApiKey.DESCRIBE_CLIENT_QUOTAS
    entries: Sequence[EntryData] | None
    error_code: KafkaErrorCode = KafkaErrorCode.NONE
    error_message: str | None = None
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class AlterEntryData:
    entity: Sequence[EntityData]
    error_code: KafkaErrorCode = KafkaErrorCode.NONE
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class AlterClientQuotasResponse(Response):
    API_KEY = ApiKey.ALTER_CLIENT_QUOTAS
    entries: Sequence[AlterEntryData]
    throttle_time: int = 0


class _Invalid(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# ------------------------------------------------------------------------------ the handlers


def _entity_data(entity: q.QuotaEntity) -> list[EntityData]:
    return [EntityData(kind, name) for kind, name in entity.parts()]


def _matches(entity: q.QuotaEntity, components: Sequence[Any], strict: bool) -> bool:
    parts = dict(entity.parts())
    for component in components:
        kind, match_type = component.entity_type, int(component.match_type)
        if kind not in parts:
            return False
        name = parts[kind]
        if match_type == MATCH_EXACT and name != component.match:
            return False
        if match_type == MATCH_DEFAULT and name is not None:
            return False
    return not strict or len(parts) == len(components)


def _check_filter(components: Sequence[Any]) -> None:
    seen: set[str] = set()
    for component in components:
        kind = component.entity_type
        if kind in seen:
            raise _Invalid(f"Duplicate {kind} in the filter")
        seen.add(kind)
        if kind not in (q.USER, q.CLIENT_ID):
            raise _Invalid(f"entity type {kind!r}: only user and client-id quotas are served")
        if int(component.match_type) not in (MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY):
            raise _Invalid(f"unknown match type {component.match_type}")
        if int(component.match_type) == MATCH_EXACT and component.match is None:
            raise _Invalid(f"an exact match on {kind} needs a name")


@cluster_operation(AclOperation.DESCRIBE_CONFIGS)
async def handle_describe_client_quotas(context: Context, request: Request) -> Reply:
    body = request.body
    try:
        _check_filter(body.components)
    except _Invalid as invalid:
        error = DescribeClientQuotasResponse(None, KafkaErrorCode.INVALID_REQUEST, invalid.message)
        return respond(request, error)
    table = quota_table(context.view.image.kv)
    entries = [
        EntryData(_entity_data(entity), [ValueData(k, v) for k, v in sorted(values.items())])
        for entity, values in sorted(table.items(), key=lambda item: quota_key(item[0].parts()))
        if values and _matches(entity, body.components, bool(body.strict))
    ]
    return respond(request, DescribeClientQuotasResponse(entries))


def _entity_of(entity: Sequence[Any]) -> q.QuotaEntity:
    parts: dict[str, str | None] = {}
    for part in entity:
        if part.entity_type in parts:
            raise _Invalid(f"Duplicate {part.entity_type} in the entity")
        parts[part.entity_type] = part.entity_name
    try:
        return q.QuotaEntity.of(parts)
    except ValueError as error:
        raise _Invalid(str(error)) from None


def _altered(current: Mapping[str, float], ops: Sequence[Any]) -> dict[str, float]:
    values = dict(current)
    keys = [op.key for op in ops]
    for op in ops:
        if keys.count(op.key) > 1:
            raise _Invalid(f"Duplicate quota key {op.key}")
        if op.key not in KAFKA_QUOTA_KEYS:
            raise _Invalid(f"Invalid configuration key {op.key}")
        if op.key not in q.QUOTA_KEYS:
            raise _Invalid(
                f"{op.key}: only {' and '.join(q.QUOTA_KEYS)} are enforced by this broker"
            )
        if op.remove:
            values.pop(op.key, None)
            continue
        value = float(op.value)
        if value < 0 or value != int(value):
            raise _Invalid(f"{op.key}={op.value}: a rate is a whole number of bytes per second")
        values[op.key] = value
    return values


async def handle_alter_client_quotas(context: Context, request: Request) -> Reply:
    body = request.body
    if not cluster_allowed(context, request, AclOperation.ALTER_CONFIGS):
        denial = KafkaErrorCode.CLUSTER_AUTHORIZATION_FAILED
        refused = [
            AlterEntryData([EntityData(p.entity_type, p.entity_name) for p in e.entity], denial)
            for e in body.entries
        ]
        return respond(request, AlterClientQuotasResponse(refused))

    async def answer() -> Any:
        results = []
        entities: set[q.QuotaEntity] = set()
        for entry in body.entries:
            data = [EntityData(p.entity_type, p.entity_name) for p in entry.entity]
            try:
                entity = _entity_of(entry.entity)
                if entity in entities:
                    raise _Invalid("the entity is given twice")
                entities.add(entity)
                code = await _alter(context, entity, entry.ops, bool(body.validate_only))
                results.append(AlterEntryData(data, code))
            except _Invalid as invalid:
                results.append(
                    AlterEntryData(data, KafkaErrorCode.INVALID_REQUEST, invalid.message)
                )
        return respond(request, AlterClientQuotasResponse(results))

    return answer()


async def _alter(
    context: Context, entity: q.QuotaEntity, ops: Sequence[Any], validate_only: bool
) -> KafkaErrorCode:
    """Write the entity's new quotas (compare-and-set on its record, tried again while another
    broker changes it meanwhile)."""
    client: ControllerClient = context.controller_client
    key = quota_key(entity.parts())
    for _ in range(10):
        current = context.view.image.kv.get(key)
        values = _altered({} if current is None else decode_quotas(current), ops)
        if validate_only:
            return KafkaErrorCode.NONE
        event: sm.StreamMetadataEvent = (
            sm.DeleteKV(key, expected=current)
            if not values
            else sm.PutKV(key, encode_quotas(values), True, expected=current)
            if current is not None
            else sm.PutKV(key, encode_quotas(values), False)
        )
        if current is None and not values:
            return KafkaErrorCode.NONE
        try:
            response = await client.submit(event)
        except ControllerError:
            return KafkaErrorCode.REQUEST_TIMED_OUT
        if response.ok:
            await _until_seen(context, key, None if not values else encode_quotas(values))
            return KafkaErrorCode.NONE
    return KafkaErrorCode.UNKNOWN_SERVER_ERROR


async def _until_seen(context: Context, key: str, value: bytes | None) -> None:
    """Wait (briefly) for the image to show the change, so a Describe right after sees it."""
    for _ in range(100):
        if context.view.image.kv.get(key) == value:
            return
        version = context.view.version
        try:
            await asyncio.wait_for(context.view.wait_for_change(version), 0.1)
        except TimeoutError:
            continue
