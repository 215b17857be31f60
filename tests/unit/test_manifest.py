"""The producer's manifest without Spark: value naming, checksums, tallies, JSON round trip."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from pydantic import ValidationError

from automq_ref.spark.manifest import (
    MODULUS,
    Manifest,
    PartitionTally,
    ValueScheme,
    checksums,
    parse_value,
    placed_hash,
    value_hash,
)


def test_values_are_self_describing_unique_and_padded() -> None:
    scheme = ValueScheme(producer="p7", value_bytes=64)
    value = scheme.value(3, 41)
    assert len(value) == 64
    assert value.startswith(b"p7-00003-000000000041.")
    parsed = parse_value(value)
    assert parsed is not None
    assert (parsed.producer, parsed.partition, parsed.sequence) == ("p7", 3, 41)
    assert int(value[scheme.sequence_slice]) == 41
    values = {scheme.value(partition, sequence) for partition in range(4) for sequence in range(50)}
    assert len(values) == 200
    # The filler is not one repeated byte (a codec would squeeze it to nothing).
    assert len(set(value[22:])) > 8
    # Deterministic: the verifier can name a missing value from the scheme alone.
    assert scheme.value(3, 41) == value


def test_short_values_are_just_the_prefix() -> None:
    scheme = ValueScheme(producer="abc", value_bytes=0)
    assert scheme.value(0, 5) == b"abc-00000-000000000005"
    assert parse_value(scheme.value(0, 5)) is not None


@pytest.mark.parametrize(
    "value", [None, b"", b"nope", b"P7-00003-000000000041", b"p7-3-41", b"p7-00003-000000000041x"]
)
def test_foreign_values_do_not_parse(value: bytes | None) -> None:
    assert parse_value(value) is None


def test_producer_names_are_checked() -> None:
    with pytest.raises(ValidationError):
        ValueScheme(producer="has-dash", value_bytes=10)
    with pytest.raises(ValidationError):
        ValueScheme(producer="", value_bytes=10)


def test_hashes_are_the_first_eight_bytes_of_md5() -> None:
    value = b"p1-00000-000000000000"
    assert value_hash(value) == int(hashlib.md5(value).hexdigest()[:16], 16)
    assert placed_hash(7, value) == int(
        hashlib.md5(bytes([0] * 7 + [7]) + value).hexdigest()[:16], 16
    )


def test_values_checksum_ignores_order_placed_checksum_does_not() -> None:
    scheme = ValueScheme(producer="p", value_bytes=40)
    values = [scheme.value(0, sequence) for sequence in range(20)]
    in_order = checksums(enumerate(values))
    swapped = values.copy()
    swapped[3], swapped[4] = swapped[4], swapped[3]
    reordered = checksums(enumerate(swapped))
    assert in_order[0] == reordered[0]
    assert in_order[1] != reordered[1]
    assert checksums(reversed(list(enumerate(values)))) == in_order  # a sum: any reading order
    assert checksums(enumerate(values[1:])) != in_order
    assert all(0 <= total < MODULUS for total in in_order)


def test_tally_from_reports_in_any_order() -> None:
    scheme = ValueScheme(producer="p", value_bytes=30)
    reports = [(sequence, 100 + sequence, scheme.value(2, sequence)) for sequence in range(10)]
    reports.remove(reports[6])  # sequence 6 was not acknowledged
    forward, backward = PartitionTally(2), PartitionTally(2)
    for report in reports:
        forward.add(*report)
    for report in reversed(reports):
        backward.add(*report)
    assert forward.manifest() == backward.manifest()
    part = forward.manifest()
    assert (part.count, part.first_offset, part.last_offset) == (9, 100, 109)
    assert [(run.sequence, run.offset, run.length) for run in part.acked] == [
        (0, 100, 6),
        (7, 107, 3),
    ]
    assert part.offset_of(7) == 107
    assert part.offset_of(6) is None
    assert list(part.acked_sequences()) == [0, 1, 2, 3, 4, 5, 7, 8, 9]
    assert (part.values_checksum, part.placed_checksum) == checksums(
        (offset, value) for _sequence, offset, value in reports
    )


def test_manifest_round_trip(tmp_path: Path) -> None:
    scheme = ValueScheme(producer="abc123", value_bytes=100)
    tallies = [PartitionTally(index, sent=3) for index in range(3)]
    for index, tally in enumerate(tallies):
        for sequence in range(index):  # partition 0 stays empty
            tally.add(sequence, sequence, scheme.value(index, sequence))
    manifest = Manifest(
        topic="t", codec="zstd", scheme=scheme, partitions=[t.manifest() for t in tallies]
    )
    path = tmp_path / "deep" / "manifest.json"
    manifest.write(path)
    again = Manifest.read(path)
    assert again == manifest
    assert again.records == 3
    assert again.partition(0).first_offset is None
    assert again.partition(2).count == 2
    with pytest.raises(KeyError):
        again.partition(9)
    # Checksums near 2**64 survive JSON (Python's ints are exact; no float on the way).
    big = again.model_copy(
        update={
            "partitions": [again.partitions[0].model_copy(update={"values_checksum": MODULUS - 1})]
        }
    )
    big.write(path)
    assert Manifest.read(path).partitions[0].values_checksum == MODULUS - 1
