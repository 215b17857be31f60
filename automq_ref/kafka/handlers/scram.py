"""DescribeUserScramCredentials (50) and AlterUserScramCredentials (51), v0, as Kafka 4.0 answers
them (``ScramImage.describe`` and ``ScramControlManager.alterCredentials``), over the SCRAM
credentials of the controller KV: one record per user and mechanism
(:mod:`automq_ref.formats.scram_credential` under
:func:`automq_ref.vocabulary.naming.scram_credential_key`), read from the followed image, so
every broker of a cluster describes the same users and lets them log in
(:mod:`automq_ref.kafka.sasl`).

AlterUserScramCredentials, in Kafka's order: the deletions, then the upsertions, each refused
with

- DUPLICATE_RESOURCE "A user credential cannot be altered twice in the same request" when its
  user was named before in the request (by a deletion or an upsertion, whatever the mechanism;
  the earlier entry is then dropped too: one answer per user);
- UNACCEPTABLE_CREDENTIAL "Username must not be empty";
- UNSUPPORTED_SASL_MECHANISM "Unknown SCRAM mechanism" (a mechanism code other than 1,
  SCRAM-SHA-256, and 2, SCRAM-SHA-512);
- a deletion: RESOURCE_NOT_FOUND "Attempt to delete a user credential that does not exist";
- an upsertion: UNACCEPTABLE_CREDENTIAL "Too few iterations" (below 4096) or "Too many
  iterations" (above 16384); an empty salted password UNKNOWN_SERVER_ERROR "Empty key" (Kafka's
  HMAC key refusal).

The answers come in Kafka's order: the deletions done, the upsertions done, then the refused.
The upsertion carries the salted password (the client derived it from the password, salt and
iterations); the broker keeps the stored key and the server key derived from it, never the
salted password. Each credential is written through the controller on its own, as a
compare-and-set on the value this broker's image holds (a put-if-absent for a new one, a
compare-and-delete for a deletion), tried again on the value found when another broker changed
it meanwhile; Kafka writes a request's records in one batch, here a failure (no controller
decision: REQUEST_TIMED_OUT) leaves the credentials written before it. The answer waits,
briefly, until this broker's image shows the changes, so a login or a describe right after
finds them.

DescribeUserScramCredentials: no users (null or empty) describes every user with a credential;
otherwise each user named, once: DUPLICATE_RESOURCE "Cannot describe SCRAM credentials for the
same user twice in a single request: <user>" for a name given twice, RESOURCE_NOT_FOUND
"Attempt to describe a user credential that does not exist: <user>" for one without any, else
its mechanisms and iteration counts. The top-level error is NONE.

Not yet: the cluster ALTER / DESCRIBE authorization Kafka checks first (ACLs are not enforced
in the APIs yet).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats import scram
from automq_ref.formats.scram_credential import (
    ScramCredentialFormatError,
    decode_credential,
    encode_credential,
)
from automq_ref.io.metadata.client import ControllerClient, ControllerError
from automq_ref.io.metadata.view import MetadataView
from automq_ref.kafka.handlers.authorize import AclOperation, cluster_allowed, cluster_operation
from automq_ref.kafka.request import ApiKey, Context, Request
from automq_ref.kafka.responses import Response, respond
from automq_ref.kafka.server import Reply
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.vocabulary.naming import (
    SCRAM_KEY_PREFIX,
    parse_scram_credential_key,
    scram_credential_key,
)

NONE = KafkaErrorCode.NONE
TWICE: Final = "A user credential cannot be altered twice in the same request"
EMPTY_USER: Final = "Username must not be empty"
UNKNOWN_MECHANISM: Final = "Unknown SCRAM mechanism"
NO_SUCH_CREDENTIAL: Final = "Attempt to delete a user credential that does not exist"
DESCRIBED_TWICE: Final = (
    "Cannot describe SCRAM credentials for the same user twice in a single request: "
)
NO_SUCH_USER: Final = "Attempt to describe a user credential that does not exist: "
# How long a change waits for this broker's image to show it before answering anyway.
SEEN_WAIT_S: Final = 5.0
# How often a credential another broker keeps changing is tried again.
ATTEMPTS: Final = 10

# --------------------------------------------------------------------- the image's credentials


def credential_in(
    kv: Mapping[str, bytes], mechanism: str, username: str
) -> scram.ScramCredential | None:
    """User ``username``'s credential for ``mechanism`` in a KV (a malformed record is none)."""
    value = kv.get(scram_credential_key(mechanism, username))
    if value is None:
        return None
    try:
        return decode_credential(value)
    except ScramCredentialFormatError:
        return None


