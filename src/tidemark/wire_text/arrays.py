"""The parser of PostgreSQL's array literals (:func:`parse_array`)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, Final

# The server reads an unquoted NULL in any letter case as SQL NULL (and prints "NULL");
# a set lookup keeps that exact without lower-casing every element.
# The characters the server's array parser skips around elements (scanner_isspace).
_ARRAY_SPACE: Final = " \t\n\r\v\f"
_NULL_SPELLINGS: Final = frozenset(
    "".join(chars) for chars in itertools.product("Nn", "Uu", "Ll", "Ll")
)


def parse_array(
    text: str, element_parser: Callable[[str], object], delimiter: str = ","
) -> list[Any]:
    """A PostgreSQL array literal as a (nested) list, parsing elements with *element_parser*.

    ``'{1,2,NULL}'`` -> ``[1, 2, None]``; multi-dimensional arrays become nested lists
    (``'{{1,2},{3,4}}'`` -> ``[[1, 2], [3, 4]]``); ``'{}'`` -> ``[]``. Quoted elements
    may contain backslash escapes, and a quoted ``"NULL"`` is the string NULL, not SQL
    NULL. A dimension decoration (``'[0:1]={1,2}'``, printed for lower bounds other
    than 1) is dropped. *delimiter* is the element type's ``typdelim``: ``','`` for all
    built-in types except ``box``, which uses ``';'``.
    """
    if text.startswith("["):
        # '[lo:hi][lo:hi]={...}': the bounds carry no information a list can keep.
        equals = text.find("=")
        if equals < 0:
            raise ValueError(f"invalid array dimension decoration: {text!r}")
        text = text[equals + 1 :]
    if text == "{}":
        return []
    body = text[1:-1]
    # Fast path: one dimension, nothing quoted, escaped or padded; this is every array
    # of numbers, dates and times and most arrays of short strings. The server quotes
    # any element containing whitespace, so the space test only diverts hand-written
    # literals such as '{1, 2}'.
    if (
        text.startswith("{")
        and text.endswith("}")
        and '"' not in body
        and "\\" not in body
        and "{" not in body
        and "}" not in body
        and " " not in body
    ):
        items = body.split(delimiter)
        if "" in items:
            raise ValueError(f"array literal has an empty element: {text!r}")
        return [None if item in _NULL_SPELLINGS else element_parser(item) for item in items]
    return _parse_array_general(text, element_parser, delimiter)


def _parse_array_general(
    text: str, element_parser: Callable[[str], object], delimiter: str
) -> list[Any]:
    length = len(text)
    pos = 0
    while pos < length and text[pos] in _ARRAY_SPACE:
        pos += 1
    if pos >= length or text[pos] != "{":
        raise ValueError(f"invalid array literal (must start with '{{'): {text!r}")
    pos += 1
    current: list[Any] = []
    outer: list[list[Any]] = []
    # True right after '{' or a delimiter: an element (or a sub-array) must come next.
    want_element = True
    while True:
        if pos >= length:
            raise ValueError(f"unterminated array literal: {text!r}")
        char = text[pos]
        if char in _ARRAY_SPACE:
            pos += 1
        elif char == "}":
            if want_element and current:
                raise ValueError(f"array literal has an empty element: {text!r}")
            pos += 1
            if not outer:
                break
            current = outer.pop()
            want_element = False
        elif char == delimiter:
            if want_element:
                raise ValueError(f"array literal has an empty element: {text!r}")
            want_element = True
            pos += 1
        elif not want_element:
            raise ValueError(f"array literal is missing a delimiter at {pos}: {text!r}")
        elif char == "{":
            nested: list[Any] = []
            current.append(nested)
            outer.append(current)
            current = nested
            pos += 1
        elif char == '"':
            value, pos = _quoted_element(text, pos + 1)
            current.append(element_parser(value))
            want_element = False
        else:
            value, pos, escaped = _unquoted_element(text, pos, delimiter)
            # An unquoted NULL (any case) is SQL NULL; a quoted or escaped one is text.
            if not escaped and value in _NULL_SPELLINGS:
                current.append(None)
            else:
                current.append(element_parser(value))
            want_element = False
    if text[pos:].strip(_ARRAY_SPACE):
        raise ValueError(f"junk after array literal: {text!r}")
    return current


def _quoted_element(text: str, pos: int) -> tuple[str, int]:
    """Read a quoted element whose opening quote is just before *pos*.

    Returns the unescaped value and the position after the closing quote.
    """
    pieces: list[str] = []
    while True:
        quote = text.find('"', pos)
        if quote < 0:
            raise ValueError(f"unterminated quoted array element: {text!r}")
        backslash = text.find("\\", pos, quote)
        if backslash < 0:
            pieces.append(text[pos:quote])
            return "".join(pieces), quote + 1
        # Copy up to the backslash, then the escaped character itself (which may be
        # the quote we found, so search again from after it).
        pieces.append(text[pos:backslash])
        if backslash + 1 >= len(text):
            raise ValueError(f"unterminated quoted array element: {text!r}")
        pieces.append(text[backslash + 1])
        pos = backslash + 2


def _unquoted_element(text: str, pos: int, delimiter: str) -> tuple[str, int, bool]:
    """Read an unquoted element starting at *pos* (at a non-space character).

    Returns the value (trailing whitespace removed, backslash escapes applied), the
    position of the delimiter or '}' that ends it, and whether it contained an escape.
    """
    # Common case first: find the end with two C-level searches and check the slice.
    end = text.find(delimiter, pos)
    brace = text.find("}", pos)
    if end < 0 or 0 <= brace < end:
        end = brace
    if end < 0:
        raise ValueError(f"unterminated array literal: {text!r}")
    value = text[pos:end]
    if "\\" not in value:
        if "{" in value or '"' in value:
            raise ValueError(f"unexpected '{{' or '\"' in an array element: {text!r}")
        return value.rstrip(_ARRAY_SPACE), end, False
    # A backslash may escape the delimiter or '}' the searches stopped at: rescan.
    pieces: list[str] = []
    start = end = pos
    length = len(text)
    while end < length:
        char = text[end]
        if char in (delimiter, "}"):
            break
        if char in '{"':
            raise ValueError(f"unexpected {char!r} in array element at {end}: {text!r}")
        if char == "\\":
            if end + 1 >= length:
                raise ValueError(f"unterminated array literal: {text!r}")
            pieces.append(text[start:end])
            pieces.append(text[end + 1])
            end += 2
            start = end
            continue
        end += 1
    if end >= length:
        raise ValueError(f"unterminated array literal: {text!r}")
    # Like the server, drop trailing whitespace unless it was escaped: only the last
    # unescaped run is stripped.
    pieces.append(text[start:end].rstrip(_ARRAY_SPACE))
    return "".join(pieces), end, True
