"""Debezium's ``skipped.operations``: which kinds of change a source leaves out while
streaming.

The value is Debezium's: a comma-separated list of operation codes, ``c`` (inserts),
``u`` (updates), ``d`` (deletes, with their tombstones), ``t`` (truncates), or ``none``.
Each source drops a skipped change before it renders anything (the fast paths write
their output directly) and before it counts the change in the transaction's orders, as
Debezium's dispatcher does; the change's position still moves the source's offset on,
so a stretch of skipped changes does not hold a slot or a log back.

tidemark's default is ``none`` where Debezium's is ``t``: ``tidemark run`` and the
engine's consumers apply a truncate to their targets, and a target that silently keeps
rows its source emptied is worse than an event a consumer may ignore.
"""

from __future__ import annotations

from typing import Final

from tidemark.errors import ConfigError
from tidemark.event import Op

__all__ = ["ACCEPTED", "DEFAULT", "parse_skipped_operations"]

#: The setting's default in tidemark (Debezium's is ``t``: see the module docstring).
DEFAULT: Final = "none"
#: What the list may hold.
ACCEPTED: Final = ("c", "u", "d", "t", "none")

_CODES: Final = {"c": Op.CREATE, "u": Op.UPDATE, "d": Op.DELETE, "t": Op.TRUNCATE}
_ACCEPTED_TEXT: Final = ("a comma-separated list of c (inserts), u (updates), d (deletes), "
                         "t (truncates), or none")


def parse_skipped_operations(text: str, key: str = "skipped_operations") -> frozenset[Op]:
    """The operations *text* (Debezium's ``skipped.operations`` value) skips; raises
    :class:`~tidemark.errors.ConfigError` naming *key*, the bad value and the accepted
    ones."""
    if not isinstance(text, str):
        raise ConfigError(key, f"{text!r} is not allowed; expected {_ACCEPTED_TEXT}, "
                          "e.g. \"t\" or \"u,d\"")
    items = [item.strip() for item in text.split(",")]
    if items == ["none"]:
        return frozenset()
    skipped: set[Op] = set()
    for item in items:
        if item == "none":
            raise ConfigError(key, f"{text!r}: none cannot be combined with other "
                              "operations; write none alone to skip nothing")
        if item == "r":
            # Debezium's validator takes it but no connector skips anything with it:
            # the setting applies to streaming, and snapshot reads are not streamed.
            raise ConfigError(key, f"{text!r}: r (snapshot reads) cannot be skipped (in "
                              "Debezium too it skips nothing: the setting applies to "
                              "streaming); to start without a snapshot set snapshot_mode "
                              "= \"no_data\"")
        op = _CODES.get(item)
        if op is None:
            raise ConfigError(key, f"{item!r} in {text!r} is not an operation; expected "
                              f"{_ACCEPTED_TEXT}, e.g. \"t\" or \"u,d\"")
        skipped.add(op)
    return frozenset(skipped)


def names_skipped_operations(key: str) -> bool:
    """Whether *key* is the setting under any spelling (``skipped.operations``,
    ``skipped_operations``, ``skippedOperations``): for runtimes that do not offer it,
    to refuse it with a reason instead of as an unknown key."""
    return key.replace(".", "").replace("_", "").replace("-", "").lower() == \
        "skippedoperations"


def not_offered(key: str, runtime: str, instead: str) -> ConfigError:
    """The error for the setting given to a *runtime* that delivers every operation."""
    return ConfigError(key, f"{runtime} delivers every operation: skipped.operations is "
                       f"a setting of tidemark capture and of the engine's sources; {instead}")
