"""Naming rules: where the broker keeps things, so that every writer and every reader agrees.

One module for the names that are written by one part of the project and found again by another
(often another process: the ``automq-objects`` Spark source reads what a broker wrote). Each rule
says who writes under the name and who reads it; a change here is a change of the on-disk layout.

Object keys
    :data:`NAMESPACE` and :func:`object_key` name the objects in the object store;
    :func:`wal_object_key` (with :func:`wal_objects_prefix` and :func:`parse_wal_object_key`)
    the object WAL's objects and :func:`wal_reservation_key` its reservation object, for the
    data WAL and (with :data:`ROUTER_CHANNEL_WAL_TYPE`) for the zone router's RouterChannel.

Controller KV keys
    :func:`topic_key` (a topic's record), :func:`partition_key` (a partition's MetaStream),
    :data:`OFFSETS_STREAM_KEY` and :func:`node_offsets_stream_key` (the offsets streams of
    earlier versions, imported once into ``__consumer_offsets``; :func:`offsets_imported_key`
    marks each partition done) and
    :data:`PRODUCER_ID_KEY` (the producer-id blocks handed out so far), :func:`acl_key` (one
    ACL binding each), :func:`scram_credential_key` (a user's SCRAM credential for one
    mechanism), and the zone router's
    :data:`ROUTE_EPOCH_KEY` and :func:`node_committed_route_epoch_key`. The values under them
    are encoded by :mod:`automq_ref.formats` (``topic_record``, ``kv_integer``,
    ``route_epoch_record``, ``acl_record``, ``scram_credential``).

Topics
    :data:`CONSUMER_OFFSETS_TOPIC`, the internal topic that holds the groups' committed
    offsets, and :func:`is_internal_topic`.

Pure: nothing here does I/O; ``uuid`` is needed only for a type.
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Final
from urllib.parse import quote, unquote

if TYPE_CHECKING:
    import uuid

# ------------------------------------------------------------------------------ objects

NAMESPACE: Final = "_kafka_automq_ref"
"""The namespace in every object key of a broker's objects.

