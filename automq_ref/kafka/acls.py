"""The cluster's ACLs on a broker: the bindings kept in the controller KV (one record per binding,
:mod:`automq_ref.formats.acl_record` under :func:`automq_ref.vocabulary.naming.acl_key`), read
from the followed image, decided by :mod:`automq_ref.state_machines.acl`, and changed through
the controller.

:class:`ClusterAcls` is the broker's authorizer: its settings (on or off, super users, the
no-ACL default) and the table of the image's bindings, rebuilt when the image changed. Every
broker of a cluster follows the same KV, so all decide on the same bindings (each as of its own
image). A broker without it (``Context.acls`` None) has no authorizer: the ACL APIs answer
SECURITY_DISABLED, as Kafka's brokers do with an empty ``authorizer.class.name``.

Changes: a new binding is a put-if-absent of its record (its key follows from it, so one found
there already, written by another request or broker, is the same binding: created); a deleted
one a compare-and-delete of the record read. Each change waits, briefly, until this broker's
image shows it, so a DescribeAcls right after sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.acl_record import (
    AclRecord,
    AclRecordFormatError,
    acl_record_key,
    decode_acl,
    encode_acl,
)
from automq_ref.io.metadata.client import ControllerClient, ControllerError
from automq_ref.io.metadata.view import MetadataView
from automq_ref.kafka.server import Peer
from automq_ref.state_machines import acl
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.vocabulary.naming import ACL_KEY_PREFIX

# How long a change waits for this broker's image to show it before answering anyway.
SEEN_WAIT_S = 5.0


def record_of(binding: acl.AclBinding) -> AclRecord:
    return AclRecord(
        resource_type=int(binding.resource_type),
        resource_name=binding.name,
        pattern_type=int(binding.pattern_type),
        principal=binding.principal,
        host=binding.host,
        operation=int(binding.operation),
        permission_type=int(binding.permission),
    )


def binding_of(record: AclRecord) -> acl.AclBinding:
    return acl.AclBinding(
        resource_type=acl.of_code(acl.ResourceType, record.resource_type),
        name=record.resource_name,
        pattern_type=acl.of_code(acl.PatternType, record.pattern_type),
        principal=record.principal,
        host=record.host,
        operation=acl.of_code(acl.AclOperation, record.operation),
        permission=acl.of_code(acl.AclPermissionType, record.permission_type),
    )


def binding_key(binding: acl.AclBinding) -> str:
    return acl_record_key(record_of(binding))


def acls_in(kv: Mapping[str, bytes]) -> acl.Acls:
    """The bindings of a KV's ACL records (a malformed record, or one under a key that is not
    its own, is skipped: no request can match or delete it)."""
    bindings = []
    for key, value in kv.items():
        if not key.startswith(ACL_KEY_PREFIX):
            continue
        try:
            record = decode_acl(value)
        except AclRecordFormatError:
            continue
        if acl_record_key(record) == key:
            bindings.append(binding_of(record))
    return acl.Acls(bindings)


def principal_of(peer: Peer) -> str:
    """The connection's principal (``User:ANONYMOUS`` before any login or certificate)."""
    return peer.session.principal or acl.ANONYMOUS


def host_of(peer: Peer) -> str:
    """The client's address as Kafka's ACLs name it (an IPv6 address without brackets)."""
    return peer.host.removeprefix("[").removesuffix("]")


@dataclass(frozen=True, slots=True)
class Deleted:
    """One binding a DeleteAcls filter matched: deleted (``error`` NONE), or the error."""

    binding: acl.AclBinding
    error: KafkaErrorCode = KafkaErrorCode.NONE
    message: str | None = None


