"""Compression codecs of RecordBatch v2: ids, compress and decompress.

The codec id lives in bits 0-2 of a batch's attributes (the layout is in ``record_batch_layout``);
the records section after the 61-byte header is compressed as one block. All four codecs come
from ``cramjam`` (one Rust wheel), so the project needs no other compression package.

Formats on the wire, and what this module accepts:

* gzip: RFC 1952 members; concatenated members decode as one stream, as Java's GZIPInputStream does.
* snappy: the Java client writes the *xerial* framing (``\\x82SNAPPY\\x00``, a version and a
  compatible-version i32, then blocks of ``[i32 big-endian length][raw snappy block]``);
  librdkafka writes one *raw* snappy block. Decoding accepts both, telling them apart by the
  8-byte magic, as xerial's own SnappyInputStream does; encoding writes raw snappy, which every
  client reads because xerial falls back to raw when the magic is absent.
* lz4: the LZ4 *frame* format. Encoding asks for independent blocks, the layout Java's
  KafkaLZ4BlockInputStream can read (it decodes each block without the previous one).
* zstd: a standard zstd frame.

Errors: an unknown id raises :class:`UnsupportedCodecError`; bytes the codec cannot decode raise
:class:`InvalidFieldError` (INVALID_RECORD) with cramjam's exception chained. The batch CRC was
already checked before anything is decompressed, so undecodable bytes were written that way by
the client: retrying cannot help, which is what INVALID_RECORD (not retriable) tells a producer,
whereas CORRUPT_MESSAGE would invite a retry.

``max_output_bytes`` bounds the decompressed size *while* decompressing (a few kilobytes of zstd
can expand to gigabytes): gzip, lz4 and zstd decode into a buffer of exactly that size and stop
when it is full; snappy declares each block's length up front, which is checked before decoding.
"""

from __future__ import annotations

import enum
import struct

import cramjam

from automq_ref.formats.errors import InvalidFieldError, TruncatedError, UnsupportedCodecError

__all__ = [
    "XERIAL_SNAPPY_HEADER_BYTES",
    "XERIAL_SNAPPY_MAGIC",
    "BytesLike",
    "CompressionType",
    "compress",
    "compression_type_from_id",
    "decompress",
]

BytesLike = bytes | bytearray | memoryview

XERIAL_SNAPPY_MAGIC = b"\x82SNAPPY\x00"
# magic (8) + version i32 + compatible-version i32
XERIAL_SNAPPY_HEADER_BYTES = 16

_BLOCK_LENGTH = struct.Struct(">i")

# cramjam reports a full fixed-size output buffer only through this message; matching it lets the
# error say "too large" instead of "corrupt". Both cases raise the same class either way.
_OUTPUT_FULL_MESSAGES = ("failed to write whole buffer", "smaller than required")