def credentials_in(kv: Mapping[str, bytes]) -> dict[str, dict[str, scram.ScramCredential]]:
    """Every credential of a KV: username -> mechanism -> credential (malformed records, and
    records of a mechanism not served, skipped)."""
    found: dict[str, dict[str, scram.ScramCredential]] = {}
    for key, value in kv.items():
        if not key.startswith(SCRAM_KEY_PREFIX):
            continue
        named = parse_scram_credential_key(key)
        if named is None or named[0] not in scram.HASHES:
            continue
        try:
            found.setdefault(named[1], {})[named[0]] = decode_credential(value)
        except ScramCredentialFormatError:
            continue
    return found


# ------------------------------------------------------------------------- typed responses


@dataclass(frozen=True, slots=True)
class CredentialInfo:
    mechanism: int
    iterations: int


@dataclass(frozen=True, slots=True)
class DescribeUserScramCredentialsResult:
    user: str
    error_code: KafkaErrorCode = NONE
    error_message: str | None = None
    credential_infos: Sequence[CredentialInfo] = ()


@dataclass(frozen=True, slots=True)
class DescribeUserScramCredentialsResponse(Response):
    API_KEY = ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS
    results: Sequence[DescribeUserScramCredentialsResult]
    error_code: KafkaErrorCode = NONE
    error_message: str | None = None
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class AlterUserScramCredentialsResult:
    user: str
    error_code: KafkaErrorCode = NONE
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class AlterUserScramCredentialsResponse(Response):
    API_KEY = ApiKey.ALTER_USER_SCRAM_CREDENTIALS
    results: Sequence[AlterUserScramCredentialsResult]
    throttle_time: int = 0


# ------------------------------------------------------------------------------ describing


def describe(
    kv: Mapping[str, bytes], users: Sequence[str] | None
) -> list[DescribeUserScramCredentialsResult]:
    """The results of a DescribeUserScramCredentials for ``users`` (None or empty: all)."""
    credentials = credentials_in(kv)
    twice: dict[str, bool] = {}
    for user in users or sorted(credentials):
        twice[user] = user in twice
    results = []
    for user, repeated in twice.items():
        if repeated:
            code, message = KafkaErrorCode.DUPLICATE_RESOURCE, DESCRIBED_TWICE + user
            results.append(DescribeUserScramCredentialsResult(user, code, message))
            continue
        held = credentials.get(user, {})
        infos = [
            CredentialInfo(scram.TYPE_OF[mechanism], held[mechanism].iterations)
            for mechanism in scram.MECHANISMS
            if mechanism in held
        ]
        if not infos:
            code, message = KafkaErrorCode.RESOURCE_NOT_FOUND, NO_SUCH_USER + user
            results.append(DescribeUserScramCredentialsResult(user, code, message))
        else:
            results.append(DescribeUserScramCredentialsResult(user, credential_infos=infos))
    return results


@cluster_operation(AclOperation.DESCRIBE)
async def handle_describe_user_scram_credentials(context: Context, request: Request) -> Reply:
    users = request.body.users
    names = None if users is None else [user.name for user in users]
    results = describe(context.view.image.kv, names)
    return respond(request, DescribeUserScramCredentialsResponse(results))


# -------------------------------------------------------------------------------- altering


@dataclass(frozen=True, slots=True)
class Change:
    """One valid change of a request: the credential to write (None: delete the record)."""

    user: str
    mechanism: str
    credential: scram.ScramCredential | None


def _refusal(user: str, mechanism_type: int) -> tuple[KafkaErrorCode, str] | None:
    if not user:
        return KafkaErrorCode.UNACCEPTABLE_CREDENTIAL, EMPTY_USER
    if mechanism_type not in scram.MECHANISM_TYPES:
        return KafkaErrorCode.UNSUPPORTED_SASL_MECHANISM, UNKNOWN_MECHANISM
    return None


