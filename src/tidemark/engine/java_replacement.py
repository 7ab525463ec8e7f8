"""Java's regex replacement syntax, as Kafka Connect's ``RegexRouter`` uses it.

``RegexRouter`` renames a topic with ``matcher.replaceFirst(replacement)`` when the whole
topic ``matches()`` the regex. In the replacement (``java.util.regex.Matcher``):

* ``$n`` is group *n*: one digit, then more digits as long as the number stays a group
  of the pattern (with 3 groups ``$12`` is group 1 and a literal ``2``);
* ``${name}`` is the named group *name* (ASCII letters and digits, a letter first);
* ``\\x`` is the character *x* itself (``\\$`` a dollar, ``\\\\`` a backslash);
* a group that took no part in the match adds nothing.

Java fails at the first replacement on a bad reference; here it is refused when the
route is built. Python's ``\\1`` and ``\\g<name>`` are refused too (Java reads ``\\1`` as
a literal ``1``, which is never what was meant), with the ``$`` form in the error.
"""

from __future__ import annotations

import re

from tidemark.errors import ConfigError

#: A parsed replacement: literal text (str) and group numbers (int), in order.
Parts = tuple[str | int, ...]


def _ascii_name_char(c: str) -> bool:
    return c.isascii() and c.isalnum()


def parse_replacement(pattern: re.Pattern[str], replacement: str,
                      key: str = "replacement") -> Parts:
    """*replacement* parsed against *pattern*'s groups, or a ConfigError naming *key*."""
    parts: list[str | int] = []
    literal: list[str] = []
    groups = pattern.groups
    n = len(replacement)
    i = 0

    def bad(why: str) -> ConfigError:
        return ConfigError(key, f"{replacement!r}: {why} (Java's replacement syntax, as "
                                "Kafka Connect's RegexRouter: $1 or ${name} for a group, "
                                "\\$ for a literal $)")

    while i < n:
        c = replacement[i]
        if c == "\\":
            if i + 1 == n:
                raise bad("a trailing backslash escapes nothing; write \\\\ for a backslash")
            nxt = replacement[i + 1]
            if nxt.isdigit():
                raise bad(f"\\{nxt} is Python's group reference; write ${nxt}")
            if nxt == "g" and replacement.startswith("<", i + 2):
                end = replacement.find(">", i + 3)
                name = replacement[i + 3:end] if end > 0 else "name"
                raise bad(f"\\g<{name}> is Python's group reference; write "
                          f"{'$' + name if name.isdigit() else '${' + name + '}'}")
            literal.append(nxt)
            i += 2
        elif c == "$":
            i += 1
            if i == n:
                raise bad("$ at the end names no group; write \\$ for a literal $")
            if replacement[i] == "{":
                start = i + 1
                i = start
                while i < n and _ascii_name_char(replacement[i]):
                    i += 1
                name = replacement[start:i]
                if not name:
                    raise bad("${} names no group")
                if i == n or replacement[i] != "}":
                    raise bad(f"${{{name} has no closing }} (group names are ASCII letters "
                              "and digits)")
                if name[0].isdigit():
                    raise bad(f"group name {{{name}}} starts with a digit")
                if name not in pattern.groupindex:
                    raise bad(f"the regex has no group named {name!r}")
                number = pattern.groupindex[name]
                i += 1
            else:
                if not ("0" <= replacement[i] <= "9"):
                    raise bad(f"${replacement[i]} is not a group reference; write \\$ for a "
                              "literal $")
                number = int(replacement[i])
                i += 1
                # Java takes more digits while the number is still a group.
                while i < n and "0" <= replacement[i] <= "9":
                    longer = number * 10 + int(replacement[i])
                    if longer > groups:
                        break
                    number = longer
                    i += 1
                if number > groups:
                    raise bad(f"${number}: the regex has {groups} group"
                              f"{'' if groups == 1 else 's'}")
            if literal:
                parts.append("".join(literal))
                literal.clear()
            parts.append(number)
        else:
            literal.append(c)
            i += 1
    if literal:
        parts.append("".join(literal))
    return tuple(parts)


def replace_first(pattern: re.Pattern[str], parts: Parts, text: str) -> str:
    """Java's ``pattern.matcher(text).replaceFirst(replacement)``: the first match (a
    search from the start, which may be shorter than the whole text even when the whole
    text matches) replaced by *parts*; *text* unchanged without a match."""
    match = pattern.search(text)
    if match is None:
        return text
    out = [text[:match.start()]]
    for part in parts:
        if isinstance(part, int):
            out.append(match.group(part) or "")
        else:
            out.append(part)
    out.append(text[match.end():])
    return "".join(out)
