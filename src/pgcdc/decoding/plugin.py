"""The output plugin API: the server's OutputPluginCallbacks as a Python base class.

A plugin subclasses `OutputPlugin` and overrides the callbacks it implements; a callback it
leaves alone counts as absent (NULL in the C struct). The names are the server's without
``_cb``; each receives the `DecodingContext` first, like ``LogicalDecodingContext *ctx``.

The server's rules are checked when a plugin is loaded (`capabilities`): begin, change and
commit are required; the streaming group (stream_start, stream_stop, stream_abort,
stream_commit, stream_change) is all or nothing, with stream_message and stream_truncate
optional; the two-phase group (begin_prepare, prepare, commit_prepared, rollback_prepared) is
all or nothing, with filter_prepare optional; stream_prepare is required when both are there.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

from pgcdc.decoding.model import Change, Transaction, Truncation
from pgcdc.errors import PluginLoadError
from pgcdc.protocol import Lsn, Relation, UndecodedChanges

if TYPE_CHECKING:
    from pgcdc.decoding.context import DecodingContext

__all__ = [
    "BUILTIN_PLUGINS",
    "OutputPlugin",
    "OutputPluginOptions",
    "OutputType",
    "PluginCapabilities",
    "capabilities",
    "load_plugin",
]


class OutputType(Enum):
    """What the plugin writes: text in the database encoding, or arbitrary bytes."""

    TEXTUAL = "textual"
    BINARY = "binary"


@dataclass(slots=True)
class OutputPluginOptions:
    """What startup may set, as ``OutputPluginOptions`` in the server, plus what pgcdc asks
    pgoutput for on the plugin's behalf."""

    output_type: OutputType = OutputType.TEXTUAL
    #: Only changes made locally (no replication origin): filtered by the server on 16+
    #: (``origin 'none'``) and by pgcdc on older servers.
    only_local: bool = False
    #: Ask pgoutput for values in binary send format where a type has one (``binary 'true'``).
    binary: bool = False


class OutputPlugin:
    """Base class of output plugins; override the callbacks you implement."""

    #: True for a plugin that stores changes to decode them later, in bulk (pgcdc's spool):
    #: its changes carry the message's bytes (`Change.raw`) instead of decoded tuples.
    undecoded_rows: ClassVar[bool] = False

    def startup(self, ctx: DecodingContext, options: OutputPluginOptions, is_init: bool) -> None:
        """Validate ``ctx.options``, set up ``ctx.output_plugin_private``, fill `options`.

        May clear ``ctx.streaming`` or ``ctx.two_phase`` to decline those modes.
        """

    def shutdown(self, ctx: DecodingContext) -> None:
        """Release what startup acquired."""

    def begin(self, ctx: DecodingContext, txn: Transaction) -> None:
        raise NotImplementedError

    def change(
        self, ctx: DecodingContext, txn: Transaction, relation: Relation, change: Change
    ) -> None:
        raise NotImplementedError

    def truncate(
        self,
        ctx: DecodingContext,
        txn: Transaction,
        relations: list[Relation],
        change: Truncation,
    ) -> None:
        raise NotImplementedError

    def undecoded_changes(
        self,
        ctx: DecodingContext,
        txn: Transaction,
        relation_of: Callable[[int], Relation],
        changes: UndecodedChanges,
    ) -> None:
        """Optional, for an `undecoded_rows` plugin: row changes of an ordinary transaction
        whose begin callback ran, as many as the server sent back to back, at once
        (`relation_of` gives the Relation of each relid). Without it, `change` gets them
        one by one; so does a streamed, prepared or held transaction's."""
        raise NotImplementedError

    def commit(self, ctx: DecodingContext, txn: Transaction, commit_lsn: Lsn) -> None:
        raise NotImplementedError

    def message(
        self,
        ctx: DecodingContext,
        txn: Transaction | None,
        lsn: Lsn,
        transactional: bool,
        prefix: str,
        content: bytes,
    ) -> None:
        raise NotImplementedError

    def filter_by_origin(self, ctx: DecodingContext, origin: str) -> bool:
        """True to skip a transaction that came from replication origin `origin`."""
        raise NotImplementedError

    def filter_prepare(self, ctx: DecodingContext, xid: int, gid: str) -> bool:
        """True to decode this prepared transaction at COMMIT PREPARED instead of PREPARE."""
        raise NotImplementedError

    def begin_prepare(self, ctx: DecodingContext, txn: Transaction) -> None:
        raise NotImplementedError

    def prepare(self, ctx: DecodingContext, txn: Transaction, prepare_lsn: Lsn) -> None:
        raise NotImplementedError

    def commit_prepared(self, ctx: DecodingContext, txn: Transaction, commit_lsn: Lsn) -> None:
        raise NotImplementedError

    def rollback_prepared(
        self,
        ctx: DecodingContext,
        txn: Transaction,
        prepare_end_lsn: Lsn,
        prepare_ts: int,
    ) -> None:
        raise NotImplementedError

    def stream_start(self, ctx: DecodingContext, txn: Transaction) -> None:
        raise NotImplementedError

    def stream_stop(self, ctx: DecodingContext, txn: Transaction) -> None:
        raise NotImplementedError

    def stream_abort(self, ctx: DecodingContext, txn: Transaction, abort_lsn: Lsn | None) -> None:
        """`txn.xid` is the aborted (sub)transaction; the top-level one when they are equal."""
        raise NotImplementedError

    def stream_prepare(self, ctx: DecodingContext, txn: Transaction, prepare_lsn: Lsn) -> None:
        raise NotImplementedError

    def stream_commit(self, ctx: DecodingContext, txn: Transaction, commit_lsn: Lsn) -> None:
        raise NotImplementedError

    def stream_change(
        self, ctx: DecodingContext, txn: Transaction, relation: Relation, change: Change
    ) -> None:
        raise NotImplementedError

    def stream_message(
        self,
        ctx: DecodingContext,
        txn: Transaction,
        lsn: Lsn,
        transactional: bool,
        prefix: str,
        content: bytes,
    ) -> None:
        raise NotImplementedError

    def stream_truncate(
        self,
        ctx: DecodingContext,
        txn: Transaction,
        relations: list[Relation],
        change: Truncation,
    ) -> None:
        raise NotImplementedError