def plan(
    kv: Mapping[str, bytes], deletions: Sequence[Any], upsertions: Sequence[Any]
) -> tuple[list[Change], dict[str, tuple[KafkaErrorCode, str]]]:
    """The valid changes of an AlterUserScramCredentials (deletions first, each in request
    order) and the refused users with their error, by Kafka's rules (the module docstring)."""
    changes: dict[str, Change] = {}
    refused: dict[str, tuple[KafkaErrorCode, str]] = {}

    def take(user: str, refusal: tuple[KafkaErrorCode, str] | None, change: Change) -> None:
        if user in refused:
            return
        if changes.pop(user, None) is not None:
            refused[user] = (KafkaErrorCode.DUPLICATE_RESOURCE, TWICE)
        elif refusal is not None:
            refused[user] = refusal
        else:
            changes[user] = change

    for deletion in deletions:
        user, code = deletion.name, int(deletion.mechanism)
        refusal = _refusal(user, code)
        mechanism = scram.MECHANISM_TYPES.get(code, "")
        if refusal is None and scram_credential_key(mechanism, user) not in kv:
            refusal = (KafkaErrorCode.RESOURCE_NOT_FOUND, NO_SUCH_CREDENTIAL)
        take(user, refusal, Change(user, mechanism, None))
    for upsertion in upsertions:
        user, code = upsertion.name, int(upsertion.mechanism)
        refusal = _refusal(user, code)
        iterations = int(upsertion.iterations)
        if refusal is None and iterations < scram.MIN_ITERATIONS:
            refusal = (KafkaErrorCode.UNACCEPTABLE_CREDENTIAL, "Too few iterations")
        elif refusal is None and iterations > scram.MAX_ITERATIONS:
            refusal = (KafkaErrorCode.UNACCEPTABLE_CREDENTIAL, "Too many iterations")
        elif refusal is None and not upsertion.salted_password:
            refusal = (KafkaErrorCode.UNKNOWN_SERVER_ERROR, "Empty key")
        credential = None
        mechanism = scram.MECHANISM_TYPES.get(code, "")
        if refusal is None:
            credential = scram.credential_of_salted(
                mechanism, bytes(upsertion.salted_password), bytes(upsertion.salt), iterations
            )
        take(user, refusal, Change(user, mechanism, credential))
    ordered = [c for c in changes.values() if c.credential is None]
    ordered += [c for c in changes.values() if c.credential is not None]
    return ordered, refused


async def write(
    client: ControllerClient, view: MetadataView, change: Change
) -> tuple[KafkaErrorCode, str | None, bytes | None]:
    """Write one change through the controller; its answer and the value the KV then holds."""
    key = scram_credential_key(change.mechanism, change.user)
    value = None if change.credential is None else encode_credential(change.credential)
    current = view.image.kv.get(key)
    for _ in range(ATTEMPTS):
        event: sm.StreamMetadataEvent
        if value is None:
            if current is None:
                # Deleted meanwhile by another request: what it asked for is done.
                return NONE, None, None
            event = sm.DeleteKV(key, expected=current)
        elif current is None:
            event = sm.PutKV(key, value, False)
        else:
            event = sm.PutKV(key, value, True, expected=current)
        try:
            response = await client.submit(event)
        except ControllerError as error:
            message = f"the controller gave no decision (it may have been applied): {error}"
            return KafkaErrorCode.REQUEST_TIMED_OUT, message, value
        if response.ok:
            return NONE, None, value
        if response.error not in (
            sm.StreamErrorCode.KEY_EXIST,
            sm.StreamErrorCode.VALUE_NOT_MATCHED,
        ):
            return (
                KafkaErrorCode.UNKNOWN_SERVER_ERROR,
                f"{response.error.value}: {response.message}",
                value,
            )
        current = response.value  # another broker changed it meanwhile: decide on its value
    return KafkaErrorCode.UNKNOWN_SERVER_ERROR, f"{key} kept changing meanwhile", value


async def until_seen(view: MetadataView, expected: Mapping[str, bytes | None]) -> None:
    """Wait (up to :data:`SEEN_WAIT_S`) until the image holds ``expected`` (None: absent)."""

    def seen() -> bool:
        kv = view.image.kv
        return all(kv.get(key) == value for key, value in expected.items())

    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(SEEN_WAIT_S):
            while True:
                version = view.version  # before the look: a change after it wakes the wait
                if seen():
                    return
                await view.wait_for_change(version)


async def handle_alter_user_scram_credentials(context: Context, request: Request) -> Reply:
    body = request.body
    if not cluster_allowed(context, request, AclOperation.ALTER):
        # Kafka's error response: each user named, once.
        users = dict.fromkeys(c.name for c in (*body.deletions, *body.upsertions))
        denial = KafkaErrorCode.CLUSTER_AUTHORIZATION_FAILED
        results = [AlterUserScramCredentialsResult(user, denial) for user in users]
        return respond(request, AlterUserScramCredentialsResponse(results))
    changes, refused = plan(context.view.image.kv, body.deletions, body.upsertions)

    async def answer() -> Any:
        results = []
        written: dict[str, bytes | None] = {}
        for change in changes:
            code, message, value = await write(context.controller_client, context.view, change)
            if code is NONE:
                written[scram_credential_key(change.mechanism, change.user)] = value
            results.append(AlterUserScramCredentialsResult(change.user, code, message))
        await until_seen(context.view, written)
        results += [
            AlterUserScramCredentialsResult(user, code, message)
            for user, (code, message) in refused.items()
        ]
        return respond(request, AlterUserScramCredentialsResponse(results))

    return answer()