Written by: the broker's storage when it uploads objects (``S3Storage``, given it by the broker).
Read by: the broker's reads from objects, the controller's object lifecycle when it deletes
objects, and the ``automq-objects`` Spark source (:mod:`automq_ref.spark.image`)."""


def object_key(namespace: str, object_id: int) -> str:
    """The object store key of object ``object_id``: AutoMQ's
    ``reverse(hex8(id)) + "/" + namespace + "/" + id``; the reversed hex spreads keys over S3
    prefixes.

    Written by: the upload of a cache block's objects (:mod:`automq_ref.io.storage.stream_objects`).
    Read by: every read from objects (the broker's and the Spark source's) and the controller's
    object lifecycle (deletes)."""
    return f"{f'{object_id:08x}'[::-1]}/{namespace}/{object_id}"


ROUTER_CHANNEL_WAL_TYPE: Final = "rc"
"""The WAL type of a node's RouterChannel (the zone router's channel): its object WAL's keys
carry ``<node>_rc`` where the node's data WAL carries ``<node>``, so the two never share an
object, a listing or a reservation."""


def _wal_node(node_id: int, wal_type: str) -> str:
    if wal_type and not re.fullmatch(r"[a-z]+", wal_type):
        raise ValueError(f"WAL type {wal_type!r} is not lowercase letters")
    return f"{node_id}_{wal_type}" if wal_type else str(node_id)


def wal_objects_prefix(namespace: str, node_id: int, wal_type: str = "") -> str:
    """The key prefix of every WAL object of node ``node_id``, all epochs:
    ``MD5HEX(str(node_id)).upper() + "/" + namespace + "/" + node_id[_type] + "/"``, AutoMQ's
    layout with the namespace in place of ``_kafka_<clusterId>``; the hash spreads nodes over S3
    prefixes. ``wal_type`` is empty for the node's data WAL and :data:`ROUTER_CHANNEL_WAL_TYPE`
    for its RouterChannel; the hash is of the node id alone either way.

    Written by: nobody (a prefix). Read by: the object WAL when it opens a node's WAL (its own,
    or a failed node's in a takeover) and lists the node's objects."""
    digest = hashlib.md5(str(node_id).encode(), usedforsecurity=False).hexdigest().upper()
    return f"{digest}/{namespace}/{_wal_node(node_id, wal_type)}/"


def wal_object_key(
    namespace: str, node_id: int, epoch: int, start: int, end: int, wal_type: str = ""
) -> str:
    """The key of the WAL object of node ``node_id`` written at node epoch ``epoch`` holding
    WAL offsets ``[start, end)``: ``<prefix><epoch>/wal/<start>-<end>`` (the prefix of
    :func:`wal_objects_prefix`, of the data WAL or, with ``wal_type``, of the RouterChannel).

    Written by: the object WAL when it uploads a batch of records
    (:mod:`automq_ref.io.storage.wal_object`). Read by: the object WAL's recovery (its own
    node's after a restart, or a survivor's in a takeover), which finds the keys by listing
    :func:`wal_objects_prefix` and reads offsets and epochs back with
    :func:`parse_wal_object_key`; deleted by its trims. A RouterChannel's objects are also read
    by any node without listing (:mod:`automq_ref.io.storage.router_channel`): every object
    spans exactly one 64 MiB slot, so the key of the object holding an offset follows from the
    owner, the epoch and the offset."""
    return f"{wal_objects_prefix(namespace, node_id, wal_type)}{epoch}/wal/{start}-{end}"


_WAL_OBJECT_SUFFIX = re.compile(r"(\d+)/wal/(\d+)-(\d+)")


def parse_wal_object_key(prefix: str, key: str) -> tuple[int, int, int] | None:
    """``(epoch, start, end)`` of a key :func:`wal_object_key` made under ``prefix``, or None
    for any other key."""
    if not key.startswith(prefix):
        return None
    match = _WAL_OBJECT_SUFFIX.fullmatch(key, len(prefix))
    if match is None:
        return None
    epoch, start, end = (int(group) for group in match.groups())
    return (epoch, start, end) if start < end else None


def wal_reservation_key(namespace: str, node_id: int, wal_type: str = "") -> str:
    """The key of node ``node_id``'s WAL reservation object: ``reservation/<namespace>/<id>``
    for the data WAL, ``reservation/<namespace>/<id>_<type>`` for a RouterChannel (its own, so
    that a takeover of the data WAL does not fence the channel, nor the channel the WAL).

    Written by: the object WAL when it opens the node's WAL (the node itself, or a survivor
    taking it over, which overwrites it). Read by: the object WAL after every group of uploads,
    to check that the WAL is still its own."""
    return f"reservation/{namespace}/{_wal_node(node_id, wal_type)}"


# ---------------------------------------------------------------------- controller KV

TOPIC_KEY_PREFIX: Final = "topics/"


def topic_key(name: str) -> str:
    """The KV key of topic ``name``'s record (id, partition count, configs).

    Written by: the broker when it creates a topic (after its partitions exist) or changes its
    configs; deleted before its partitions are. Read by: the broker at start-up and the Spark
    source, both through :func:`automq_ref.formats.topic_record.topics_in`."""
    return TOPIC_KEY_PREFIX + name


def topic_name(key: str) -> str | None:
    """The topic a KV key names, or None when ``key`` is not a topic key."""
    return key[len(TOPIC_KEY_PREFIX) :] if key.startswith(TOPIC_KEY_PREFIX) else None


PARTITION_KEY_PREFIX: Final = "partitions/"


def partition_key(topic_id: uuid.UUID, index: int) -> str:
    """The KV key holding the MetaStream id of partition ``index`` of topic ``topic_id``.

    Written by: the broker when it creates a partition (last, after both its streams exist);
    deleted when the partition is. Read by: the broker when it opens the partition, and the
    Spark source when it resolves the partition's data stream."""
    return f"{PARTITION_KEY_PREFIX}{topic_id}/{index}"