CALLBACKS = (
    "begin", "change", "truncate", "commit", "message", "filter_by_origin", "filter_prepare",
    "begin_prepare", "prepare", "commit_prepared", "rollback_prepared", "stream_start",
    "stream_stop", "stream_abort", "stream_prepare", "stream_commit", "stream_change",
    "stream_message", "stream_truncate",
)  # fmt: skip
_REQUIRED = ("begin", "change", "commit")
_STREAMING = ("stream_start", "stream_stop", "stream_abort", "stream_commit", "stream_change")
_STREAMING_OPTIONAL = ("stream_message", "stream_truncate")
_TWO_PHASE = ("begin_prepare", "prepare", "commit_prepared", "rollback_prepared")


@dataclass(frozen=True, slots=True)
class PluginCapabilities:
    """Which callbacks a plugin class implements, and what that lets pgcdc ask the server for."""

    implemented: frozenset[str]
    streaming: bool
    two_phase: bool

    def has(self, callback: str) -> bool:
        return callback in self.implemented


def capabilities(cls: type[OutputPlugin]) -> PluginCapabilities:
    """Check `cls` against the callback rules; PluginLoadError names what is missing."""
    name = f"{cls.__module__}.{cls.__qualname__}"
    if not (isinstance(cls, type) and issubclass(cls, OutputPlugin)):
        raise PluginLoadError(f"{name} is not a subclass of pgcdc.decoding.OutputPlugin")
    implemented = frozenset(
        callback
        for callback in CALLBACKS
        if getattr(cls, callback) is not getattr(OutputPlugin, callback)
    )

    def missing(group: tuple[str, ...]) -> list[str]:
        return [callback for callback in group if callback not in implemented]

    if lacking := missing(_REQUIRED):
        raise PluginLoadError(
            f"output plugin {name} does not implement {_names(lacking)} "
            "(begin, change and commit are required)"
        )
    streaming = bool(implemented & {*_STREAMING, *_STREAMING_OPTIONAL})
    if streaming and (lacking := missing(_STREAMING)):
        raise PluginLoadError(
            f"output plugin {name} implements streaming callbacks but not {_names(lacking)} "
            f"(streaming needs all of {_names(_STREAMING)})"
        )
    two_phase = bool(implemented & {*_TWO_PHASE, "filter_prepare"})
    if two_phase and (lacking := missing(_TWO_PHASE)):
        raise PluginLoadError(
            f"output plugin {name} implements two-phase callbacks but not {_names(lacking)} "
            f"(two-phase needs all of {_names(_TWO_PHASE)})"
        )
    if streaming and two_phase and "stream_prepare" not in implemented:
        raise PluginLoadError(
            f"output plugin {name} supports streaming and two-phase but does not implement "
            "stream_prepare, which then is required"
        )
    if "stream_prepare" in implemented and not (streaming and two_phase):
        raise PluginLoadError(
            f"output plugin {name} implements stream_prepare without both the streaming and "
            "the two-phase callbacks"
        )
    return PluginCapabilities(implemented, streaming, two_phase)


def _names(callbacks: tuple[str, ...] | list[str]) -> str:
    return ", ".join(callbacks)


#: Built-in plugins by the name ``-P`` takes.
BUILTIN_PLUGINS = {
    "test_decoding": "pgcdc.plugins.test_decoding:TestDecoding",
    "wal2json": "pgcdc.plugins.wal2json:Wal2Json",
    "json": "pgcdc.plugins.json_envelope:JsonEnvelope",
}


def load_plugin(spec: str) -> type[OutputPlugin]:
    """A plugin class from a built-in name or ``module:Class``; checked against the rules."""
    path = BUILTIN_PLUGINS.get(spec, spec)
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise PluginLoadError(
            f"unknown output plugin {spec!r}: use a built-in name "
            f"({', '.join(BUILTIN_PLUGINS)}) or module:Class"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PluginLoadError(
            f"cannot import output plugin module {module_name!r}: {exc}"
        ) from None
    cls: Any = module
    for part in attr.split("."):
        cls = getattr(cls, part, None)
        if cls is None:
            raise PluginLoadError(f"module {module_name!r} has no output plugin class {attr!r}")
    capabilities(cls)
    return cls  # checked by capabilities()
