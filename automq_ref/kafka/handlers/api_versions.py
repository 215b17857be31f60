"""ApiVersions: the table of API keys and version ranges this broker answers.

The table itself is :data:`automq_ref.kafka.dispatch.API_VERSIONS`, derived from the routes; this
module turns it into the answer. A client asking in a version above ours gets a v0 answer with
``UNSUPPORTED_VERSION`` and the table, so that it retries in a version we speak (KIP-511).
"""

from __future__ import annotations

from collections.abc import Mapping

from automq_ref.errors import KafkaErrorCode
from automq_ref.kafka.request import Request
from automq_ref.kafka.responses import ApiVersionRange, ApiVersionsResponse, encode, respond
from automq_ref.kafka.server import Chunks

VersionTable = Mapping[int, tuple[int, int]]


def answer(request: Request, versions: VersionTable) -> Chunks:
    return respond(request, ApiVersionsResponse(api_keys=_ranges(versions)))


def unsupported_version(correlation_id: int, versions: VersionTable) -> Chunks:
    """The v0 answer to an ApiVersions request in a version above ours."""
    response = ApiVersionsResponse(
        api_keys=_ranges(versions), error_code=KafkaErrorCode.UNSUPPORTED_VERSION
    )
    return encode(0, correlation_id, response)


def _ranges(versions: VersionTable) -> list[ApiVersionRange]:
    return [ApiVersionRange(key, low, high) for key, (low, high) in sorted(versions.items())]
