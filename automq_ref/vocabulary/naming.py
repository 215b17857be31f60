"""Naming rules: where the broker keeps things, so that every writer and every reader agrees.

One module for the names that are written by one part of the project and found again by another
(often another process: the ``automq-objects`` Spark source reads what a broker wrote). Each rule
says who writes under the name and who reads it; a change here is a change of the on-disk layout.

Object keys
    :data:`NAMESPACE` and :func:`object_key` name the objects in the object store.

Controller KV keys
    :func:`topic_key` (a topic's record), :func:`partition_key` (a partition's MetaStream),
    :data:`OFFSETS_STREAM_KEY` (the group coordinator's offsets stream; in a cluster, each
    broker's under :func:`node_offsets_stream_key`) and
    :data:`PRODUCER_ID_KEY` (the producer-id blocks handed out so far). The values under them
    are encoded by :mod:`automq_ref.formats` (``topic_record``, ``kv_integer``).

Pure: nothing here does I/O; ``uuid`` is needed only for a type.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

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
"""The KV key holding the id of the group coordinator's offsets stream.

Written by: the group coordinator when it first starts (it creates the stream). Read by: the
group coordinator at every later start, to replay the committed offsets."""


def node_offsets_stream_key(node_id: int) -> str:
    """The KV key holding the id of node ``node_id``'s own offsets stream, in a cluster.

    Written by: a broker of a cluster when its group coordinator first starts (until groups are
    placed on brokers, each broker coordinates the groups it is asked about, with offsets of
    its own; one stream shared by all would be fenced by every broker that opened it). Read
    by: that broker's group coordinator at every later start."""
    return f"{OFFSETS_STREAM_KEY}/node-{node_id}"


PRODUCER_ID_KEY: Final = "producer-ids/next"
"""The KV key holding the first producer id not yet handed out in a block.

Written by: the controller, when a node's producer-id allocator asks for a new block (the
StreamMetadata machine's ``AllocateProducerIds`` reads and advances it in one decision). Read by:
that same decision, to learn where the next block starts."""
