"""An ACL binding's record in the controller KV: one record per binding.

Value: a JSON object of the binding's seven fields, Kafka's protocol codes for the four types
(``AccessControlEntryRecord``'s fields, without its id)::

    {"host":"*","operation":3,"patternType":3,"permissionType":3,"principal":"User:alice",
     "resourceName":"orders","resourceType":2,"version":1}

written canonically (keys sorted, no spaces, UTF-8), so that one binding always has the same
bytes. Key: :func:`automq_ref.vocabulary.naming.acl_key` of the SHA-256 of those bytes
(:func:`acl_record_key`): a binding's key follows from the binding, so creating it twice (on
two brokers at once) writes one record, and deleting compares the very bytes it read.

Pure: bytes in, values out.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Final

from automq_ref.formats.errors import InvalidFieldError
from automq_ref.vocabulary.naming import acl_key

ACL_RECORD_VERSION: Final = 1


class AclRecordFormatError(InvalidFieldError):
    """A KV value under an ACL key that is not an ACL record."""


@dataclass(frozen=True, slots=True)
class AclRecord:
    """The seven fields of a binding, its types as protocol codes."""

    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int


_INTS: Final = ("resourceType", "patternType", "operation", "permissionType")
_STRINGS: Final = ("resourceName", "principal", "host")


def encode_acl(record: AclRecord) -> bytes:
    """``record``'s canonical bytes."""
    value = {
        "version": ACL_RECORD_VERSION,
        "resourceType": record.resource_type,
        "resourceName": record.resource_name,
        "patternType": record.pattern_type,
        "principal": record.principal,
        "host": record.host,
        "operation": record.operation,
        "permissionType": record.permission_type,
    }
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def acl_record_key(record: AclRecord) -> str:
    """The KV key of ``record``: ``acls/`` and the SHA-256 (hex) of :func:`encode_acl`."""
    return acl_key(hashlib.sha256(encode_acl(record)).hexdigest())


def decode_acl(value: bytes) -> AclRecord:
    """The record of ``value``; :class:`AclRecordFormatError` when it is not one (not JSON,
    another version, a field missing or of the wrong type)."""
    try:
        found: Any = json.loads(value)
    except (ValueError, UnicodeDecodeError) as error:
        raise AclRecordFormatError(f"ACL record: not JSON: {error}") from error
    if not isinstance(found, dict):
        raise AclRecordFormatError("ACL record: not a JSON object")
    if found.get("version") != ACL_RECORD_VERSION:
        raise AclRecordFormatError(f"ACL record: version {found.get('version')!r}")
    for name in _INTS:
        if not isinstance(found.get(name), int) or isinstance(found.get(name), bool):
            raise AclRecordFormatError(f"ACL record: {name} is not an integer")
        if not -128 <= found[name] <= 127:
            raise AclRecordFormatError(f"ACL record: {name} is not an int8")
    for name in _STRINGS:
        if not isinstance(found.get(name), str):
            raise AclRecordFormatError(f"ACL record: {name} is not a string")
    return AclRecord(
        resource_type=found["resourceType"],
        resource_name=found["resourceName"],
        pattern_type=found["patternType"],
        principal=found["principal"],
        host=found["host"],
        operation=found["operation"],
        permission_type=found["permissionType"],
    )
