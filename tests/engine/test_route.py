"""Route follows Kafka Connect's RegexRouter: Java's replacement syntax and
``matches()`` then ``replaceFirst``. The expected outputs were produced by Java 17's
``java.util.regex`` (``m.matches() ? m.replaceFirst(rep) : topic``)."""

from __future__ import annotations

from typing import Any

import pytest

from tidemark.engine.records import ChangeRecord
from tidemark.engine.transforms import Route
from tidemark.errors import ConfigError


def route(regex: str, replacement: str, topic: str) -> str:
    record = ChangeRecord(event=None, destination=topic)  # type: ignore[arg-type]
    out: Any = Route(regex, replacement)(record)
    return str(out.destination)


@pytest.mark.parametrize(("regex", "replacement", "topic", "expected"), [
    (r"tidemark\.public\.(.*)", "r.$1", "tidemark.public.orders", "r.orders"),
    (r"tidemark\.public\.(.*)", "r.$1", "other.public.orders", "other.public.orders"),
    # the whole topic matches, and the first match (a search) is what is replaced
    ("a|ab", "X", "ab", "Xb"),
    # $12 with 3 groups is group 1 and a "2"; with 12 groups, group 12
    ("(a)(b)(c)", "$12", "abc", "a2"),
    ("(a)(b)(c)(d)(e)(f)(g)(h)(i)(j)(k)(l)", "$12", "abcdefghijkl", "l"),
    # named group, a group that took no part, an escaped $ and backslash
    (r"(?P<tbl>[a-z]+)\.(x)?", r"p.${tbl}.$2.\$.\\", "ab.", "p.ab..$.\\"),
    ("(a)", "$0-$0", "a", "a-a"),
    ("(a)", r"\q", "a", "q"),  # an escaped character is itself
])
def test_route_follows_regex_router(regex: str, replacement: str, topic: str,
                                    expected: str) -> None:
    assert route(regex, replacement, topic) == expected


@pytest.mark.parametrize(("replacement", "message"), [
    ("$2", r"\$2: the regex has 1 group"),  # Java: IndexOutOfBoundsException "No group 2"
    ("$", r"names no group; write \\\$ for a literal \$"),
    ("\\", "a trailing backslash"),
    ("${x_y}", "has no closing }"),
    ("${}", "names no group"),
    ("${nope}", "no group named 'nope'"),
    ("$x", r"\$x is not a group reference"),
    # Python's forms: Java would write a literal "1"; refused, naming the $ form
    (r"r.\1", r"\\1 is Python's group reference; write \$1"),
    (r"r.\g<1>", r"\\g<1> is Python's group reference; write \$1"),
    (r"r.\g<tbl>", r"\\g<tbl> is Python's group reference; write \$\{tbl\}"),
])
def test_route_refuses_a_bad_replacement_when_built(replacement: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        Route(r"(?P<tbl>a)" if "tbl" in replacement else "(a)", replacement)
    assert info.value.key == "replacement"
    assert "RegexRouter" in str(info.value)
