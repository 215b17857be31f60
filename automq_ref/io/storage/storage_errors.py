"""The storage's errors: what S3Storage raises when it cannot serve a request (re-exported
by :mod:`automq_ref.io.storage.s3stream`, where callers import them from)."""

from __future__ import annotations

from automq_ref.state_machines import stream_metadata as sm


class StorageError(Exception):
    """The storage cannot serve the request."""


class StreamFencedError(StorageError):
    """The stream is not open here at that epoch (or a newer owner took it)."""


class NodeEpochExpiredError(StorageError):
    """The controller bumped this node's epoch (its session lapsed): this incarnation is
    fenced, and every later request of it is refused."""


class PlacementRefusedError(StorageError):
    """A stream of a partition cannot be created or opened here now: the partition is placed
    on another broker or at another leader epoch, or its previous broker still holds one of
    its streams open (``error`` says which). The broker tries again when placement changes."""

    def __init__(self, message: str, error: sm.StreamErrorCode) -> None:
        super().__init__(message)
        self.error = error


# The controller's refusals that say "not here, or not yet" about a partition's streams.
PLACEMENT_REFUSALS = frozenset(
    {
        sm.StreamErrorCode.STREAM_NOT_CLOSED,
        sm.StreamErrorCode.NOT_LEADER_OR_FOLLOWER,
        sm.StreamErrorCode.FENCED_LEADER_EPOCH,
        sm.StreamErrorCode.UNKNOWN_LEADER_EPOCH,
        sm.StreamErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    }
)


class OffsetOutOfRangeError(StorageError):
    """A read below the stream's start offset (trimmed away)."""
