"""Authorized operations (KIP-430): the bit fields Metadata, DescribeCluster and DescribeGroups
answer when a client asks which operations it may perform on a topic, the cluster or a group.

This broker has no authorizer, so every client may perform every operation a resource type
supports; the answer is that whole set, as a bit field over the operations' protocol codes (bit
``code`` set for each operation). Clients count the bits (a topic has 8 operations), so the sets
are exactly the protocol's per resource type. When the client did not ask, the field carries
:data:`automq_ref.kafka.responses.AUTHORIZED_OPERATIONS_OMITTED` instead.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable


class AclOperation(enum.IntEnum):
    """The protocol's ACL operation codes (0 UNKNOWN, 1 ANY, 2 ALL: filters, never granted)."""

    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


def bit_field(operations: Iterable[AclOperation]) -> int:
    """``operations`` as a 32-bit field: bit ``code`` set for each."""
    field = 0
    for operation in operations:
        field |= 1 << operation.value
    return field


_Op = AclOperation

# The operations each resource type supports (the token operations belong to users, not here).
TOPIC_OPERATIONS = bit_field(
    (
        _Op.READ,
        _Op.WRITE,
        _Op.CREATE,
        _Op.DELETE,
        _Op.ALTER,
        _Op.DESCRIBE,
        _Op.DESCRIBE_CONFIGS,
        _Op.ALTER_CONFIGS,
    )
)
CLUSTER_OPERATIONS = bit_field(
    (
        _Op.CREATE,
        _Op.ALTER,
        _Op.DESCRIBE,
        _Op.CLUSTER_ACTION,
        _Op.DESCRIBE_CONFIGS,
        _Op.ALTER_CONFIGS,
        _Op.IDEMPOTENT_WRITE,
    )
)
GROUP_OPERATIONS = bit_field((_Op.READ, _Op.DELETE, _Op.DESCRIBE))