class ClusterAcls:
    """The authorizer of a broker (see the module): :attr:`settings` and the image's bindings."""

    def __init__(self, view: MetadataView, settings: acl.AuthorizerSettings) -> None:
        self._view = view
        self.settings = settings
        self._kv: Mapping[str, bytes] | None = None
        self._acls = acl.EMPTY

    def table(self) -> acl.Acls:
        """The bindings as of the image (rebuilt when it changed)."""
        kv = self._view.image.kv
        if kv is not self._kv:  # an image's KV is replaced, never changed in place
            self._kv = kv
            self._acls = acls_in(kv)
        return self._acls

    # -------------------------------------------- decisions (the handlers': handlers/authorize.py)

    def authorize(
        self, peer: Peer, operation: acl.AclOperation, resource_type: acl.ResourceType, name: str
    ) -> bool:
        return acl.authorize(
            self.table(),
            self.settings,
            principal_of(peer),
            host_of(peer),
            operation,
            resource_type,
            name,
        )

    def authorized_operations(self, peer: Peer, resource_type: acl.ResourceType, name: str) -> int:
        return acl.authorized_operations(
            self.table(), self.settings, principal_of(peer), host_of(peer), resource_type, name
        )

    def may_init_producer_id(self, peer: Peer, transactional_id: str | None) -> bool:
        return acl.may_init_producer_id(
            self.table(), self.settings, principal_of(peer), host_of(peer), transactional_id
        )

    # ---------------------------------------------------------------------------- changes

    async def create(
        self, client: ControllerClient, bindings: Sequence[acl.AclBinding]
    ) -> list[tuple[KafkaErrorCode, str | None]]:
        """Write each binding (valid ones: the caller checked them); per binding its answer."""
        results: list[tuple[KafkaErrorCode, str | None]] = []
        written: dict[str, bytes | None] = {}
        for binding in bindings:
            record = record_of(binding)
            key, value = acl_record_key(record), encode_acl(record)
            try:
                response = await client.submit(sm.PutKV(key, value, False))
            except ControllerError as error:
                results.append((KafkaErrorCode.REQUEST_TIMED_OUT, _undecided(error)))
                continue
            if response.ok or response.error is sm.StreamErrorCode.KEY_EXIST:
                written[key] = value
                results.append((KafkaErrorCode.NONE, None))
            else:
                message = f"{response.error.value}: {response.message}"
                results.append((KafkaErrorCode.UNKNOWN_SERVER_ERROR, message))
        await self._until_seen(written)
        return results

    async def delete(
        self, client: ControllerClient, filters: Sequence[acl.AclFilter]
    ) -> list[list[Deleted]]:
        """Delete the bindings each (valid) filter matches in the image; per filter, what it
        matched. A binding two filters match is deleted once and listed under both (as Kafka
        lists it); one gone meanwhile (another request deleted it) is left out."""
        table = self.table()
        matched = [table.matching(acl_filter) for acl_filter in filters]
        outcome: dict[acl.AclBinding, Deleted | None] = {}
        gone: dict[str, bytes | None] = {}
        for binding in sorted({b for bindings in matched for b in bindings}):
            key = binding_key(binding)
            expected = self._view.image.kv.get(key)
            if expected is None:
                outcome[binding] = None
                continue
            try:
                response = await client.submit(sm.DeleteKV(key, expected=expected))
            except ControllerError as error:
                outcome[binding] = Deleted(
                    binding, KafkaErrorCode.REQUEST_TIMED_OUT, _undecided(error)
                )
                continue
            if response.ok:
                gone[key] = None
                outcome[binding] = Deleted(binding)
            elif response.error is sm.StreamErrorCode.VALUE_NOT_MATCHED:
                outcome[binding] = None  # deleted by another request meanwhile
            else:
                message = f"{response.error.value}: {response.message}"
                outcome[binding] = Deleted(binding, KafkaErrorCode.UNKNOWN_SERVER_ERROR, message)
        await self._until_seen(gone)
        return [
            [found for binding in bindings if (found := outcome[binding]) is not None]
            for bindings in matched
        ]

    async def _until_seen(self, expected: Mapping[str, bytes | None]) -> None:
        """Wait (up to :data:`SEEN_WAIT_S`) until the image holds ``expected`` (None: absent)."""

        def seen() -> bool:
            kv = self._view.image.kv
            return all(kv.get(key) == value for key, value in expected.items())

        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SEEN_WAIT_S):
                while True:
                    version = self._view.version  # before the look: a change after it wakes
                    if seen():
                        return
                    await self._view.wait_for_change(version)


def _undecided(error: ControllerError) -> str:
    return f"the controller gave no decision (it may have been applied): {error}"
