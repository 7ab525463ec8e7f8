"""``tidemark verify``: prove that a pipeline's Delta targets equal their source tables
(row checksums computed where the data is, :mod:`tidemark.row_checksum`).

``tidemark.verify`` is this package, and calling it runs :func:`verify`
(``tidemark.verify("pipeline.toml")``): the Python API has the package's name.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from tidemark.verify.result import VerifyResult

#: Differing keys of one table above which ``--repair`` is refused (reloading the table
#: is cheaper than that many signals).
DEFAULT_REPAIR_LIMIT: Final = 10_000


def verify(config_path: str | os.PathLike[str], tables: Sequence[str] | None = None,
           wait_s: float = 120.0, **options: Any) -> VerifyResult:
    """Compare each target of a pipeline file with its source table
    (:func:`tidemark.verify.run.verify`: its options and result)."""
    from tidemark.verify.run import verify as run  # noqa: PLC0415 - Delta, DuckDB on use

    return run(config_path, tables, wait_s, **options)


class _CallablePackage(types.ModuleType):
    """This package, callable as :func:`verify`."""

    def __call__(self, config_path: str | os.PathLike[str],
                 tables: Sequence[str] | None = None, wait_s: float = 120.0,
                 **options: Any) -> VerifyResult:
        return verify(config_path, tables, wait_s, **options)


sys.modules[__name__].__class__ = _CallablePackage
