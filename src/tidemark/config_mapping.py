"""Build a validated settings struct from a plain mapping, naming every bad key.

Shared by every component configured from TOML, CLI options or a Python dict: an unknown
key is named with the list of allowed ones, a missing required key is named with what it
is for, and a wrong value is named with what would be accepted (the choices of an enum).
"""

from __future__ import annotations

import enum
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec

from tidemark.errors import ConfigError, unknown_key_error

S = TypeVar("S", bound=msgspec.Struct)


def struct_from_mapping(cls: type[S], values: Mapping[str, Any], section: str = "",
                        required: Mapping[str, str] | None = None) -> S:
    """Convert *values* to *cls*.

    *required* maps required keys to a description used in the error when one is
    missing; *section* prefixes key names in errors (``source.slot_name``).
    """
    allowed = set(cls.__struct_fields__)
    for key in values:
        if key not in allowed:
            raise unknown_key_error(section, key, allowed)
    for key, what in (required or {}).items():
        if key not in values:
            raise ConfigError(qualified(section, key), f"required: {what}")
    try:
        return msgspec.convert(dict(values), cls, str_keys=True)
    except msgspec.ValidationError as err:
        raise config_error_from(cls, err, section) from None


def qualified(section: str, key: str) -> str:
    return f"{section}.{key}" if section else key


def config_error_from(cls: type[msgspec.Struct], err: msgspec.ValidationError,
                      section: str) -> ConfigError:
    """Turn msgspec's "Expected `int`, got `str` - at `$.x`" into "x: expected int, got
    str", listing the choices when the value should have been one of an enum's."""
    message = str(err)
    match = re.search(r" - at `\$\.?([^`]*)`", message)
    key = match.group(1) if match else "config"
    if match:
        message = message[: match.start()]
    enum_match = re.search(r"Invalid enum value '([^']*)'", message)
    if enum_match:
        choices = enum_choices(cls, key.split("[")[0].split(".")[0])
        message = f"{enum_match.group(1)!r} is not allowed; choose one of {choices}"
    return ConfigError(qualified(section, key), message.replace("`", ""))


def enum_choices(cls: type[msgspec.Struct], field: str) -> str:
    """The allowed values of an enum-typed field, for error messages."""
    # Errors name the key as written (msgspec's encoded name, e.g. onSchemaChange).
    encoded = dict(zip(cls.__struct_encode_fields__, cls.__struct_fields__, strict=True))
    hint = typing.get_type_hints(cls).get(encoded.get(field, field))
    candidates = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, enum.Enum):
            return ", ".join(str(member.value) for member in candidate)
        if typing.get_origin(candidate) is typing.Literal:
            return ", ".join(str(value) for value in typing.get_args(candidate))
    return "the documented values"
