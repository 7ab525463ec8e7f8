"""MariaDB's ``latin1`` character set as a Python codec.

MariaDB's ``latin1`` is Windows-1252, not ISO-8859-1: bytes 0x80-0x9F are the euro
sign, quotation marks, dashes and so on (as ``CONVERT(col USING utf8mb4)`` shows),
except the five bytes cp1252 leaves undefined (0x81, 0x8D, 0x8F, 0x90, 0x9D), which
MariaDB maps to the control characters of the same number. Python's ``latin-1`` reads
all 32 bytes as control characters, and its ``cp1252`` refuses the five; this codec
reads every byte as MariaDB does, so that a value decoded from the binlog equals the
one a snapshot's SELECT returns.
"""

from __future__ import annotations

import codecs
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

#: The codec's name (what :func:`codecs.lookup` is asked for).
NAME: Final = "tidemark_mariadb_latin1"

_UNDEFINED_IN_CP1252: Final = frozenset({0x81, 0x8D, 0x8F, 0x90, 0x9D})

#: The character of each byte.
DECODING_TABLE: Final = "".join(
    chr(byte) if byte in _UNDEFINED_IN_CP1252 else bytes([byte]).decode("cp1252")
    for byte in range(256))
_ENCODING_TABLE: Final = codecs.charmap_build(DECODING_TABLE)


def _encode(text: str, errors: str = "strict") -> tuple[bytes, int]:
    return codecs.charmap_encode(text, errors, _ENCODING_TABLE)


def _decode(data: ReadableBuffer, errors: str = "strict") -> tuple[str, int]:
    return codecs.charmap_decode(data, errors, DECODING_TABLE)


def _search(name: str) -> codecs.CodecInfo | None:
    if name != NAME:
        return None
    return codecs.CodecInfo(_encode, _decode, name=NAME)


codecs.register(_search)
