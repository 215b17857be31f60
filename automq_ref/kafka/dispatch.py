"""The dispatcher: one table from API key to handler and version range, and the admission of a
request frame (decode it, route it) that the listener calls.

Every request but Produce is decoded with kio (unknown tagged fields skipped); Produce is decoded
by hand so that its record batches stay slices of the frame (no copy). What a request cannot be
answered with closes the connection, as Kafka's ``SocketServer`` does for an API its listener
does not enable (an ``InvalidRequestException`` from ``parseRequestHeader``, then the close): a
version of a served API it does not speak (except ApiVersions, answered in v0 with
UNSUPPORTED_VERSION so the client can retry lower: KIP-511), an API key Kafka's brokers do not
serve either (controller and inter-broker APIs, unknown keys), a frame that does not decode. The
listener logs why once per client (client id and host, see :mod:`automq_ref.kafka.notices`),
naming the API.

Never a silent close for an API a Kafka 4.0 broker serves
(:data:`KAFKA_BROKER_APIS_NOT_SERVED`: the rest of its ApiVersions table, which
``tests/unit/test_broker_api_versions.py`` keeps equal to kafka-python's): one this broker does
not serve (ACLs, delegation tokens, client quotas, features, the quorum's APIs), at
a version Kafka 4.0 serves, is answered, when its response has a top-level ``error_code``, with
``UNSUPPORTED_VERSION`` there and every other field empty, as Kafka's ``KafkaApis`` answers an
API whose feature is off (``getErrorResponse(UNSUPPORTED_VERSION)``: KIP-848's, share groups',
telemetry without a manager); the client fails at once with an error that names the version.
Logged once per client (:func:`~automq_ref.kafka.notices.unsupported_request`). An API whose
response has no such field (AlterReplicaLogDirs: errors per entry only) is still
closed.

Features this broker lacks but Kafka's protocol has an error for are answered with that error
by their handlers, so that clients fail at once and say why: config changes to anything but a
topic.

The KIP-848 consumer group protocol (``group.protocol=consumer``) is served: ConsumerGroupHeartbeat
and ConsumerGroupDescribe (v0-1, :mod:`automq_ref.kafka.handlers.consumer_groups`).

The version ranges are Kafka 4.0's for the keys implemented (``tests/unit/test_broker_api_versions
.py`` compares them with kafka-python's table of real releases); ApiVersions answers from the
table. Produce v0-2 are advertised, as Kafka 4.0 does for librdkafka's feature detection, and
refused when used. GetTelemetrySubscriptions and PushTelemetry (KIP-714) are served but not
advertised, as a Kafka broker without a client-telemetry receiver leaves them out of its
ApiVersions answer (:mod:`automq_ref.kafka.handlers.telemetry`).

On a SASL listener (SASL_PLAINTEXT, SASL_SSL) a connection's frames go through
:class:`automq_ref.kafka.sasl.SaslGate` until it is authenticated: only ApiVersions (routed as
usual), SaslHandshake and SaslAuthenticate are served before then; anything else closes the
connection. Once authenticated, and on every other listener, SaslHandshake and SaslAuthenticate
are answered ``ILLEGAL_SASL_STATE``, as Kafka's ``KafkaApis`` answers them. The SCRAM users'
credentials are the controller KV's, which the gates read from the followed image at each login;
DescribeUserScramCredentials and AlterUserScramCredentials (v0,
:mod:`automq_ref.kafka.handlers.scram`) manage them.

Served for admin tools: DescribeLogDirs (v1-4, the broker's one log dir and the partitions it
leads), OffsetDelete (v0), DescribeTopicPartitions (v0, KIP-966: what Kafka 4's admin client
describes topics with), ConsumerGroupDescribe (v0-1). The ACL APIs (DescribeAcls, CreateAcls,
DeleteAcls, v1-3: :mod:`automq_ref.kafka.handlers.acls`) are served always, and answer
SECURITY_DISABLED without an authorizer, as Kafka's.

AutomqZoneRouter (API key 515, AutoMQ's broker-to-broker request of the zone router: a proxy
asks a partition's leader to append what it put in its RouterChannel) is served, and listed by
ApiVersions with AutoMQ's range (v0-1), only with the zone router on
(``automq.zonerouter.channels``): its answers come from the main side
(:mod:`automq_ref.kafka.zone_router_in`); v0 (AutoMQ's older router) is answered
``UNSUPPORTED_VERSION``. With the router off it is an API this broker does not serve (the
connection is closed, as for any unknown key), where AutoMQ lists it always and answers
``UNKNOWN_SERVER_ERROR``.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.errors import FormatError
from automq_ref.formats.scram import ScramCredential
from automq_ref.kafka import quotas, sasl
from automq_ref.kafka.handlers import (
    acls,
    api_versions,
    configs,
    consumer_groups,
    fetch,
    groups,
    log_dirs,
    metadata,
    offsets,
    partition_snapshot,
    produce,
    producer_ids,
    reassignments,
    scram,
    telemetry,
    topics,
    transactions,
)
from automq_ref.kafka.notices import unsupported_request
from automq_ref.kafka.request import ApiKey, Context, Handler, Request
from automq_ref.kafka.server import Answer, Chunks, CloseConnection, Peer, Reply
from automq_ref.kafka.zone_router_in import RouterIn
from automq_ref.protocol import PRODUCE_MIN_VERSION, decode_produce_frame
from automq_ref.protocol.kio_codec import (
    RequestDecodeError,
    api_name,
    decode_request,
    encode_error_response,
    has_error_code,
    peek_header,
)
from automq_ref.protocol.partition_snapshot import (
    decode_request_frame as decode_partition_snapshot_frame,
)
from automq_ref.protocol.zone_router import (
    ZONE_ROUTER_MAX_VERSION,
    ZONE_ROUTER_MIN_VERSION,
    ZoneRouterResponse,
    decode_zone_router_request,
    encode_zone_router_response,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Route:
    handler: Handler
    min_version: int
    max_version: int


async def _api_versions(context: Context, request: Request) -> Reply:
    return api_versions.answer(request, api_version_table(context))


async def _zone_router(context: Context, request: Request) -> Reply:
    router_in = context.router_in
    assert router_in is not None  # routed here only with the router on
    version = request.api_version
    if version < 1:
        # v0 carries the older router record (data in objects of its own), not built here.
        response = ZoneRouterResponse(KafkaErrorCode.UNSUPPORTED_VERSION.value)
        return _zone_router_answer(router_in, version, request.correlation_id, response)
    answer = router_in.admit(request.body)

    async def respond() -> Chunks:
        return _zone_router_answer(router_in, version, request.correlation_id, await answer)

    return respond()


def _zone_router_answer(
    router_in: RouterIn, version: int, correlation_id: int, response: ZoneRouterResponse
) -> Answer:
    """Its bytes and its error code counted (the routed Produce answers inside it are the
    proxy's to count)."""
    encoded = encode_zone_router_response(version, correlation_id, response)
    router_in.bytes_out += 4 + len(encoded)  # with the listener's size prefix
    return Answer((encoded,), lambda: (response.error_code,))


# AutomqZoneRouter (AutoMQ's broker-to-broker API), served with the zone router on.
ZONE_ROUTER_ROUTE: Final = Route(_zone_router, ZONE_ROUTER_MIN_VERSION, ZONE_ROUTER_MAX_VERSION)


ROUTES: Mapping[ApiKey, Route] = {
    ApiKey.PRODUCE: Route(produce.handle_produce, 0, 12),
    ApiKey.FETCH: Route(fetch.handle_fetch, 4, 17),
    ApiKey.LIST_OFFSETS: Route(offsets.handle_list_offsets, 1, 10),
    ApiKey.METADATA: Route(metadata.handle_metadata, 0, 13),
    ApiKey.OFFSET_COMMIT: Route(groups.handle_offset_commit, 2, 9),
    ApiKey.OFFSET_FETCH: Route(groups.handle_offset_fetch, 1, 9),
    ApiKey.FIND_COORDINATOR: Route(groups.handle_find_coordinator, 0, 6),
    ApiKey.JOIN_GROUP: Route(groups.handle_join_group, 2, 9),
    ApiKey.HEARTBEAT: Route(groups.handle_heartbeat, 0, 4),
    ApiKey.LEAVE_GROUP: Route(groups.handle_leave_group, 0, 5),
    ApiKey.SYNC_GROUP: Route(groups.handle_sync_group, 0, 5),
    ApiKey.DESCRIBE_GROUPS: Route(groups.handle_describe_groups, 0, 6),
    ApiKey.LIST_GROUPS: Route(groups.handle_list_groups, 0, 5),
    ApiKey.SASL_HANDSHAKE: Route(sasl.handle_sasl_handshake, *sasl.HANDSHAKE_VERSIONS),
    ApiKey.API_VERSIONS: Route(_api_versions, 0, 4),
    ApiKey.CREATE_TOPICS: Route(topics.handle_create_topics, 2, 7),
    ApiKey.DELETE_TOPICS: Route(topics.handle_delete_topics, 1, 6),
    ApiKey.DELETE_RECORDS: Route(offsets.handle_delete_records, 0, 2),
    ApiKey.INIT_PRODUCER_ID: Route(producer_ids.handle_init_producer_id, 0, 5),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: Route(offsets.handle_offset_for_leader_epoch, 2, 4),
    ApiKey.ADD_PARTITIONS_TO_TXN: Route(transactions.handle_add_partitions_to_txn, 0, 5),
    ApiKey.ADD_OFFSETS_TO_TXN: Route(transactions.handle_add_offsets_to_txn, 0, 4),
    ApiKey.END_TXN: Route(transactions.handle_end_txn, 0, 4),
    ApiKey.WRITE_TXN_MARKERS: Route(transactions.handle_write_txn_markers, 1, 1),
    ApiKey.TXN_OFFSET_COMMIT: Route(groups.handle_txn_offset_commit, 0, 5),
    ApiKey.DESCRIBE_ACLS: Route(acls.handle_describe_acls, 1, 3),
    ApiKey.CREATE_ACLS: Route(acls.handle_create_acls, 1, 3),
    ApiKey.DELETE_ACLS: Route(acls.handle_delete_acls, 1, 3),
    ApiKey.DESCRIBE_CONFIGS: Route(configs.handle_describe_configs, 1, 4),
    ApiKey.ALTER_CONFIGS: Route(configs.handle_alter_configs, 0, 2),
    ApiKey.DESCRIBE_LOG_DIRS: Route(log_dirs.handle_describe_log_dirs, 1, 4),
    ApiKey.SASL_AUTHENTICATE: Route(sasl.handle_sasl_authenticate, *sasl.AUTHENTICATE_VERSIONS),
    ApiKey.CREATE_PARTITIONS: Route(topics.handle_create_partitions, 0, 3),
    ApiKey.DELETE_GROUPS: Route(groups.handle_delete_groups, 0, 2),
    ApiKey.ELECT_LEADERS: Route(reassignments.handle_elect_leaders, 0, 2),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: Route(configs.handle_incremental_alter_configs, 0, 1),
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: Route(
        reassignments.handle_alter_partition_reassignments, 0, 0
    ),
    ApiKey.LIST_PARTITION_REASSIGNMENTS: Route(
        reassignments.handle_list_partition_reassignments, 0, 0
    ),
    ApiKey.OFFSET_DELETE: Route(groups.handle_offset_delete, 0, 0),
    ApiKey.DESCRIBE_CLIENT_QUOTAS: Route(quotas.handle_describe_client_quotas, 0, 1),
    ApiKey.ALTER_CLIENT_QUOTAS: Route(quotas.handle_alter_client_quotas, 0, 1),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: Route(
        scram.handle_describe_user_scram_credentials, 0, 0
    ),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: Route(scram.handle_alter_user_scram_credentials, 0, 0),
    ApiKey.DESCRIBE_CLUSTER: Route(metadata.handle_describe_cluster, 0, 2),
    ApiKey.DESCRIBE_PRODUCERS: Route(transactions.handle_describe_producers, 0, 0),
    ApiKey.DESCRIBE_TRANSACTIONS: Route(transactions.handle_describe_transactions, 0, 0),
    ApiKey.LIST_TRANSACTIONS: Route(transactions.handle_list_transactions, 0, 1),
    ApiKey.CONSUMER_GROUP_HEARTBEAT: Route(consumer_groups.handle_consumer_group_heartbeat, 0, 1),
    ApiKey.CONSUMER_GROUP_DESCRIBE: Route(consumer_groups.handle_consumer_group_describe, 0, 1),
    # Served, not advertised: Kafka lists them only with a client-telemetry receiver.
    ApiKey.GET_TELEMETRY_SUBSCRIPTIONS: Route(telemetry.handle_get_telemetry_subscriptions, 0, 0),
    ApiKey.PUSH_TELEMETRY: Route(telemetry.handle_push_telemetry, 0, 0),
    ApiKey.DESCRIBE_TOPIC_PARTITIONS: Route(metadata.handle_describe_topic_partitions, 0, 0),
    # Between brokers only (AutoMQ's own API, kio has no schema): decoded by hand, answered
    # with the zone router on, not advertised to clients.
    ApiKey.AUTOMQ_GET_PARTITION_SNAPSHOT: Route(
        partition_snapshot.handle_get_partition_snapshot, 0, 2
    ),
}
INTERNAL_KEYS = frozenset({ApiKey.AUTOMQ_GET_PARTITION_SNAPSHOT})
# Served but left out of ApiVersions, as Kafka leaves them out without a telemetry receiver.
UNADVERTISED_KEYS = INTERNAL_KEYS | {ApiKey.GET_TELEMETRY_SUBSCRIPTIONS, ApiKey.PUSH_TELEMETRY}

# The APIs a Kafka 4.0 broker's listener serves that this broker does not, with Kafka 4.0's
# version ranges (its ApiVersions answer, kafka-python's table of it): a request of one of them,
# in that range, is answered UNSUPPORTED_VERSION where its response has room (the module
# docstring); any other key or version this broker does not serve is closed, as Kafka does.
KAFKA_BROKER_APIS_NOT_SERVED: Mapping[int, tuple[int, int]] = {
    34: (1, 2),  # AlterReplicaLogDirs
    38: (1, 3),  # CreateDelegationToken
    39: (1, 2),  # RenewDelegationToken
    40: (1, 2),  # ExpireDelegationToken
    41: (1, 3),  # DescribeDelegationToken
    55: (0, 2),  # DescribeQuorum
    57: (0, 2),  # UpdateFeatures
    64: (0, 0),  # UnregisterBroker
    74: (0, 0),  # ListConfigResources
    80: (0, 0),  # AddRaftVoter
    81: (0, 0),  # RemoveRaftVoter
}

# Plain ints for admit's comparisons, the per-request path.
_PRODUCE = int(ApiKey.PRODUCE)
_API_VERSIONS = int(ApiKey.API_VERSIONS)
_PARTITION_SNAPSHOT = int(ApiKey.AUTOMQ_GET_PARTITION_SNAPSHOT)
_ZONE_ROUTER = int(ApiKey.AUTOMQ_ZONE_ROUTER)

# The advertised table, by plain API key number.
API_VERSIONS: dict[int, tuple[int, int]] = {
    int(key): (route.min_version, route.max_version)
    for key, route in sorted(ROUTES.items())
    if key not in UNADVERTISED_KEYS
}


def api_version_table(context: Context) -> dict[int, tuple[int, int]]:
    """What ApiVersions advertises: the table, and AutomqZoneRouter with the router on (as
    AutoMQ's brokers list it on their broker listener)."""
    if context.router_in is None:
        return API_VERSIONS
    zone_router = (ZONE_ROUTER_ROUTE.min_version, ZONE_ROUTER_ROUTE.max_version)
    return {**API_VERSIONS, _ZONE_ROUTER: zone_router}


class Dispatcher:
    """The listener's request handler (:class:`automq_ref.kafka.server.RequestHandler`)."""

    def __init__(self, context: Context, routes: Mapping[ApiKey, Route] = ROUTES) -> None:
        self.context = context
        self._routes = {int(key): route for key, route in routes.items()}
        if context.router_in is not None:
            self._routes[_ZONE_ROUTER] = ZONE_ROUTER_ROUTE
        self._api_versions_max = self._routes[ApiKey.API_VERSIONS].max_version
        # Each listener's gate (None: no SASL there); a peer of no named listener (a server
        # a test built) gets the first listener's.
        specs = context.config.listener_specs
        gates = {spec.name: sasl.SaslGate.of(spec) for spec in specs}

        def credentials(mechanism: str, username: str) -> ScramCredential | None:
            # The followed image's, at each login (AlterUserScramCredentials writes them).
            return scram.credential_in(context.view.image.kv, mechanism, username)

        self._sasl = {
            name: None if gate is None else gate.with_credentials(credentials)
            for name, gate in gates.items()
        }
        self._sasl[""] = self._sasl[specs[0].name]

    async def admit(self, frame: bytes | bytearray, peer: Peer) -> Reply:
        if peer.session.muted_until_s and self.context.quotas is not None:
            await self.context.quotas.until_unmuted(peer)  # throttled: KIP-219's mute
        gate = self._sasl.get(peer.listener, self._sasl[""])
        if gate is not None and peer.session.sasl_step != sasl.AUTHENTICATED:
            # Before authentication: the gate answers, refuses, or lets ApiVersions through.
            answer = gate.admit(frame, peer, self._api_versions_max)
            if not isinstance(answer, sasl.Serve):
                return answer
        # peek_header reads with struct.unpack_from: any buffer does.
        api_key, api_version, correlation_id = peek_header(cast(bytes, frame))
        if api_key == _API_VERSIONS and api_version > self._api_versions_max:
            return api_versions.unsupported_version(correlation_id, api_version_table(self.context))
        route = self._routes.get(api_key)
        if route is None:
            kafkas = KAFKA_BROKER_APIS_NOT_SERVED.get(api_key)
            if (
                kafkas is not None
                and kafkas[0] <= api_version <= kafkas[1]
                and has_error_code(api_key, api_version)
            ):
                return self._unsupported(frame, peer, api_key, api_version, correlation_id)
            raise CloseConnection(
                f"the client sent {api_name(api_key)} (API key {api_key}), which this broker "
                "does not serve (it is not in its ApiVersions answer)",
                reason=f"api {api_key}",
                client_id=_client_id(frame),
            )
        if not route.min_version <= api_version <= route.max_version:
            raise CloseConnection(
                f"the client sent {api_name(api_key)} v{api_version}, a version this broker "
                f"does not serve (it serves v{route.min_version}-{route.max_version})",
                reason=f"api {api_key} v{api_version}",
                client_id=_client_id(frame),
            )
        body: Any
        try:
            if api_key == _PRODUCE and api_version >= PRODUCE_MIN_VERSION:
                # By hand: the records stay memoryview slices of the frame (no copy), writable
                # when the frame is a bytearray (the partition patches them in place).
                produce_header, body = decode_produce_frame(frame)
                client_id = produce_header.client_id
            elif api_key == _PARTITION_SNAPSHOT:
                _, _, client_id, body = decode_partition_snapshot_frame(frame)
                if self.context.snapshot_sessions is not None:
                    self.context.snapshot_sessions.bytes_in += 4 + len(frame)
            elif api_key == _ZONE_ROUTER:
                _, _, client_id, body = decode_zone_router_request(frame)
                if self.context.router_in is not None:  # routed here only then
                    self.context.router_in.bytes_in += 4 + len(frame)
            else:
                header, body = decode_request(bytes(frame))  # bytes: no copy
                client_id = header.client_id
        except (RequestDecodeError, FormatError) as error:
            log.debug("undecodable frame: %s", frame[:256].hex())
            raise CloseConnection(
                f"undecodable {api_name(api_key)} v{api_version} request: {error}",
                reason=f"undecodable {api_key}",
                client_id=_client_id(frame),
            ) from error
        request = Request(api_key, api_version, correlation_id, client_id, body, peer)
        return await route.handler(self.context, request)

    def _unsupported(
        self,
        frame: bytes | bytearray,
        peer: Peer,
        api_key: int,
        api_version: int,
        correlation_id: int,
    ) -> Reply:
        """An API a Kafka broker serves and this one does not: its response with
        ``UNSUPPORTED_VERSION`` (the body is not decoded), logged once per client."""
        name = api_name(api_key)
        unsupported_request(
            self.context.notices,
            f"api {api_key}",
            client_id=_client_id(frame),
            host=peer.host,
            api=name,
            error=KafkaErrorCode.UNSUPPORTED_VERSION.name,
            hint=f"the client sent {name} (API key {api_key}), which this broker does not "
            "serve (it is not in its ApiVersions answer)",
        )
        unsupported = KafkaErrorCode.UNSUPPORTED_VERSION
        encoded = encode_error_response(api_key, api_version, correlation_id, unsupported)
        return Answer(encoded, lambda: (unsupported,))


def _client_id(frame: bytes | bytearray) -> str | None:
    """The client id of a request header (v1 and v2 both put it after the correlation id), or
    None when the frame is too short to hold one: for the log, when the request is refused."""
    if len(frame) < 10:
        return None
    (length,) = struct.unpack_from(">h", frame, 8)
    if length < 0 or 10 + length > len(frame):
        return None
    return bytes(frame[10 : 10 + length]).decode("utf-8", "replace")
