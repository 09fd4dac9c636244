"""The decoding context handed to every callback, like the server's LogicalDecodingContext.

It carries the plugin's options (as given, validated by the plugin's startup), its private
state, the output writer and read-only catalog access. Output follows the server's protocol:
``prepare_write()``, append to ``ctx.out``, ``write()``; a write without a prepare is an error,
as in the server.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pgcdc.decoding.catalog import Catalog
from pgcdc.decoding.plugin import OutputType
from pgcdc.errors import PluginError, PluginOptionError
from pgcdc.protocol import Lsn

__all__ = ["DecodingContext", "OutputWrite", "parse_bool_option"]


@dataclass(frozen=True, slots=True)
class OutputWrite:
    """One piece of plugin output, with the position and transaction it belongs to."""

    data: bytes
    lsn: Lsn | None
    xid: int | None
    last_write: bool


@dataclass(slots=True)
class DecodingContext:
    """State shared by one plugin's callbacks for a session.

    `options` maps each ``-o NAME[=VALUE]`` to its value (None when given without one).
    `streaming` and `two_phase` say what this session may use; startup may clear them.
    """

    options: dict[str, str | None] = field(default_factory=dict)
    slot_name: str = ""
    server_version: int = 0
    catalog: Catalog | None = None
    streaming: bool = False
    two_phase: bool = False
    output_type: OutputType = OutputType.TEXTUAL
    output_plugin_private: Any = None
    #: Where finished writes go; the runner sets it (the `tail` command prints them).
    sink: Callable[[OutputWrite], None] | None = None
    #: The output buffer between prepare_write() and write(), as ``ctx->out``.
    out: bytearray = field(default_factory=bytearray)
    #: Position and xid of the callback being run, recorded with each write.
    write_location: Lsn | None = None
    write_xid: int | None = None
    _prepared: bool = False

    def prepare_write(self, last_write: bool = True) -> None:
        """Start a new piece of output (``OutputPluginPrepareWrite``)."""
        self.out.clear()
        self._prepared = True

    def append(self, text: str | bytes) -> None:
        """Append to `out`: text is encoded as UTF-8 (the session's client_encoding)."""
        self.out += text.encode() if isinstance(text, str) else text

    def write(self, last_write: bool = True) -> None:
        """Hand `out` to the sink (``OutputPluginWrite``). The bytes go as they are, whatever
        the output type: the server does not check that a textual plugin wrote valid text
        either (test_decoding and wal2json copy a logical message's bytes into their text)."""
        if not self._prepared:
            raise PluginError("write() called without prepare_write() (OutputPluginPrepareWrite)")
        self._prepared = False
        if self.sink is not None:
            self.sink(OutputWrite(bytes(self.out), self.write_location, self.write_xid, last_write))

    def bool_option(self, name: str, default: bool) -> bool:
        """The option `name` read as a boolean the way the server's parse_bool reads it."""
        if name not in self.options:
            return default
        return parse_bool_option(name, self.options[name])


def parse_bool_option(name: str, value: str | None) -> bool:
    """A plugin option as a boolean: no value means true; else the server's ``parse_bool``:
    a prefix of true, false, yes or no, ``on``, a prefix of ``off`` from two letters, ``1`` or
    ``0``, ASCII letters in any case, nothing else (no surrounding spaces)."""
    if value is None:
        return True
    parsed = _parse_bool(value)
    if parsed is None:
        raise PluginOptionError(f'could not parse value "{value}" for parameter "{name}"')
    return parsed


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _parse_bool(value: str) -> bool | None:
    """``parse_bool``'s answer, None where it refuses the text."""
    text = value.translate(_ASCII_LOWER)  # pg_strncasecmp folds ASCII letters only
    first = text[:1]
    if first == "o":  # "o" alone is not unique enough
        if text == "on":
            return True
        return False if len(text) >= 2 and "off".startswith(text) else None
    for word, meaning in (("true", True), ("false", False), ("yes", True), ("no", False)):
        if first == word[0]:
            return meaning if word.startswith(text) else None
    return {"1": True, "0": False}.get(text)
