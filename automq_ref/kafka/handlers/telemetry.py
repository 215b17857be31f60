"""GetTelemetrySubscriptions and PushTelemetry (KIP-714), as a Kafka broker answers them with no
client-telemetry receiver.

Kafka advertises the two APIs only when a metrics reporter receives client telemetry
(``ApiVersionsResponse``: ``clientTelemetryEnabled``, ``ClientMetricsManager
.isTelemetryReceiverConfigured``), so Kafka 4.0's table, and this broker's, leaves them out, and
clients do not send them. A client that sends them anyway is answered as Kafka's
``ClientMetricsManager`` answers: GetTelemetrySubscriptions with the client's instance id (a new
random one for a null or zero id), no subscription (no metric requested, the default push
interval of 5 minutes, the subscription id Kafka computes for that: the CRC32C of ``[]300000``
XORed with the instance id's hash), the compression types Kafka accepts (zstd, lz4, gzip,
snappy), ``telemetry.max.bytes``' default (1 MiB) and delta temporality; PushTelemetry with
NONE (nothing receives the metrics), or Kafka's errors: ``INVALID_REQUEST`` for a reserved
instance id, ``UNKNOWN_SUBSCRIPTION_ID`` for another subscription id,
``UNSUPPORTED_COMPRESSION_TYPE``, ``TELEMETRY_TOO_LARGE``. Kafka also remembers each client
instance, to answer a request that comes before the push interval
``THROTTLING_QUOTA_EXCEEDED`` and one after a terminating push ``INVALID_REQUEST``; this broker
keeps no such state (a client that asks before its interval is answered as the first time).
"""

from __future__ import annotations

import uuid
from typing import Final

import crc32c

from automq_ref.errors import KafkaErrorCode
from automq_ref.kafka import responses as r
from automq_ref.kafka.request import Context, Request
from automq_ref.kafka.server import Reply

PUSH_INTERVAL_MS: Final = 300_000  # Kafka's ClientMetricsConfigs.DEFAULT_INTERVAL_MS
TELEMETRY_MAX_BYTES: Final = 1_048_576  # telemetry.max.bytes' default
# Kafka's CompressionType ids: ZSTD, LZ4, GZIP, SNAPPY (its order), and the ids it knows.
ACCEPTED_COMPRESSION_TYPES: Final = (4, 3, 1, 2)
KNOWN_COMPRESSION_TYPES: Final = frozenset(range(5))
# Kafka's Uuid.RESERVED: ZERO_UUID and ONE_UUID (the metadata topic's id).
RESERVED_IDS: Final = frozenset({uuid.UUID(int=0), uuid.UUID(int=1)})


def _java_uuid_hash(instance_id: uuid.UUID) -> int:
    """Kafka's ``Uuid.hashCode``: the halves XORed, then its high and low 32 bits."""
    most, least = instance_id.int >> 64, instance_id.int & (2**64 - 1)
    xor = most ^ least
    return ((xor >> 32) ^ xor) & 0xFFFFFFFF


def subscription_id(instance_id: uuid.UUID) -> int:
    """Kafka's ``computeSubscriptionId`` of no metric at the default interval (an int32)."""
    crc = crc32c.crc32c(f"[]{PUSH_INTERVAL_MS}".encode())
    value = (crc ^ _java_uuid_hash(instance_id)) & 0xFFFFFFFF
    return value - 2**32 if value >= 2**31 else value


def _new_instance_id() -> uuid.UUID:
    """A random id as Kafka's ``Uuid.randomUuid`` draws one: not reserved, and not one whose
    base64 text starts with '-' (a first six bits of 62)."""
    while True:
        found = uuid.uuid4()
        if found not in RESERVED_IDS and found.bytes[0] >> 2 != 62:
            return found


async def handle_get_telemetry_subscriptions(context: Context, request: Request) -> Reply:
    instance_id = request.body.client_instance_id
    if instance_id is None or instance_id == uuid.UUID(int=0):
        instance_id = _new_instance_id()
    return r.respond(
        request,
        r.GetTelemetrySubscriptionsResponse(
            error_code=KafkaErrorCode.NONE,
            client_instance_id=instance_id,
            subscription_id=subscription_id(instance_id),
            accepted_compression_types=ACCEPTED_COMPRESSION_TYPES,
            push_interval=PUSH_INTERVAL_MS,
            telemetry_max_bytes=TELEMETRY_MAX_BYTES,
            delta_temporality=True,
            requested_metrics=(),
        ),
    )


async def handle_push_telemetry(context: Context, request: Request) -> Reply:
    body = request.body
    instance_id = body.client_instance_id
    if instance_id is None or instance_id in RESERVED_IDS:
        error = KafkaErrorCode.INVALID_REQUEST
    elif int(body.subscription_id) != subscription_id(instance_id):
        error = KafkaErrorCode.UNKNOWN_SUBSCRIPTION_ID
    elif int(body.compression_type) not in KNOWN_COMPRESSION_TYPES:
        error = KafkaErrorCode.UNSUPPORTED_COMPRESSION_TYPE
    elif body.metrics is not None and len(body.metrics) > TELEMETRY_MAX_BYTES:
        error = KafkaErrorCode.TELEMETRY_TOO_LARGE
    else:
        error = KafkaErrorCode.NONE
    return r.respond(request, r.PushTelemetryResponse(error))