OFFSETS_STREAM_KEY: Final = "groups/offsets-stream"
"""The KV key holding the id of a single node's offsets stream, from before the groups' offsets
moved to ``__consumer_offsets``.

Written by: earlier versions' group coordinator when it first started (it created the stream).
Read by: the group coordinator's import (:mod:`automq_ref.kafka.group_import`), which copies the
offsets into ``__consumer_offsets`` once, then deletes the stream and this key."""


def node_offsets_stream_key(node_id: int) -> str:
    """The KV key holding the id of node ``node_id``'s own offsets stream, written by a broker
    of a cluster of an earlier version (each broker then kept the offsets of the groups it was
    asked about).

    Written by: nothing any more. Read by: the group coordinator's import, as
    :data:`OFFSETS_STREAM_KEY`."""
    return f"{OFFSETS_STREAM_KEY}/node-{node_id}"


def is_offsets_stream_key(key: str) -> bool:
    """Whether ``key`` is :data:`OFFSETS_STREAM_KEY` or a :func:`node_offsets_stream_key`."""
    return key == OFFSETS_STREAM_KEY or key.startswith(f"{OFFSETS_STREAM_KEY}/node-")


OFFSETS_IMPORTED_PREFIX: Final = "groups/offsets-imported/"


def offsets_imported_key(stream_id: int, partition: int) -> str:
    """The KV key saying that partition ``partition`` of ``__consumer_offsets`` has imported the
    offsets of old offsets stream ``stream_id`` (its value is empty).

    Written by: the group coordinator partition's broker once the imported offsets are durable
    in the partition. Read by: the same import, to import each stream into each partition once
    and to delete the stream once every partition has; deleted with the stream."""
    return f"{OFFSETS_IMPORTED_PREFIX}{stream_id}/{partition}"


PRODUCER_ID_KEY: Final = "producer-ids/next"
"""The KV key holding the first producer id not yet handed out in a block.

Written by: the controller, when a node's producer-id allocator asks for a new block (the
StreamMetadata machine's ``AllocateProducerIds`` reads and advances it in one decision). Read by:
that same decision, to learn where the next block starts."""


ACL_KEY_PREFIX: Final = "acls/"


def acl_key(digest: str) -> str:
    """The KV key of one ACL binding: ``acls/`` and the SHA-256 (hex) of its record's value
    (:func:`automq_ref.formats.acl_record.acl_record_key`), so that one binding has one key
    whichever broker writes it, and writing it twice is a put-if-absent that finds it.

    Written by: the broker serving CreateAcls (put-if-absent) and DeleteAcls (compare-and-delete
    on the value it read), through the controller (:mod:`automq_ref.kafka.acls`). Read by: every
    broker's ACL table, from its followed image (:func:`automq_ref.kafka.acls.acls_in`), for
    DescribeAcls and the authorizer's decisions."""
    return ACL_KEY_PREFIX + digest


SCRAM_KEY_PREFIX: Final = "scram/"


def scram_credential_key(mechanism: str, username: str) -> str:
    """The KV key of user ``username``'s credential for SCRAM mechanism ``mechanism``
    (``SCRAM-SHA-256`` or ``SCRAM-SHA-512``): ``scram/<mechanism>/<username>``, the username
    percent-encoded (``/`` and ``%`` too), so every name has one key and no key two names.

    Written by: the broker serving AlterUserScramCredentials (compare-and-set, compare-and-delete
    on the value it read), through the controller (:mod:`automq_ref.kafka.handlers.scram`).
    Read by: every broker from its followed image, for DescribeUserScramCredentials and for a
    SCRAM login on a SASL listener (:mod:`automq_ref.kafka.sasl`); the value is
    :mod:`automq_ref.formats.scram_credential`'s."""
    return f"{SCRAM_KEY_PREFIX}{mechanism}/{quote(username, safe='')}"


