"""The handlers' side of the authorizer: the checks Kafka's ``KafkaApis`` makes before it serves
a request, shared by every handler (:mod:`automq_ref.kafka.acls` decides them,
:mod:`automq_ref.state_machines.acl` holds the rules).

Without an authorizer (``Context.acls`` None, the default) every check allows, after one
attribute test: :func:`allowed` is True, :func:`denied` empty, :func:`operations` the whole set
the resource type supports. A handler asks :func:`denied` once per request for the names it
holds (topics, groups), then answers the denied ones with the error of their resource type
(:data:`REFUSAL`), as Kafka answers each entry it filtered out; :func:`cluster_operation` wraps a
handler that needs one operation on the cluster, answered whole with
``CLUSTER_AUTHORIZATION_FAILED`` in the API's error response otherwise.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Final

from automq_ref.errors import KafkaErrorCode
from automq_ref.kafka.request import Context, Handler, Request
from automq_ref.kafka.server import Reply
from automq_ref.protocol.kio_codec import encode_error_response
from automq_ref.state_machines.acl import (
    CLUSTER_NAME,
    SUPPORTED_OPERATIONS,
    AclOperation,
    ResourceType,
    bit_field,
)

__all__ = [
    "REFUSAL",
    "AclOperation",
    "ResourceType",
    "allowed",
    "cluster_allowed",
    "cluster_operation",
    "cluster_refusal",
    "denied",
    "may_init",
    "operations",
]

# The error a denied entry is answered with, by its resource type (Kafka's AclEntry).
REFUSAL: Final[Mapping[ResourceType, KafkaErrorCode]] = {
    ResourceType.TOPIC: KafkaErrorCode.TOPIC_AUTHORIZATION_FAILED,
    ResourceType.GROUP: KafkaErrorCode.GROUP_AUTHORIZATION_FAILED,
    ResourceType.CLUSTER: KafkaErrorCode.CLUSTER_AUTHORIZATION_FAILED,
    ResourceType.TRANSACTIONAL_ID: KafkaErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
}

# Every operation a resource type supports: the answer without an authorizer.
_ALL_OPERATIONS: Final = {kind: bit_field(ops) for kind, ops in SUPPORTED_OPERATIONS.items()}


def allowed(
    context: Context,
    request: Request,
    operation: AclOperation,
    resource_type: ResourceType,
    name: str,
) -> bool:
    """Whether the request's principal may perform ``operation`` on the resource."""
    acls = context.acls
    return acls is None or acls.authorize(request.peer, operation, resource_type, name)


def cluster_allowed(context: Context, request: Request, operation: AclOperation) -> bool:
    """Whether the request's principal may perform ``operation`` on the cluster."""
    return allowed(context, request, operation, ResourceType.CLUSTER, CLUSTER_NAME)


def denied(
    context: Context,
    request: Request,
    operation: AclOperation,
    resource_type: ResourceType,
    names: Iterable[str | None],
) -> frozenset[str]:
    """The names of ``names`` the principal may not perform ``operation`` on (each decided
    once; None, an unresolved topic id, is left out)."""
    acls = context.acls
    if acls is None:
        return frozenset()
    peer = request.peer
    return frozenset(
        name
        for name in {name for name in names if name is not None}
        if not acls.authorize(peer, operation, resource_type, name)
    )


def operations(context: Context, request: Request, resource_type: ResourceType, name: str) -> int:
    """The KIP-430 bit field of what the principal may do on the resource."""
    acls = context.acls
    if acls is None:
        return _ALL_OPERATIONS[resource_type]
    return acls.authorized_operations(request.peer, resource_type, name)


def may_init(context: Context, request: Request, transactional_id: str | None) -> bool:
    """Whether InitProducerId is allowed (transactional id WRITE; for an idempotent producer
    cluster IDEMPOTENT_WRITE or WRITE on some topic)."""
    acls = context.acls
    return acls is None or acls.may_init_producer_id(request.peer, transactional_id)


def cluster_operation(operation: AclOperation) -> functools.partial[Handler]:
    """A decorator: the handler runs when the principal may perform ``operation`` on the
    cluster; else the API's error response (its top-level ``error_code``
    CLUSTER_AUTHORIZATION_FAILED, the rest empty), as Kafka's ``authorizeClusterOperation``."""
    return functools.partial(_guarded, operation)


def _guarded(operation: AclOperation, handler: Handler) -> Handler:
    @functools.wraps(handler)
    async def guarded(context: Context, request: Request) -> Reply:
        if cluster_allowed(context, request, operation):
            return await handler(context, request)
        return cluster_refusal(request)

    return guarded


def cluster_refusal(request: Request) -> Reply:
    """The request's error response with CLUSTER_AUTHORIZATION_FAILED."""
    return encode_error_response(
        request.api_key,
        request.api_version,
        request.correlation_id,
        KafkaErrorCode.CLUSTER_AUTHORIZATION_FAILED,
    )
