"""The project's Kafka error table agrees with the protocol schema kio is generated from."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.errors import (
    ChecksumError,
    FormatError,
    InvalidFieldError,
    UnsupportedCodecError,
)


def test_every_code_matches_kafka() -> None:
    kafka = {code.name.upper(): code.value for code in ErrorCode}
    for code in KafkaErrorCode:
        assert kafka[code.name] == code.value, code.name


def test_format_errors_carry_the_code_a_broker_answers_with() -> None:
    assert ChecksumError("x").code is KafkaErrorCode.CORRUPT_MESSAGE
    assert InvalidFieldError("x").code is KafkaErrorCode.INVALID_RECORD
    assert UnsupportedCodecError("x").code is KafkaErrorCode.UNSUPPORTED_COMPRESSION_TYPE
    assert issubclass(FormatError, ValueError)
