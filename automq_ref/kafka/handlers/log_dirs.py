"""DescribeLogDirs: the broker's one log directory and the partitions it leads.

Kafka answers one result per directory of ``log.dirs`` with the partitions whose logs live there.
This broker keeps its partitions in shared storage, not in its log directory, but it has one
(``log.dirs``: the WAL, the metadata log, checkpoints), and each partition it leads is its
broker's replica: so one result, the directory's absolute path, listing every partition led
here (or those the request names: a null topic list is every one), each with its size (the bytes
of the batches it retains, by its batch index), an offset lag of 0 (the leader is the only
replica) and ``is_future_key`` false (no replica moves between directories). v4 adds the file
system's total and usable bytes (``shutil.disk_usage`` of the directory; Kafka's file store's
total and usable space). A directory that cannot be read is ``KAFKA_STORAGE_ERROR``, as Kafka
answers an offline directory. With an authorizer it needs DESCRIBE on the cluster, else no
result (and ``CLUSTER_AUTHORIZATION_FAILED`` from v3), as Kafka answers.
"""

from __future__ import annotations

import logging
import shutil

from automq_ref.errors import KafkaErrorCode
from automq_ref.kafka import responses as r
from automq_ref.kafka.handlers.authorize import AclOperation, cluster_allowed
from automq_ref.kafka.request import Context, Request
from automq_ref.kafka.server import Reply

log = logging.getLogger(__name__)


async def handle_describe_log_dirs(context: Context, request: Request) -> Reply:
    body = request.body
    if not cluster_allowed(context, request, AclOperation.DESCRIBE):
        denial = KafkaErrorCode.CLUSTER_AUTHORIZATION_FAILED
        return r.respond(request, r.DescribeLogDirsResponse([], denial))
    wanted: set[tuple[str, int]] | None = None
    if body.topics is not None:
        wanted = {(t.topic, int(index)) for t in body.topics for index in t.partitions}
    log_dir = str(context.config.data_dir.absolute())
    try:
        usage = shutil.disk_usage(log_dir)
    except OSError as error:
        log.warning("DescribeLogDirs: cannot read %s: %s", log_dir, error)
        result = r.DescribeLogDirsResult(log_dir, (), KafkaErrorCode.KAFKA_STORAGE_ERROR)
        return r.respond(request, r.DescribeLogDirsResponse([result]))
    by_topic: dict[str, list[r.DescribeLogDirsPartition]] = {}
    for (topic, index), partition in sorted(context.topics.partitions.items()):
        if wanted is not None and (topic, index) not in wanted:
            continue
        by_topic.setdefault(topic, []).append(
            # The bytes of the batches it retains, by its batch index.
            r.DescribeLogDirsPartition(index, sum(e.size_bytes for e in partition.batches))
        )
    topics = [r.DescribeLogDirsTopic(name, parts) for name, parts in by_topic.items()]
    result = r.DescribeLogDirsResult(
        log_dir, topics, total_bytes=usage.total, usable_bytes=usage.free
    )
    return r.respond(request, r.DescribeLogDirsResponse([result]))
