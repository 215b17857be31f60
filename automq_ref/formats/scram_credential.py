"""A user's SCRAM credential for one mechanism, as the controller KV keeps it (under
:func:`automq_ref.vocabulary.naming.scram_credential_key`).

Value: a JSON object, the three byte strings in base64 and the iteration count::

    {"iterations":4096,"salt":"...","serverKey":"...","storedKey":"...","version":1}

written canonically (keys sorted, no spaces). Never the password nor the salted password:
what :class:`automq_ref.formats.scram.ScramCredential` holds (Kafka's
``UserScramCredentialRecord`` without its name and mechanism, which the key carries).

Pure: bytes in, values out.
"""

from __future__ import annotations

import base64
import binascii
from typing import Final

from automq_ref.formats.errors import InvalidFieldError
from automq_ref.formats.json_document import (
    Json,
    decode_json,
    encode_json,
    require_field,
    require_int,
    require_object,
    require_str,
)
from automq_ref.formats.scram import ScramCredential

SCRAM_CREDENTIAL_VERSION: Final = 1


class ScramCredentialFormatError(InvalidFieldError):
    """A KV value under a SCRAM key that is not a credential record."""


def encode_credential(credential: ScramCredential) -> bytes:
    document: dict[str, Json] = {
        "version": SCRAM_CREDENTIAL_VERSION,
        "salt": base64.b64encode(credential.salt).decode(),
        "storedKey": base64.b64encode(credential.stored_key).decode(),
        "serverKey": base64.b64encode(credential.server_key).decode(),
        "iterations": credential.iterations,
    }
    return encode_json(document, sort_keys=True)


def _bytes(document: dict[str, Json], name: str) -> bytes:
    text = require_str(require_field(document, name, "a SCRAM credential"), name)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ScramCredentialFormatError(f"{name} is not base64") from None


def decode_credential(value: bytes) -> ScramCredential:
    """The credential of a KV value; :class:`ScramCredentialFormatError` if it is not one."""
    try:
        document = require_object(decode_json(value, "a SCRAM credential"), "a SCRAM credential")
        version = require_int(require_field(document, "version", "a SCRAM credential"), "version")
        if version != SCRAM_CREDENTIAL_VERSION:
            raise ScramCredentialFormatError(f"version {version} is not a credential's")
        iterations = require_int(
            require_field(document, "iterations", "a SCRAM credential"), "iterations", minimum=1
        )
        return ScramCredential(
            salt=_bytes(document, "salt"),
            stored_key=_bytes(document, "storedKey"),
            server_key=_bytes(document, "serverKey"),
            iterations=iterations,
        )
    except ScramCredentialFormatError:
        raise
    except InvalidFieldError as error:
        raise ScramCredentialFormatError(str(error)) from error
