"""Kafka's ACLs, decided: the rules of Kafka's ``StandardAuthorizer`` (KRaft's authorizer,
``authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer``) as pure
functions over a set of ACL bindings, and the binding filters of DescribeAcls and DeleteAcls.

Pure: no asyncio, I/O, clock or logging. Where the bindings are kept (the controller KV) and how
a broker reads them is :mod:`automq_ref.kafka.acls`'; the admin APIs are
:mod:`automq_ref.kafka.handlers.acls`.

*A binding* (:class:`AclBinding`) says: principal P is ALLOWed or DENYed operation O from host H
on the resources of type T matching a pattern (a LITERAL name, the LITERAL wildcard ``*``, or a
PREFIXED name). Principals are ``Type:name`` (``User:alice``); ``User:*`` is every principal;
host ``*`` is every host, any other host an exact address.

*The decision* (:func:`decide`, :func:`authorize`), for a principal from a host asking an
operation on one resource (type and name):

1. a super user (``super.users``: the principal's ``Type:name`` listed) is allowed anything;
2. the bindings that *apply* are those of the resource's type whose pattern matches its name:
   LITERAL with the same name, LITERAL ``*``, PREFIXED with a name the resource's starts with;
3. of those, a binding *matches* when its principal is the client's or ``User:*``, its host is
   ``*`` or the client's, and its operation covers the one asked: ALL covers every operation; a
   binding of the operation itself covers it; and, for ALLOW bindings only (a DENY of READ does
   not deny DESCRIBE), READ, WRITE, DELETE and ALTER imply DESCRIBE, ALTER_CONFIGS implies
   DESCRIBE_CONFIGS;
4. a matching DENY denies, whatever else matches; else a matching ALLOW allows;
5. else, when no binding applies to the resource at all, ``allow.everyone.if.no.acl.found``
   decides (default: deny); when some apply but none matches, denied.

With the authorizer off (:attr:`AuthorizerSettings.enabled` False, Kafka's default of an empty
``authorizer.class.name``) everything is allowed, as Kafka's brokers allow everything without
an authorizer.

*By resource type* (:func:`authorize_by_resource_type`, KIP-679): whether the principal may
perform an operation on *some* resource of a type, as Kafka's ``Authorizer``'s default
``authorizeByResourceType`` decides it (implied operations play no part there). An idempotent
producer's InitProducerId (:func:`may_init_producer_id`) needs IDEMPOTENT_WRITE on the cluster
or WRITE on some topic; a transactional one WRITE on its transactional id.

*Authorized operations* (:func:`authorized_operations`, KIP-430): the bit field of the
operations of :data:`SUPPORTED_OPERATIONS` for the resource's type that :func:`authorize` allows.

*Filters* (:class:`AclFilter`, :func:`filter_matches`): Kafka's ``AclBindingFilter``. A None
name, principal or host matches anything; resource type ANY, operation ANY and permission ANY
match anything; pattern type ANY matches any pattern type (a name then matches the same name
only), MATCH matches every pattern that would apply to a resource of that name (the same
literal name, the literal ``*``, a prefix of it), LITERAL or PREFIXED that pattern type with
the same name. An UNKNOWN field matches nothing. DescribeAcls answers the bindings a filter
matches; DeleteAcls deletes them.

*Validation* (:func:`creation_error`, :func:`filter_error`): Kafka 4.0's refusals of a new
binding (``AclApis`` and the controller's ``AclControlManager.validateNewAcl``) and of a filter
(``validateFilter``), as the messages of INVALID_REQUEST.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final, TypeVar


class ResourceType(enum.IntEnum):
    """Kafka's resource type codes (``ResourceType``)."""

    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    """Kafka's resource pattern type codes (``PatternType``); ANY and MATCH are for filters."""

    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(enum.IntEnum):
    """Kafka's ACL operation codes (``AclOperation``): UNKNOWN and ANY are for filters, ALL is
    every operation (in a binding), the rest are the operations a request asks for."""

    UNKNOWN = 0
    ANY = 1
    ALL = 2
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


class AclPermissionType(enum.IntEnum):
    """Kafka's permission type codes (``AclPermissionType``); ANY is for filters."""

    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


E = TypeVar("E", ResourceType, PatternType, AclOperation, AclPermissionType)


