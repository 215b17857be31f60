"""A JAAS configuration text (Kafka's ``sasl.jaas.config`` value), parsed as Kafka's
``JaasConfig`` reads it, and the PLAIN users it names.

The text is one or more entries, each ``<login module class> <flag> [<key>=<value> ...];``: the
flag one of ``required``, ``requisite``, ``sufficient``, ``optional`` (any case); a value is
quoted (``"..."`` or ``'...'``, with Java's escapes: ``\\n``, ``\\t``, ``\\"``, octal) or a bare
word; ``//`` and ``/* */`` comments are skipped. As in Kafka (``java.io.StreamTokenizer``), a
word is letters, digits, ``.``, ``-``, ``_`` and ``$`` not starting with a digit, ``.`` or ``-``
(those start a number, which is not a value: quote it). Every entry ends with ``;``.

The PLAIN users are the options ``user_<name>="<password>"`` of the entry whose module is
Kafka's ``PlainLoginModule`` (``PlainServerCallbackHandler`` reads them from there); its
``username`` and ``password`` options are the login the broker itself uses on its links to other
brokers (:func:`own_login`), as are those of the ``ScramLoginModule`` entry of a SCRAM
mechanism's text.
"""

from __future__ import annotations

from dataclasses import dataclass

PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
FLAGS = ("required", "requisite", "sufficient", "optional")
USER_PREFIX = "user_"

_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


class JaasError(ValueError):
    """The text is not a JAAS configuration (the message says where it goes wrong)."""


@dataclass(frozen=True, slots=True)
class JaasEntry:
    login_module: str
    flag: str  # lower case
    options: dict[str, str]


# A token: (kind, text); kind "word", "quoted", "number" or the character itself ("=", ";").
_Token = tuple[str, str]


def _is_word_start(char: str) -> bool:
    return char.isalpha() or char in "_$" or ord(char) >= 160


def _is_word_part(char: str) -> bool:
    return _is_word_start(char) or char.isdigit() or char in ".-"


def _tokens(text: str) -> list[_Token]:
    found: list[_Token] = []
    index, end = 0, len(text)
    while index < end:
        char = text[index]
        if char <= " ":
            index += 1
        elif text.startswith("//", index):
            newline = text.find("\n", index)
            index = end if newline < 0 else newline + 1
        elif text.startswith("/*", index):
            close = text.find("*/", index + 2)
            if close < 0:
                raise JaasError("a /* comment is not closed")
            index = close + 2
        elif char in "\"'":
            index = _quoted(text, index, found)
        elif _is_word_start(char):
            start = index
            while index < end and _is_word_part(text[index]):
                index += 1
            found.append(("word", text[start:index]))
        elif char.isdigit() or char in ".-":
            start = index
            index += 1
            while index < end and (text[index].isdigit() or text[index] == "."):
                index += 1
            found.append(("number", text[start:index]))
        else:
            found.append((char, char))
            index += 1
    return found


def _quoted(text: str, index: int, found: list[_Token]) -> int:
    quote, index, end = text[index], index + 1, len(text)
    value: list[str] = []
    while True:
        if index >= end or text[index] == "\n":
            raise JaasError(f"a quoted value is not closed (its {quote} is missing)")
        char = text[index]
        if char == quote:
            found.append(("quoted", "".join(value)))
            return index + 1
        if char == "\\" and index + 1 < end:
            escaped = text[index + 1]
            index += 2
            if escaped in "01234567":
                digits = escaped
                limit = 3 if escaped <= "3" else 2
                while len(digits) < limit and index < end and text[index] in "01234567":
                    digits += text[index]
                    index += 1
                value.append(chr(int(digits, 8)))
            else:
                value.append(_ESCAPES.get(escaped, escaped))
            continue
        value.append(char)
        index += 1


def parse_jaas(text: str) -> list[JaasEntry]:
    """The entries of a JAAS configuration text; :class:`JaasError` when it is malformed."""
    tokens = _tokens(text)
    entries: list[JaasEntry] = []
    position = 0

    def next_token() -> _Token | None:
        nonlocal position
        if position >= len(tokens):
            return None
        position += 1
        return tokens[position - 1]

    while (token := next_token()) is not None:
        if token[0] not in ("word", "quoted"):
            raise JaasError(f"expected a login module class, found {token[1]!r}")
        module = token[1]
        flag = next_token()
        if flag is None:
            raise JaasError(f"{module}: the login module control flag (e.g. required) is missing")
        if flag[0] not in ("word", "quoted") or flag[1].lower() not in FLAGS:
            raise JaasError(
                f"{module}: {flag[1]!r} is not a login module control flag "
                f"(one of {', '.join(FLAGS)})"
            )
        options: dict[str, str] = {}
        while (key := next_token()) is not None and key[0] != ";":
            if key[0] not in ("word", "quoted"):
                raise JaasError(f"{module}: expected an option name, found {key[1]!r}")
            equals, value = next_token(), next_token()
            if (
                equals is None
                or equals[0] != "="
                or value is None
                or value[0] not in ("word", "quoted")
            ):
                raise JaasError(
                    f'{module}: no value for option {key[1]!r} (write {key[1]}="value")'
                )
            options[key[1]] = value[1]
        if key is None:
            raise JaasError(f"{module}: the entry does not end with ';'")
        entries.append(JaasEntry(module, flag[1].lower(), options))
    if not entries:
        raise JaasError("no login module is given")
    return entries


def plain_users(text: str) -> dict[str, str]:
    """The users (name -> password) of the ``PlainLoginModule`` entry; :class:`JaasError` when
    the text is malformed, has no such entry, or the entry names no user."""
    entries = [entry for entry in parse_jaas(text) if entry.login_module == PLAIN_LOGIN_MODULE]
    if not entries:
        raise JaasError(f"no {PLAIN_LOGIN_MODULE} entry")
    users = {
        key[len(USER_PREFIX) :]: value
        for entry in entries
        for key, value in entry.options.items()
        if key.startswith(USER_PREFIX) and len(key) > len(USER_PREFIX)
    }
    if not users:
        raise JaasError(
            f'{PLAIN_LOGIN_MODULE} names no user (user_<name>="<password>"): no client could '
            "authenticate"
        )
    return users


def own_login(text: str, login_module: str = PLAIN_LOGIN_MODULE) -> tuple[str, str] | None:
    """The ``username`` and ``password`` options of the ``login_module`` entry (the broker's
    own login), or None when the entry has neither; :class:`JaasError` when only one is given
    or the text is malformed."""
    for entry in parse_jaas(text):
        if entry.login_module != login_module:
            continue
        username, password = entry.options.get("username"), entry.options.get("password")
        if username is None and password is None:
            return None
        if not username or password is None:
            raise JaasError(f"{login_module}: username and password go together")
        return username, password
    return None
