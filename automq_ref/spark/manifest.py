"""The producer's manifest: what was acknowledged, per partition, for ``automq-ref verify``.

``automq-ref produce`` writes records whose values describe themselves and, from the delivery
reports alone (only acknowledged records count), a manifest: per partition the record count, the
first and last offset, two checksums and the runs of acknowledged sequence numbers with their
offsets. ``automq-ref verify`` reads the topic back with Spark and compares.

Values. Record ``sequence`` of ``partition`` written by producer ``producer`` has the value
``<producer>-<partition:05d>-<sequence:012d>``, followed, when ``value_bytes`` asks for more, by
``.`` and a filler derived from that prefix (hex digits of its BLAKE2b digest, repeated), so
every value is unique, names where it belongs, and is as long as asked without being a run of one
byte that every codec squeezes to nothing. A value read back can be parsed
(:func:`parse_value`), and a value missing from what was read can be named, because the manifest
keeps the :class:`ValueScheme` that made them.

Checksums. Both are sums modulo 2**64 of a 64-bit hash (the first 8 bytes of MD5, read big
endian), so they can be computed by Spark's built-in functions (``md5``, ``conv``, ``sum``)
in any order and in parallel, with no Python on the executors and no record sent to the driver:

* ``values_checksum`` = sum of ``h(value)``: independent of order and of offsets, it says the
  same multiset of values came back;
* ``placed_checksum`` = sum of ``h(offset as 8 bytes big endian || value)``: it binds every value
  to its offset, so it depends on the order of the values in the log. A chained hash over the
  values in offset order would say the same but can only be computed by one task walking a
  partition in order; this sum says it with a parallel aggregation. Two values swapped between
  two offsets change it (unless two 64-bit hashes collide).

MD5 serves here as a well-mixed 64-bit checksum, not as a cryptographic guarantee.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from hashlib import md5
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

MANIFEST_VERSION = 1
MODULUS = 2**64
PARTITION_DIGITS = 5
SEQUENCE_DIGITS = 12
PRODUCER_PATTERN = re.compile(r"[a-z0-9]{1,16}")
VALUE_PATTERN = re.compile(rb"^([a-z0-9]{1,16})-(\d{5})-(\d{12})(?:\.|$)")
VALUE_REGEX = r"^([a-z0-9]{1,16})-([0-9]{5})-([0-9]{12})([.]|$)"
"""The same as :data:`VALUE_PATTERN`, for Spark's ``regexp_extract`` (Java regex syntax)."""


def value_hash(value: bytes) -> int:
    """The 64-bit hash behind ``values_checksum``: the first 8 bytes of MD5, big endian."""
    return int.from_bytes(hashlib.md5(value).digest()[:8], "big")


def placed_hash(offset: int, value: bytes) -> int:
    """The 64-bit hash behind ``placed_checksum``: of the offset (8 bytes) followed by the value."""
    return int.from_bytes(hashlib.md5(offset.to_bytes(8, "big") + value).digest()[:8], "big")


class ValueScheme(BaseModel):
    """How the values were made: enough to rebuild any of them."""

    model_config = ConfigDict(frozen=True)

    producer: str
    value_bytes: int = Field(ge=0)

    @field_validator("producer")
    @classmethod
    def _producer_is_a_token(cls, producer: str) -> str:
        if not PRODUCER_PATTERN.fullmatch(producer):
            raise ValueError("producer must be 1-16 characters of [a-z0-9]")
        return producer

    def prefix(self, partition: int, sequence: int) -> bytes:
        return f"{self.producer}-{partition:05d}-{sequence:012d}".encode()

    @property
    def sequence_slice(self) -> slice:
        """Where the sequence number sits in every value of this scheme."""
        start = len(self.producer) + 1 + PARTITION_DIGITS + 1
        return slice(start, start + SEQUENCE_DIGITS)

    def value(self, partition: int, sequence: int) -> bytes:
        """The value of record ``sequence`` (0, 1, ...) of ``partition``."""
        if not 0 <= partition < 10**PARTITION_DIGITS or not 0 <= sequence < 10**SEQUENCE_DIGITS:
            raise ValueError(f"partition {partition} or sequence {sequence} out of range")
        prefix = b"%s-%05d-%012d" % (self._producer_bytes, partition, sequence)
        room = self.value_bytes - len(prefix) - 1
        if room < 0:
            return prefix
        filler = hashlib.blake2b(prefix, digest_size=32).digest().hex().encode()
        if room > len(filler):
            filler *= room // len(filler) + 1
        return b"%s.%s" % (prefix, filler[:room])

    @property
    def _producer_bytes(self) -> bytes:
        return self.producer.encode()