def of_code(kind: type[E], code: int) -> E:
    """The member of ``kind`` with protocol code ``code``; UNKNOWN for a code it lacks (Kafka's
    ``fromCode``)."""
    try:
        return kind(code)
    except ValueError:
        return kind(0)


WILDCARD: Final = "*"  # a literal resource name or a host matching every one
WILDCARD_PRINCIPAL: Final = "User:*"
CLUSTER_NAME: Final = "kafka-cluster"  # the cluster resource's only name
STANDARD_AUTHORIZER: Final = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
ANONYMOUS: Final = "User:ANONYMOUS"


@dataclass(frozen=True, slots=True, order=True)
class AclBinding:
    """One ACL: a resource pattern and an access control entry. Sorted by resource (type, name,
    pattern type), then entry (principal, host, operation, permission)."""

    resource_type: ResourceType
    name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission: AclPermissionType


@dataclass(frozen=True, slots=True)
class AclFilter:
    """A DescribeAcls or DeleteAcls filter (Kafka's ``AclBindingFilter``; see the module)."""

    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission: AclPermissionType = AclPermissionType.ANY


def pattern_applies(binding: AclBinding, name: str) -> bool:
    """Whether ``binding``'s pattern matches the resource name ``name`` (of its type)."""
    if binding.pattern_type is PatternType.LITERAL:
        return binding.name == name or binding.name == WILDCARD
    if binding.pattern_type is PatternType.PREFIXED:
        return name.startswith(binding.name)
    return False


def filter_matches(acl_filter: AclFilter, binding: AclBinding) -> bool:
    """Whether ``acl_filter`` matches ``binding`` (Kafka's ``AclBindingFilter.matches``)."""
    f = acl_filter
    if f.resource_type is not ResourceType.ANY and f.resource_type is not binding.resource_type:
        return False
    if f.pattern_type not in (PatternType.ANY, PatternType.MATCH, binding.pattern_type):
        return False
    if f.name is not None:
        if f.pattern_type is PatternType.MATCH:
            if not pattern_applies(binding, f.name):
                return False
        elif f.name != binding.name:
            return False
    if f.principal is not None and f.principal != binding.principal:
        return False
    if f.host is not None and f.host != binding.host:
        return False
    if f.operation is not AclOperation.ANY and f.operation is not binding.operation:
        return False
    return f.permission is AclPermissionType.ANY or f.permission is binding.permission


def filter_error(acl_filter: AclFilter) -> str | None:
    """Why DeleteAcls refuses ``acl_filter`` (INVALID_REQUEST), or None (Kafka's
    ``AclControlManager.validateFilter``: a field of an unknown code)."""
    if (
        acl_filter.resource_type is ResourceType.UNKNOWN
        or acl_filter.pattern_type is PatternType.UNKNOWN
    ):
        return "Unknown patternFilter."
    if (
        acl_filter.operation is AclOperation.UNKNOWN
        or acl_filter.permission is AclPermissionType.UNKNOWN
    ):
        return "Unknown entryFilter."
    return None


def parse_principal(text: str) -> tuple[str, str]:
    """``(type, name)`` of a ``Type:name`` principal (split at the first colon; Kafka's
    ``SecurityUtils.parseKafkaPrincipal``); ValueError for anything else."""
    kind, colon, name = text.partition(":")
    if not text or not colon:
        raise ValueError(f"expected a string in format principalType:principalName but got {text}")
    return kind, name


def creation_error(binding: AclBinding) -> str | None:
    """Why CreateAcls refuses ``binding`` (INVALID_REQUEST), or None: Kafka 4.0's checks in
    order, the broker's (``AclApis``: the cluster's name, an empty name) then the controller's
    (``validateNewAcl``: a type of an unknown code, a principal with no colon)."""
    if binding.resource_type is ResourceType.CLUSTER and binding.name != CLUSTER_NAME:
        return f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
    if not binding.name:
        return "Invalid empty resource name"
    if binding.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
        return f"Invalid resourceType {binding.resource_type.name}"
    if binding.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        return f"Invalid patternType {binding.pattern_type.name}"
    if binding.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
        return f"Invalid operation {binding.operation.name}"
    if binding.permission not in (AclPermissionType.DENY, AclPermissionType.ALLOW):
        return f"Invalid permissionType {binding.permission.name}"
    if ":" not in binding.principal:
        return (
            f"Could not parse principal from `{binding.principal}` (no colon is present "
            "separating the principal type from the principal name)"
        )
    return None


