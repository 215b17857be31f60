"""Authorized operations (KIP-430): the bit fields Metadata, DescribeCluster and DescribeGroups
answer when a client asks which operations it may perform on a topic, the cluster or a group.

Without an authorizer (this broker's default, see :mod:`automq_ref.state_machines.acl`) every
client may perform every operation a resource type supports; the answer is that whole set, as a
bit field over the operations' protocol codes (bit ``code`` set for each operation). Clients
count the bits (a topic has 8 operations), so the sets are exactly the protocol's per resource
type (:data:`automq_ref.state_machines.acl.SUPPORTED_OPERATIONS`, where the operation codes
live too; with the authorizer on, :func:`automq_ref.state_machines.acl.authorized_operations`
answers the allowed ones). When the client did not ask, the field carries
:data:`automq_ref.kafka.responses.AUTHORIZED_OPERATIONS_OMITTED` instead.
"""

from __future__ import annotations

from automq_ref.state_machines.acl import (
    SUPPORTED_OPERATIONS,
    AclOperation,
    ResourceType,
    bit_field,
)

__all__ = [
    "CLUSTER_OPERATIONS",
    "GROUP_OPERATIONS",
    "TOPIC_OPERATIONS",
    "AclOperation",
    "bit_field",
]

# The operations each resource type supports (the token operations belong to users, not here).
TOPIC_OPERATIONS = bit_field(SUPPORTED_OPERATIONS[ResourceType.TOPIC])
CLUSTER_OPERATIONS = bit_field(SUPPORTED_OPERATIONS[ResourceType.CLUSTER])
GROUP_OPERATIONS = bit_field(SUPPORTED_OPERATIONS[ResourceType.GROUP])
