"""Kafka error codes: the one table the project uses.

Operating errors travel as values carrying one of these codes (a rejected produce answers
``CORRUPT_MESSAGE``, a fenced stream ``STREAM_FENCED`` in the controller's own table later on).
Names and numbers are Kafka's; ``tests/unit/test_errors.py`` checks them against kio's schema.
"""

from __future__ import annotations

import enum


class KafkaErrorCode(enum.IntEnum):
    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    MESSAGE_TOO_LARGE = 10
    UNSUPPORTED_VERSION = 35
    INVALID_REQUEST = 42
    KAFKA_STORAGE_ERROR = 56
    UNSUPPORTED_COMPRESSION_TYPE = 76
    INVALID_RECORD = 87


class KafkaError(Exception):
    """An operating error that maps onto one Kafka error code."""

    code: KafkaErrorCode = KafkaErrorCode.UNKNOWN_SERVER_ERROR

    def __init__(self, message: str, *, code: KafkaErrorCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