# ------------------------------------------------------------------------------ settings


@dataclass(frozen=True, slots=True)
class AuthorizerSettings:
    """The authorizer's settings: ``enabled`` (``authorizer.class.name`` is Kafka's
    StandardAuthorizer; off, the default, allows everything and the ACL APIs answer
    SECURITY_DISABLED), ``super_users`` (``super.users``: principals allowed anything) and
    ``allow_if_no_acl`` (``allow.everyone.if.no.acl.found``)."""

    enabled: bool = False
    super_users: frozenset[str] = field(default_factory=frozenset)
    allow_if_no_acl: bool = False

    @classmethod
    def of_properties(
        cls, class_name: str, super_users: str = "", allow_everyone_if_no_acl_found: bool = False
    ) -> AuthorizerSettings:
        """The settings of Kafka's three properties; ValueError for an authorizer class other
        than StandardAuthorizer or a super user that is not ``Type:name`` (``super.users`` is
        ``;``-separated, as Kafka's, since certificate subjects hold commas)."""
        name = class_name.strip()
        if name not in ("", STANDARD_AUTHORIZER):
            raise ValueError(
                f"authorizer.class.name={name}: only {STANDARD_AUTHORIZER} (or empty: no "
                "authorizer) is served"
            )
        users = frozenset(user.strip() for user in super_users.split(";") if user.strip())
        for user in users:
            parse_principal(user)
        return cls(bool(name), users, allow_everyone_if_no_acl_found)


DISABLED: Final = AuthorizerSettings()


# ------------------------------------------------------------------------------ the index


class Acls:
    """A set of bindings, indexed by resource type (literal names, prefixed names) for
    :func:`decide`. Immutable once built."""

    __slots__ = ("_all", "_literal", "_prefixed")

    def __init__(self, bindings: Iterable[AclBinding] = ()) -> None:
        self._all = frozenset(bindings)
        self._literal: dict[ResourceType, dict[str, list[AclBinding]]] = {}
        self._prefixed: dict[ResourceType, list[AclBinding]] = {}
        for binding in sorted(self._all):
            if binding.pattern_type is PatternType.LITERAL:
                by_name = self._literal.setdefault(binding.resource_type, {})
                by_name.setdefault(binding.name, []).append(binding)
            elif binding.pattern_type is PatternType.PREFIXED:
                self._prefixed.setdefault(binding.resource_type, []).append(binding)

    @property
    def bindings(self) -> frozenset[AclBinding]:
        return self._all

    def __len__(self) -> int:
        return len(self._all)

    def applying(self, resource_type: ResourceType, name: str) -> Iterator[AclBinding]:
        """The bindings whose pattern matches resource ``name`` of ``resource_type``."""
        literal = self._literal.get(resource_type, {})
        yield from literal.get(name, ())
        if name != WILDCARD:
            yield from literal.get(WILDCARD, ())
        for binding in self._prefixed.get(resource_type, ()):
            if name.startswith(binding.name):
                yield binding

    def of_type(self, resource_type: ResourceType) -> Iterator[AclBinding]:
        for by_name in self._literal.get(resource_type, {}).values():
            yield from by_name
        yield from self._prefixed.get(resource_type, ())

    def matching(self, acl_filter: AclFilter) -> list[AclBinding]:
        """The bindings ``acl_filter`` matches, sorted."""
        return sorted(b for b in self._all if filter_matches(acl_filter, b))


EMPTY: Final = Acls()


# --------------------------------------------------------------------------- the decision

# Per operation asked, the operations of an ALLOW binding that grant it (besides ALL).
_IMPLIED_BY: Final[Mapping[AclOperation, frozenset[AclOperation]]] = {
    AclOperation.DESCRIBE: frozenset(
        {
            AclOperation.DESCRIBE,
            AclOperation.READ,
            AclOperation.WRITE,
            AclOperation.DELETE,
            AclOperation.ALTER,
        }
    ),
    AclOperation.DESCRIBE_CONFIGS: frozenset(
        {AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS}
    ),
}


