"""Sizes and durations for people."""

from __future__ import annotations

__all__ = ["format_bytes", "format_seconds"]


def format_bytes(value: int | None) -> str:
    """A byte count for people: ``512 B``, ``1.5 MB`` (powers of 1024); "" for None."""
    if value is None:
        return ""
    size = float(value)
    for unit in ("B", "kB", "MB", "GB"):
        if abs(size) < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(value)


def format_seconds(seconds: float) -> str:
    """A duration for people: ``45 s``, ``12 min``, ``3.5 h``, ``2.0 d``."""
    magnitude = abs(seconds)
    if magnitude < 120:
        return f"{seconds:.0f} s"
    if magnitude < 7200:
        return f"{seconds / 60:.0f} min"
    if magnitude < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"