def parse_scram_credential_key(key: str) -> tuple[str, str] | None:
    """``(mechanism, username)`` of a :func:`scram_credential_key`, or None for another key
    (or one no username encodes to)."""
    if not key.startswith(SCRAM_KEY_PREFIX):
        return None
    mechanism, slash, encoded = key[len(SCRAM_KEY_PREFIX) :].partition("/")
    if not slash or not mechanism or not encoded:
        return None
    try:
        username = unquote(encoded, errors="strict")
    except UnicodeDecodeError:
        return None
    return (mechanism, username) if quote(username, safe="") == encoded else None


# ----------------------------------------------------------------------------- topics

CONSUMER_OFFSETS_TOPIC: Final = "__consumer_offsets"
"""The internal topic holding the groups' committed offsets (Kafka's name): a group's records go
to partition ``abs(hash(group id)) % partitions``
(:func:`automq_ref.kafka.coordinator_topic.coordinator_partition`), whose broker is its coordinator.

Written by: the group coordinator (created by any broker, at its first group request; records
appended by the broker leading each partition). Read by: the same partition's broker when it
takes the partition (the coordinator's state is replayed from it), and Metadata (listed as
internal)."""

TRANSACTION_STATE_TOPIC: Final = "__transaction_state"
"""The internal topic holding the transaction coordinators' log (Kafka's name): a transactional
id's records go to partition ``abs(hash(transactional id)) % partitions``, whose broker is its
transaction coordinator.

Written by: the transaction coordinator (created by any broker, at its first transactional
request; records appended by the broker leading each partition). Read by: the same partition's
broker when it takes the partition (the coordinator's state is replayed from it), and Metadata
(listed as internal)."""

_INTERNAL_TOPICS: Final = frozenset({CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})


def is_internal_topic(name: str | None) -> bool:
    """Whether ``name`` is an internal topic: clients may not produce to it, delete it or grow
    it."""
    return name in _INTERNAL_TOPICS


FAILOVER_CONTEXTS_KEY: Final = "__a.failover"
"""The KV key of the crash failovers in flight (AutoMQ's key): a JSON list, one object per
failed node, ``{"nodeId", "nodeEpoch", "target", "walConfig"}``.

Written by: the active controller's failover round
(:mod:`automq_ref.io.metadata.failover_contexts`), with a compare-and-set. Read by: every
broker's failover runner (:mod:`automq_ref.io.storage.failover_runner`), which takes over the
WAL of a failed node when it is the target."""


ROUTE_EPOCH_KEY: Final = "__a_r_c/metadata"
"""The KV key of the zone router's route-epoch record (AutoMQ's key): committed, fenced and
current route epoch and the time of the last bump (:mod:`automq_ref.formats.route_epoch_record`).

Written by: the active controller's route-epoch round
(:mod:`automq_ref.io.metadata.route_epochs`), with a compare-and-set. Read by: every broker's
route-epoch node (:mod:`automq_ref.io.storage.route_epoch_node`), which fences old epochs,
tags new routed writes and trims its RouterChannel from it."""

NODE_COMMITTED_ROUTE_EPOCH_PREFIX: Final = "__a_r_c_nce/"


def node_committed_route_epoch_key(node_id: int) -> str:
    """The KV key of node ``node_id``'s committed route epoch (AutoMQ's
    ``__a_r_c_nce/<nodeId>``), a decimal integer.

    Written by: that node's route-epoch loop, after an upload of its LogCache
    (:mod:`automq_ref.io.storage.route_epoch_node`). Read by: the active controller's
    route-epoch round, which publishes the minimum of the counted nodes' reports."""
    return f"{NODE_COMMITTED_ROUTE_EPOCH_PREFIX}{node_id}"