def covers(binding: AclBinding, operation: AclOperation) -> bool:
    """Whether ``binding``'s operation covers ``operation`` (ALL; the same; for ALLOW, the
    implied DESCRIBE and DESCRIBE_CONFIGS)."""
    if binding.operation is AclOperation.ALL or binding.operation is operation:
        return True
    if binding.permission is not AclPermissionType.ALLOW:
        return False
    return binding.operation in _IMPLIED_BY.get(operation, frozenset())


def _entry_matches(binding: AclBinding, principal: str, host: str) -> bool:
    return binding.principal in (principal, WILDCARD_PRINCIPAL) and binding.host in (
        WILDCARD,
        host,
    )


@dataclass(frozen=True, slots=True)
class Decision:
    """What :func:`decide` found: ``allowed``, and by which rule (Kafka's audit log names them):
    ``SuperUser``, ``Disabled`` (no authorizer), ``Deny`` or ``Allow`` (``binding`` the one that
    decided), ``DefaultAllow`` / ``DefaultDeny`` (no binding applies to the resource), or
    ``NoMatch`` (some apply, none matches: denied)."""

    allowed: bool
    rule: str
    binding: AclBinding | None = None


def decide(
    acls: Acls,
    settings: AuthorizerSettings,
    principal: str,
    host: str,
    operation: AclOperation,
    resource_type: ResourceType,
    name: str,
) -> Decision:
    """The decision on ``principal`` (``Type:name``) from ``host`` (an address) performing
    ``operation`` on the resource ``name`` of ``resource_type`` (the rules in the module)."""
    if not settings.enabled:
        return Decision(True, "Disabled")
    if principal in settings.super_users:
        return Decision(True, "SuperUser")
    applied = False
    allowed_by: AclBinding | None = None
    for binding in acls.applying(resource_type, name):
        applied = True
        if not _entry_matches(binding, principal, host) or not covers(binding, operation):
            continue
        if binding.permission is AclPermissionType.DENY:
            return Decision(False, "Deny", binding)
        if binding.permission is AclPermissionType.ALLOW and allowed_by is None:
            allowed_by = binding
    if allowed_by is not None:
        return Decision(True, "Allow", allowed_by)
    if not applied:
        allow = settings.allow_if_no_acl
        return Decision(allow, "DefaultAllow" if allow else "DefaultDeny")
    return Decision(False, "NoMatch")


def authorize(
    acls: Acls,
    settings: AuthorizerSettings,
    principal: str,
    host: str,
    operation: AclOperation,
    resource_type: ResourceType,
    name: str,
) -> bool:
    """Whether :func:`decide` allows it."""
    return decide(acls, settings, principal, host, operation, resource_type, name).allowed


# The resource name Kafka's authorizeByResourceType asks about first, so that super users and
# the no-ACL default decide as for any one resource.
_SOME_RESOURCE: Final = "hardcode"


def authorize_by_resource_type(
    acls: Acls,
    settings: AuthorizerSettings,
    principal: str,
    host: str,
    operation: AclOperation,
    resource_type: ResourceType,
) -> bool:
    """Whether ``principal`` may perform ``operation`` on some resource of ``resource_type``
    (KIP-679; Kafka's ``Authorizer.authorizeByResourceType``): allowed as for the resource
    ``hardcode``; else denied by a wildcard DENY; else allowed by a wildcard ALLOW, or by an
    ALLOW pattern no DENY dominates (a literal DENY of the same name, a prefixed DENY of a
    prefix of its name). Only bindings of ``operation`` or ALL count (no implied operations).
    ValueError for an operation or resource type that is not concrete."""
    if operation in (AclOperation.ANY, AclOperation.UNKNOWN):
        raise ValueError(f"operation must be concrete, not {operation.name}")
    if resource_type in (ResourceType.ANY, ResourceType.UNKNOWN):
        raise ValueError(f"resource type must be concrete, not {resource_type.name}")
    if authorize(acls, settings, principal, host, operation, resource_type, _SOME_RESOURCE):
        return True
    denied_literal: set[str] = set()
    denied_prefixed: set[str] = set()
    allowed: list[AclBinding] = []
    wildcard_allow = False
    for binding in acls.of_type(resource_type):
        if not _entry_matches(binding, principal, host):
            continue
        if binding.operation not in (operation, AclOperation.ALL):
            continue
        literal = binding.pattern_type is PatternType.LITERAL
        if binding.permission is AclPermissionType.DENY:
            if literal and binding.name == WILDCARD:
                return False
            (denied_literal if literal else denied_prefixed).add(binding.name)
        elif binding.permission is AclPermissionType.ALLOW:
            if literal and binding.name == WILDCARD:
                wildcard_allow = True
            else:
                allowed.append(binding)
    if wildcard_allow:
        return True
    for binding in allowed:
        if binding.pattern_type is PatternType.LITERAL and binding.name in denied_literal:
            continue
        prefixes = (binding.name[:end] for end in range(1, len(binding.name) + 1))
        if not any(prefix in denied_prefixed for prefix in prefixes):
            return True
    return False


