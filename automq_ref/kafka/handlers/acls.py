"""DescribeAcls (29), CreateAcls (30) and DeleteAcls (31), v1-3, as Kafka 4.0's ``AclApis`` over
its StandardAuthorizer answers them; the bindings are the cluster's (:mod:`automq_ref.kafka.acls`),
the rules :mod:`automq_ref.state_machines.acl`'s.

In Kafka's order, per request:

1. a filter or creation with a type of code 0 (UNKNOWN) closes the connection: Kafka's request
   classes refuse to parse one (``contains UNKNOWN elements``), and its listener closes a
   connection whose request does not parse;
2. without an authorizer (``Context.acls`` None: ``authorizer.class.name`` empty, the default)
   the answer is SECURITY_DISABLED: DescribeAcls ``No Authorizer is configured on the
   broker``, every creation and filter ``No Authorizer is configured.``;
3. the client needs DESCRIBE (DescribeAcls) or ALTER (CreateAcls, DeleteAcls) on the cluster,
   else CLUSTER_AUTHORIZATION_FAILED (every creation, every filter);
4. CreateAcls: a creation whose resource type is ANY, pattern type ANY or MATCH, operation or
   permission ANY fails the whole request with UNKNOWN_SERVER_ERROR and no message (Kafka's
   binding classes throw on building it, outside the per-creation checks); otherwise each
   creation is checked (:func:`automq_ref.state_machines.acl.creation_error`: INVALID_REQUEST
   with Kafka's message, e.g. a principal that is not ``Type:name``), the valid ones written.
   Creating a binding that exists succeeds. A PREFIXED pattern named ``*`` is a binding like
   any other (it matches names that start with ``*``), as in Kafka;
5. DeleteAcls: a filter with a field of a code Kafka does not know is INVALID_REQUEST
   (``Unknown patternFilter.`` / ``Unknown entryFilter.``); the others delete what they match
   and list it. DescribeAcls answers the matched bindings grouped by resource pattern (a filter
   with an unknown code matches nothing, as in Kafka).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from automq_ref.errors import KafkaErrorCode
from automq_ref.kafka.acls import host_of, principal_of
from automq_ref.kafka.handlers.authorize import cluster_allowed
from automq_ref.kafka.request import ApiKey, Context, Request
from automq_ref.kafka.responses import Response, respond
from automq_ref.kafka.server import CloseConnection, Reply
from automq_ref.state_machines import acl

NONE = KafkaErrorCode.NONE
NO_AUTHORIZER = "No Authorizer is configured."
NO_AUTHORIZER_DESCRIBE = "No Authorizer is configured on the broker"

# ------------------------------------------------------------------------- typed responses


@dataclass(frozen=True, slots=True)
class AclDescription:
    principal: str
    host: str
    operation: int
    permission_type: int


@dataclass(frozen=True, slots=True)
class DescribeAclsResource:
    resource_type: int
    resource_name: str
    pattern_type: int
    acls: Sequence[AclDescription]


@dataclass(frozen=True, slots=True)
class DescribeAclsResponse(Response):
    API_KEY = ApiKey.DESCRIBE_ACLS
    resources: Sequence[DescribeAclsResource] = ()
    error_code: KafkaErrorCode = NONE
    error_message: str | None = None
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class AclCreationResult:
    error_code: KafkaErrorCode = NONE
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class CreateAclsResponse(Response):
    API_KEY = ApiKey.CREATE_ACLS
    results: Sequence[AclCreationResult]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class DeleteAclsMatchingAcl:
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int
    error_code: KafkaErrorCode = NONE
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class DeleteAclsFilterResult:
    matching_acls: Sequence[DeleteAclsMatchingAcl] = ()
    error_code: KafkaErrorCode = NONE
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class DeleteAclsResponse(Response):
    API_KEY = ApiKey.DELETE_ACLS
    filter_results: Sequence[DeleteAclsFilterResult]
    throttle_time: int = 0


# ----------------------------------------------------------------------------- the checks


def _unparsable(request: Request, fields: Sequence[Any], what: str) -> None:
    """Close the connection when a filter or creation holds a type of code 0 (Kafka's request
    classes do not parse one)."""
    for item in fields:
        if 0 in (int(code) for code in item):
            raise CloseConnection(
                f"the client sent {what} with an UNKNOWN (0) type, which Kafka's brokers do "
                "not parse (the connection is closed, as Kafka closes it)",
                reason=f"api {request.api_key} unknown elements",
                client_id=request.client_id,
            )


def _refusal(
    context: Context,
    request: Request,
    operation: acl.AclOperation,
    no_authorizer: str = NO_AUTHORIZER,
) -> tuple[KafkaErrorCode, str | None] | None:
    """Why the client may not use this API, or None: SECURITY_DISABLED without an authorizer,
    CLUSTER_AUTHORIZATION_FAILED without ``operation`` on the cluster. Every entry of the
    request is answered with it."""
    if context.acls is None:
        return KafkaErrorCode.SECURITY_DISABLED, no_authorizer
    if cluster_allowed(context, request, operation):
        return None
    peer = request.peer
    return KafkaErrorCode.CLUSTER_AUTHORIZATION_FAILED, (
        f"Request {type(request.body).__name__} from {principal_of(peer)} at {host_of(peer)} "
        f"is not authorized ({operation.name} on the cluster)."
    )


def _filter(item: Any) -> acl.AclFilter:
    return acl.AclFilter(
        resource_type=acl.of_code(acl.ResourceType, int(item.resource_type_filter)),
        name=item.resource_name_filter,
        pattern_type=acl.of_code(acl.PatternType, int(item.pattern_type_filter)),
        principal=item.principal_filter,
        host=item.host_filter,
        operation=acl.of_code(acl.AclOperation, int(item.operation)),
        permission=acl.of_code(acl.AclPermissionType, int(item.permission_type)),
    )


def _filter_codes(item: Any) -> tuple[int, ...]:
    return (
        int(item.pattern_type_filter),
        int(item.resource_type_filter),
        int(item.operation),
        int(item.permission_type),
    )


# ------------------------------------------------------------------------------ the handlers


async def handle_describe_acls(context: Context, request: Request) -> Reply:
    body = request.body
    _unparsable(request, [_filter_codes(body)], "DescribeAcls")
    refusal = _refusal(context, request, acl.AclOperation.DESCRIBE, NO_AUTHORIZER_DESCRIBE)
    if refusal is not None:
        code, message = refusal
        return respond(request, DescribeAclsResponse(error_code=code, error_message=message))
    acls = context.acls
    assert acls is not None  # _refusal answers without one
    resources = [
        DescribeAclsResource(
            *pattern,
            acls=[
                AclDescription(b.principal, b.host, int(b.operation), int(b.permission))
                for b in bindings
            ],
        )
        for pattern, bindings in itertools.groupby(
            acls.table().matching(_filter(body)),
            key=lambda b: (int(b.resource_type), b.name, int(b.pattern_type)),
        )
    ]
    return respond(request, DescribeAclsResponse(resources))


def _creation_codes(item: Any) -> tuple[int, ...]:
    return (
        int(item.resource_pattern_type),
        int(item.resource_type),
        int(item.permission_type),
        int(item.operation),
    )


def _unbuildable(item: Any) -> bool:
    """Whether Kafka's binding classes refuse to build this creation (ANY or MATCH where a
    concrete value belongs)."""
    return (
        int(item.resource_type) == acl.ResourceType.ANY
        or int(item.resource_pattern_type) in (acl.PatternType.ANY, acl.PatternType.MATCH)
        or int(item.operation) == acl.AclOperation.ANY
        or int(item.permission_type) == acl.AclPermissionType.ANY
    )


def _binding(item: Any) -> acl.AclBinding:
    return acl.AclBinding(
        resource_type=acl.of_code(acl.ResourceType, int(item.resource_type)),
        name=item.resource_name,
        pattern_type=acl.of_code(acl.PatternType, int(item.resource_pattern_type)),
        principal=item.principal,
        host=item.host,
        operation=acl.of_code(acl.AclOperation, int(item.operation)),
        permission=acl.of_code(acl.AclPermissionType, int(item.permission_type)),
    )


async def handle_create_acls(context: Context, request: Request) -> Reply:
    creations = request.body.creations
    _unparsable(request, [_creation_codes(item) for item in creations], "CreateAcls")
    refusal = _refusal(context, request, acl.AclOperation.ALTER)
    if refusal is None and any(_unbuildable(item) for item in creations):
        refusal = KafkaErrorCode.UNKNOWN_SERVER_ERROR, None
    if refusal is not None:
        results = [AclCreationResult(*refusal) for _ in creations]
        return respond(request, CreateAclsResponse(results))
    acls = context.acls
    assert acls is not None  # _refusal answers without one
    bindings = [_binding(item) for item in creations]
    errors = [acl.creation_error(binding) for binding in bindings]
    valid = [binding for binding, error in zip(bindings, errors, strict=True) if error is None]

    async def answer() -> Any:
        written = iter(await acls.create(context.controller_client, valid))
        results = [
            AclCreationResult(KafkaErrorCode.INVALID_REQUEST, error)
            if error is not None
            else AclCreationResult(*next(written))
            for error in errors
        ]
        return respond(request, CreateAclsResponse(results))

    return answer()


def _matching(deleted: Any) -> DeleteAclsMatchingAcl:
    binding = deleted.binding
    return DeleteAclsMatchingAcl(
        resource_type=int(binding.resource_type),
        resource_name=binding.name,
        pattern_type=int(binding.pattern_type),
        principal=binding.principal,
        host=binding.host,
        operation=int(binding.operation),
        permission_type=int(binding.permission),
        error_code=deleted.error,
        error_message=deleted.message,
    )


async def handle_delete_acls(context: Context, request: Request) -> Reply:
    items = request.body.filters
    _unparsable(request, [_filter_codes(item) for item in items], "DeleteAcls")
    refusal = _refusal(context, request, acl.AclOperation.ALTER)
    if refusal is not None:
        code, message = refusal
        results = [DeleteAclsFilterResult(error_code=code, error_message=message) for _ in items]
        return respond(request, DeleteAclsResponse(results))
    acls = context.acls
    assert acls is not None  # _refusal answers without one
    filters = [_filter(item) for item in items]
    errors = [acl.filter_error(acl_filter) for acl_filter in filters]
    valid = [f for f, error in zip(filters, errors, strict=True) if error is None]

    async def answer() -> Any:
        deleted = iter(await acls.delete(context.controller_client, valid))
        results = [
            DeleteAclsFilterResult(error_code=KafkaErrorCode.INVALID_REQUEST, error_message=error)
            if error is not None
            else DeleteAclsFilterResult([_matching(found) for found in next(deleted)])
            for error in errors
        ]
        return respond(request, DeleteAclsResponse(results))

    return answer()