class CompressionType(enum.IntEnum):
    """Codec ids as stored in bits 0-2 of the batch attributes (Kafka's CompressionType)."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


def compression_type_from_id(codec_id: int) -> CompressionType:
    """Return the codec for ``codec_id``, or raise :class:`UnsupportedCodecError`."""
    try:
        return CompressionType(codec_id)
    except ValueError:
        raise UnsupportedCodecError(
            f"compression codec id {codec_id} is not one of "
            f"{[int(member) for member in CompressionType]}"
        ) from None


def compress(codec: CompressionType | int, data: BytesLike, *, level: int | None = None) -> bytes:
    """Compress ``data`` with ``codec`` (``level`` is the codec's own scale; None = its default)."""
    compression_type = compression_type_from_id(codec)
    if compression_type is CompressionType.NONE:
        return bytes(data)
    if compression_type is CompressionType.GZIP:
        return bytes(cramjam.gzip.compress(data, level=level))
    if compression_type is CompressionType.SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if compression_type is CompressionType.LZ4:
        compressor = cramjam.lz4.Compressor(level=level, block_linked=False)
        # Compressor.compress takes only bytes (cramjam 2.14), unlike the module functions.
        compressor.compress(data if isinstance(data, bytes) else bytes(data))
        return bytes(compressor.finish())
    return bytes(cramjam.zstd.compress(data, level=level))


def decompress(
    codec: CompressionType | int, data: BytesLike, *, max_output_bytes: int | None = None
) -> bytes:
    """Decompress ``data`` written with ``codec``.

    Raises :class:`UnsupportedCodecError` for an unknown id, :class:`InvalidFieldError` when the
    bytes do not decode or would decode to more than ``max_output_bytes``, and
    :class:`TruncatedError` when a xerial snappy frame ends inside a block.
    """
    if max_output_bytes is not None and max_output_bytes < 0:
        raise ValueError(f"max_output_bytes must be >= 0, got {max_output_bytes}")
    compression_type = compression_type_from_id(codec)
    if compression_type is CompressionType.NONE:
        _check_output_size(compression_type, len(data), max_output_bytes)
        return bytes(data)
    if compression_type is CompressionType.SNAPPY:
        return _decompress_snappy(data, max_output_bytes)
    if max_output_bytes is None:
        try:
            return bytes(_STREAM_MODULES[compression_type].decompress(data))
        except cramjam.DecompressionError as error:
            raise _undecodable(compression_type, error) from error
    return _decompress_bounded(compression_type, data, max_output_bytes)


_STREAM_MODULES = {
    CompressionType.GZIP: cramjam.gzip,
    CompressionType.LZ4: cramjam.lz4,
    CompressionType.ZSTD: cramjam.zstd,
}


def _decompress_bounded(
    compression_type: CompressionType, data: BytesLike, max_output_bytes: int
) -> bytes:
    # A fixed buffer makes cramjam stop as soon as it is full, so memory and time stay bounded by
    # max_output_bytes whatever the compressed bytes claim.
    output = bytearray(max_output_bytes)
    try:
        written_bytes: int = _STREAM_MODULES[compression_type].decompress_into(data, output)
    except cramjam.DecompressionError as error:
        if any(message in str(error) for message in _OUTPUT_FULL_MESSAGES):
            raise InvalidFieldError(
                f"{compression_type.name} data decompresses to more than "
                f"max_output_bytes={max_output_bytes}"
            ) from error
        raise _undecodable(compression_type, error) from error
    del output[written_bytes:]
    return bytes(output)


def _decompress_snappy(data: BytesLike, max_output_bytes: int | None) -> bytes:
    if bytes(data[: len(XERIAL_SNAPPY_MAGIC)]) != XERIAL_SNAPPY_MAGIC:
        return _decompress_raw_snappy_block(data, 0, max_output_bytes)
    if len(data) < XERIAL_SNAPPY_HEADER_BYTES:
        raise TruncatedError(
            f"xerial snappy header needs {XERIAL_SNAPPY_HEADER_BYTES} bytes, got {len(data)}"
        )
    view = memoryview(data)
    blocks: list[bytes] = []
    output_bytes = 0
    position = XERIAL_SNAPPY_HEADER_BYTES
    while position < len(view):
        if len(view) - position < _BLOCK_LENGTH.size:
            raise TruncatedError(
                f"xerial snappy block length at byte {position} needs 4 bytes, "
                f"got {len(view) - position}"
            )
        (block_length,) = _BLOCK_LENGTH.unpack_from(view, position)
        position += _BLOCK_LENGTH.size
        if block_length < 0:
            raise InvalidFieldError(
                f"xerial snappy block length at byte {position - 4} is negative: {block_length}"
            )
        if position + block_length > len(view):
            raise TruncatedError(
                f"xerial snappy block at byte {position} declares {block_length} bytes, "
                f"only {len(view) - position} remain"
            )
        block = _decompress_raw_snappy_block(
            view[position : position + block_length], output_bytes, max_output_bytes
        )
        output_bytes += len(block)
        blocks.append(block)
        position += block_length
    return b"".join(blocks)


def _decompress_raw_snappy_block(
    block: BytesLike, output_bytes_before: int, max_output_bytes: int | None
) -> bytes:
    try:
        if max_output_bytes is not None:
            # Raw snappy starts with the uncompressed length, so the guard costs nothing.
            declared_bytes: int = cramjam.snappy.decompress_raw_len(block)
            _check_output_size(
                CompressionType.SNAPPY, output_bytes_before + declared_bytes, max_output_bytes
            )
        return bytes(cramjam.snappy.decompress_raw(block))
    except cramjam.DecompressionError as error:
        raise _undecodable(CompressionType.SNAPPY, error) from error


def _check_output_size(
    compression_type: CompressionType, output_bytes: int, max_output_bytes: int | None
) -> None:
    if max_output_bytes is not None and output_bytes > max_output_bytes:
        raise InvalidFieldError(
            f"{compression_type.name} data decompresses to {output_bytes} bytes, more than "
            f"max_output_bytes={max_output_bytes}"
        )


def _undecodable(compression_type: CompressionType, error: Exception) -> InvalidFieldError:
    return InvalidFieldError(f"{compression_type.name} data does not decompress: {error}")