def may_init_producer_id(
    acls: Acls,
    settings: AuthorizerSettings,
    principal: str,
    host: str,
    transactional_id: str | None,
) -> bool:
    """Whether InitProducerId is allowed (Kafka's ``handleInitProducerId``): WRITE on the
    transactional id; without one (an idempotent producer, KIP-679) IDEMPOTENT_WRITE on the
    cluster or WRITE on some topic."""
    if transactional_id is not None:
        return authorize(
            acls,
            settings,
            principal,
            host,
            AclOperation.WRITE,
            ResourceType.TRANSACTIONAL_ID,
            transactional_id,
        )
    return authorize(
        acls,
        settings,
        principal,
        host,
        AclOperation.IDEMPOTENT_WRITE,
        ResourceType.CLUSTER,
        CLUSTER_NAME,
    ) or authorize_by_resource_type(
        acls, settings, principal, host, AclOperation.WRITE, ResourceType.TOPIC
    )


# --------------------------------------------------------------- authorized operations

_Op = AclOperation

# The operations each resource type supports (Kafka 4.0's AclEntry.supportedOperations). A
# group's are Kafka 4.0's five, DESCRIBE_CONFIGS and ALTER_CONFIGS (KIP-848's group configs)
# among them, though this broker serves no group configs: clients see the bits Kafka sends.
SUPPORTED_OPERATIONS: Final[Mapping[ResourceType, tuple[AclOperation, ...]]] = {
    ResourceType.TOPIC: (
        _Op.READ,
        _Op.WRITE,
        _Op.CREATE,
        _Op.DELETE,
        _Op.ALTER,
        _Op.DESCRIBE,
        _Op.DESCRIBE_CONFIGS,
        _Op.ALTER_CONFIGS,
    ),
    ResourceType.GROUP: (
        _Op.READ,
        _Op.DELETE,
        _Op.DESCRIBE,
        _Op.DESCRIBE_CONFIGS,
        _Op.ALTER_CONFIGS,
    ),
    ResourceType.CLUSTER: (
        _Op.CREATE,
        _Op.ALTER,
        _Op.DESCRIBE,
        _Op.CLUSTER_ACTION,
        _Op.DESCRIBE_CONFIGS,
        _Op.ALTER_CONFIGS,
        _Op.IDEMPOTENT_WRITE,
    ),
    ResourceType.TRANSACTIONAL_ID: (_Op.DESCRIBE, _Op.WRITE),
    ResourceType.DELEGATION_TOKEN: (_Op.DESCRIBE,),
    ResourceType.USER: (_Op.CREATE_TOKENS, _Op.DESCRIBE_TOKENS),
}


def bit_field(operations: Iterable[AclOperation]) -> int:
    """``operations`` as a 32-bit field: bit ``code`` set for each (Kafka's
    ``Utils.to32BitField``)."""
    bits = 0
    for operation in operations:
        bits |= 1 << operation.value
    return bits


def authorized_operations(
    acls: Acls,
    settings: AuthorizerSettings,
    principal: str,
    host: str,
    resource_type: ResourceType,
    name: str,
) -> int:
    """The KIP-430 bit field of the operations ``principal`` may perform on the resource: those
    of :data:`SUPPORTED_OPERATIONS` that :func:`authorize` allows (all of them with the
    authorizer off)."""
    return bit_field(
        operation
        for operation in SUPPORTED_OPERATIONS[resource_type]
        if authorize(acls, settings, principal, host, operation, resource_type, name)
    )