@dataclass(frozen=True)
class ParsedValue:
    producer: str
    partition: int
    sequence: int


def parse_value(value: bytes | None) -> ParsedValue | None:
    """The producer, partition and sequence a value names, or None if it is not one of ours."""
    if value is None:
        return None
    match = VALUE_PATTERN.match(value)
    if match is None:
        return None
    return ParsedValue(match.group(1).decode(), int(match.group(2)), int(match.group(3)))


class AckedRun(BaseModel):
    """Sequences ``sequence .. sequence + length - 1`` were acknowledged at consecutive offsets
    from ``offset``."""

    model_config = ConfigDict(frozen=True)

    sequence: int = Field(ge=0)
    offset: int = Field(ge=0)
    length: int = Field(ge=1)


class PartitionManifest(BaseModel):
    partition: int = Field(ge=0)
    sent: int = Field(ge=0, description="sequences 0 .. sent - 1 were handed to the producer")
    count: int = Field(ge=0, description="records acknowledged")
    first_offset: int | None = None
    last_offset: int | None = None
    values_checksum: int = Field(ge=0, lt=MODULUS)
    placed_checksum: int = Field(ge=0, lt=MODULUS)
    acked: list[AckedRun] = Field(default_factory=list, description="sorted by sequence")

    def offset_of(self, sequence: int) -> int | None:
        """The offset ``sequence`` was acknowledged at, or None if it was not."""
        for run in self.acked:
            if run.sequence <= sequence < run.sequence + run.length:
                return run.offset + sequence - run.sequence
        return None

    def acked_sequences(self) -> Iterator[int]:
        for run in self.acked:
            yield from range(run.sequence, run.sequence + run.length)


class Manifest(BaseModel):
    version: int = MANIFEST_VERSION
    topic: str
    codec: str = "none"
    scheme: ValueScheme
    partitions: list[PartitionManifest]
    produce_seconds: float | None = None
    created_at: str | None = None

    @property
    def records(self) -> int:
        return sum(partition.count for partition in self.partitions)

    def partition(self, index: int) -> PartitionManifest:
        for partition in self.partitions:
            if partition.partition == index:
                return partition
        raise KeyError(index)

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(self.model_dump_json(indent=1) + "\n")
        temporary.replace(path)

    @classmethod
    def read(cls, path: Path) -> Manifest:
        return cls.model_validate_json(path.read_text())


@dataclass
class PartitionTally:
    """Builds one partition's manifest from delivery reports, in any order."""

    partition: int
    sent: int = 0
    count: int = 0
    first_offset: int | None = None
    last_offset: int | None = None
    values_checksum: int = 0
    placed_checksum: int = 0
    runs: list[list[int]] = field(default_factory=list)  # [sequence, offset, length]

    def add(self, sequence: int, offset: int, value: bytes) -> None:
        self.count += 1
        if self.first_offset is None or offset < self.first_offset:
            self.first_offset = offset
        if self.last_offset is None or offset > self.last_offset:
            self.last_offset = offset
        # Reduced modulo 2**64 in manifest(): Python's integers do not overflow meanwhile.
        self.values_checksum += int.from_bytes(md5(value).digest()[:8], "big")
        self.placed_checksum += int.from_bytes(
            md5(offset.to_bytes(8, "big") + value).digest()[:8], "big"
        )
        if self.runs:
            last = self.runs[-1]
            if sequence == last[0] + last[2] and offset == last[1] + last[2]:
                last[2] += 1
                return
        self.runs.append([sequence, offset, 1])

    def manifest(self) -> PartitionManifest:
        merged: list[list[int]] = []
        for sequence, offset, length in sorted(self.runs):
            if merged:
                last = merged[-1]
                if sequence == last[0] + last[2] and offset == last[1] + last[2]:
                    last[2] += length
                    continue
            merged.append([sequence, offset, length])
        return PartitionManifest(
            partition=self.partition,
            sent=self.sent,
            count=self.count,
            first_offset=self.first_offset,
            last_offset=self.last_offset,
            values_checksum=self.values_checksum % MODULUS,
            placed_checksum=self.placed_checksum % MODULUS,
            acked=[AckedRun(sequence=s, offset=o, length=n) for s, o, n in merged],
        )


def checksums(records: Iterable[tuple[int, bytes]]) -> tuple[int, int]:
    """(values_checksum, placed_checksum) of (offset, value) pairs: what a reader recomputes."""
    values_sum = placed_sum = 0
    for offset, value in records:
        values_sum += value_hash(value)
        placed_sum += placed_hash(offset, value)
    return values_sum % MODULUS, placed_sum % MODULUS
