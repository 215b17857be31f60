"""Typed errors for malformed bytes.

Every parser in :mod:`automq_ref.formats` raises a subclass of :class:`FormatError` when the bytes
in front of it are not a valid instance of its format, and never returns data it could not check.
Each class carries the Kafka error code a broker answers with when such bytes arrive from a client.
"""

from __future__ import annotations

from automq_ref.errors import KafkaError, KafkaErrorCode


class FormatError(KafkaError, ValueError):
    """Bytes that are not a valid instance of the format being parsed."""

    code = KafkaErrorCode.CORRUPT_MESSAGE


class TruncatedError(FormatError):
    """The buffer ends before a length the format declares."""


class BadMagicError(FormatError):
    """A magic number or version byte is not the one the format requires."""


class ChecksumError(FormatError):
    """A stored CRC does not match the bytes it covers."""


class InvalidFieldError(FormatError):
    """A field holds a value the format does not allow (negative length, inconsistent counts)."""

    code = KafkaErrorCode.INVALID_RECORD


class UnsupportedCodecError(FormatError):
    """A compression codec id the project does not know."""

    code = KafkaErrorCode.UNSUPPORTED_COMPRESSION_TYPE
