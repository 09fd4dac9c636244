"""PostgreSQL's contrib ``test_decoding`` output plugin, rewritten in Python on pgoutput.

The text is meant to be the server plugin's, line for line, so that tools written against
``test_decoding`` (and its regression tests) work unchanged; the comparison battery in
``tests/plugins/test_test_decoding.py`` holds it against the real plugin. Options are the
server's: ``include-xids`` (default on), ``include-timestamp``, ``skip-empty-xacts``,
``only-local``, ``stream-changes``, ``include-rewrites`` and ``force-binary``; anything else is
rejected as ``option "NAME" = "VALUE" is unknown``. Since PostgreSQL 15 there is no two-phase
option: two-phase decoding follows the slot (here: ``StreamOptions(two_phase=True)``).

Values are the text pgoutput sends, which the walsender produces with the output functions
under pgcdc's pinned session settings (DateStyle ISO, TimeZone UTC, extra_float_digits 3, ...);
the server plugin's output matches when its session uses the same settings. Timestamps in
``(at ...)`` are printed in UTC, as ``timestamptz_to_str`` does in such a session.

Where the output cannot match, because pgoutput does not carry what ``test_decoding`` sees:

- empty transactions (DDL only, or only changes pgoutput does not publish): pgoutput on 15+
  sends nothing for them, so their ``BEGIN``/``COMMIT`` pair is missing unless
  ``skip-empty-xacts`` is on (prepared and streamed transactions are still sent);
- changes of tables outside the publication, and of tables with replica identity NOTHING
  when the publication publishes updates/deletes (the server refuses those statements; with a
  publication that publishes only inserts, the UPDATE/DELETE lines are missing);
- generated columns (pgoutput before 18 does not send them, ``test_decoding`` prints them);
- ``include-rewrites``: the changes of table rewrites are never published, the option is
  accepted and has no effect;
- catalog lookups (type names, keyword quoting) use the current catalog, not the historic
  snapshot of the change, so a type renamed since the change prints its new name.

The plugin's own behaviour changed once: up to PostgreSQL 16 a transactional logical message
under ``skip-empty-xacts`` neither writes the held-back ``BEGIN`` nor counts as a change (checked
against 15); the 18 source does both, in streaming mode too, and 17 is taken to as well.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgcdc.decoding import (
    Change,
    ChangeAction,
    DecodingContext,
    OutputPlugin,
    OutputPluginOptions,
    OutputType,
    Transaction,
    Truncation,
    parse_bool_option,
)
from pgcdc.decoding.catalog import Catalog
from pgcdc.errors import PluginError, PluginOptionError
from pgcdc.plugins.pgtext import timestamptz_to_str
from pgcdc.protocol import Lsn, Relation, TupleData

__all__ = ["TestDecoding", "print_literal", "quote_literal", "timestamptz_to_str"]

# Type OIDs print_literal treats specially (pg_type.h).
_BOOLOID = 16
_UNQUOTED = frozenset({20, 21, 23, 26, 700, 701, 1700})  # int8 int2 int4 oid float4 float8 numeric
_BITS = frozenset({1560, 1562})  # bit, varbit


_TAG_N, _TAG_U, _TAG_T = 0x6E, 0x75, 0x74  # TupleData kinds n, u, t


@dataclass(slots=True)
class _Settings:
    include_xids: bool = True
    include_timestamp: bool = False
    skip_empty_xacts: bool = False
    only_local: bool = False
    #: Transactional messages write the lazy BEGIN and count as changes (PostgreSQL 17+).
    messages_open_xact: bool = True


@dataclass(slots=True)
class _TxnState:
    """``TestDecodingTxnData``: what the transaction and its current stream block wrote."""

    xact_wrote_changes: bool = False
    stream_wrote_changes: bool = False


class TestDecoding(OutputPlugin):
    """``contrib/test_decoding``: one text line per BEGIN, change, message and COMMIT."""

    __test__ = False  # not a pytest test class, whatever its name says

    def startup(self, ctx: DecodingContext, options: OutputPluginOptions, is_init: bool) -> None:
        """Read the options in order, failing on the first bad one, as the server does."""
        data = _Settings(messages_open_xact=ctx.server_version >= 170000)
        options.output_type = OutputType.TEXTUAL
        enable_streaming = False
        for name, value in ctx.options.items():
            if name == "include-xids":
                data.include_xids = value is None or parse_bool_option(name, value)
            elif name == "include-timestamp":
                data.include_timestamp = value is None or parse_bool_option(name, value)
            elif name == "force-binary":
                if value is not None and parse_bool_option(name, value):
                    options.output_type = OutputType.BINARY
            elif name == "skip-empty-xacts":
                data.skip_empty_xacts = value is None or parse_bool_option(name, value)
            elif name == "only-local":
                data.only_local = value is None or parse_bool_option(name, value)
            elif name == "include-rewrites":
                if value is not None:
                    parse_bool_option(name, value)  # validated; rewrites never reach pgoutput
            elif name == "stream-changes":
                if value is not None:
                    enable_streaming = parse_bool_option(name, value)
            else:
                shown = "(null)" if value is None else value
                raise PluginOptionError(f'option "{name}" = "{shown}" is unknown')
        options.only_local = data.only_local
        ctx.streaming = ctx.streaming and enable_streaming
        ctx.output_plugin_private = data

    def shutdown(self, ctx: DecodingContext) -> None:
        ctx.output_plugin_private = None

    # -- helpers -------------------------------------------------------------------------------

    @staticmethod
    def _data(ctx: DecodingContext) -> _Settings:
        data = ctx.output_plugin_private
        assert isinstance(data, _Settings), "startup() was not run"
        return data

    @staticmethod
    def _state(txn: Transaction) -> _TxnState:
        state = txn.output_plugin_private
        if not isinstance(state, _TxnState):
            state = txn.output_plugin_private = _TxnState()
        return state

    @staticmethod
    def _line(ctx: DecodingContext, text: str | bytes, last_write: bool = True) -> None:
        ctx.prepare_write(last_write)
        ctx.append(text)
        ctx.write(last_write)

    def _output_begin(self, ctx: DecodingContext, txn: Transaction, last_write: bool) -> None:
        data = self._data(ctx)
        self._line(ctx, f"BEGIN {txn.xid}" if data.include_xids else "BEGIN", last_write)

    def _output_stream_start(
        self, ctx: DecodingContext, txn: Transaction, last_write: bool
    ) -> None:
        text = "opening a streamed block for transaction"
        if self._data(ctx).include_xids:
            text += f" TXN {txn.xid}"
        self._line(ctx, text, last_write)

    def _wrote_change(self, ctx: DecodingContext, txn: Transaction) -> None:
        """Write the BEGIN that skip-empty-xacts held back, then mark the transaction used."""
        state = self._state(txn)
        if self._data(ctx).skip_empty_xacts and not state.xact_wrote_changes:
            self._output_begin(ctx, txn, last_write=False)
        state.xact_wrote_changes = True

    def _wrote_stream_change(self, ctx: DecodingContext, txn: Transaction) -> None:
        """The same for a stream block's opening line."""
        state = self._state(txn)
        if self._data(ctx).skip_empty_xacts and not state.stream_wrote_changes:
            self._output_stream_start(ctx, txn, last_write=False)
        state.xact_wrote_changes = state.stream_wrote_changes = True

    def _at(self, ctx: DecodingContext, timestamp: int | None) -> str:
        if not self._data(ctx).include_timestamp:
            return ""
        return f" (at {timestamptz_to_str(timestamp)})"

    def _txid(self, ctx: DecodingContext, txn: Transaction) -> str:
        return f", txid {txn.xid}" if self._data(ctx).include_xids else ""

    # -- transactions --------------------------------------------------------------------------

    def begin(self, ctx: DecodingContext, txn: Transaction) -> None:
        txn.output_plugin_private = _TxnState()
        if not self._data(ctx).skip_empty_xacts:
            self._output_begin(ctx, txn, last_write=True)

    def commit(self, ctx: DecodingContext, txn: Transaction, commit_lsn: Lsn) -> None:
        data = self._data(ctx)
        wrote = self._state(txn).xact_wrote_changes
        txn.output_plugin_private = None
        if data.skip_empty_xacts and not wrote:
            return
        text = f"COMMIT {txn.xid}" if data.include_xids else "COMMIT"
        self._line(ctx, text + self._at(ctx, txn.commit_ts))

    def begin_prepare(self, ctx: DecodingContext, txn: Transaction) -> None:
        self.begin(ctx, txn)

    def prepare(self, ctx: DecodingContext, txn: Transaction, prepare_lsn: Lsn) -> None:
        if self._data(ctx).skip_empty_xacts and not self._state(txn).xact_wrote_changes:
            return
        text = f"PREPARE TRANSACTION {quote_literal(txn.gid or '')}" + self._txid(ctx, txn)
        self._line(ctx, text + self._at(ctx, txn.prepare_ts))

    def commit_prepared(self, ctx: DecodingContext, txn: Transaction, commit_lsn: Lsn) -> None:
        text = f"COMMIT PREPARED {quote_literal(txn.gid or '')}" + self._txid(ctx, txn)
        self._line(ctx, text + self._at(ctx, txn.commit_ts))

    def rollback_prepared(
        self, ctx: DecodingContext, txn: Transaction, prepare_end_lsn: Lsn, prepare_ts: int
    ) -> None:
        # The server prints xact_time, which for a rollback holds the rollback's time.
        text = f"ROLLBACK PREPARED {quote_literal(txn.gid or '')}" + self._txid(ctx, txn)
        self._line(ctx, text + self._at(ctx, txn.commit_ts))

    def filter_prepare(self, ctx: DecodingContext, xid: int, gid: str) -> bool:
        """Prepared transactions whose gid contains ``_nodecode`` are decoded at commit."""
        return "_nodecode" in gid

    def filter_by_origin(self, ctx: DecodingContext, origin: str) -> bool:
        return self._data(ctx).only_local

    # -- changes -------------------------------------------------------------------------------

    def change(
        self, ctx: DecodingContext, txn: Transaction, relation: Relation, change: Change
    ) -> None:
        self._wrote_change(ctx, txn)
        catalog = _catalog(ctx)
        parts = ["table ", _qualified_name(catalog, relation), ":"]
        if change.action is ChangeAction.INSERT:
            parts.append(" INSERT:")
            _tuple_or_none(parts, catalog, relation, change.new, skip_nulls=False)
        elif change.action is ChangeAction.UPDATE:
            parts.append(" UPDATE:")
            if change.old is not None:
                parts.append(" old-key:")
                _tuple_to_text(parts, catalog, relation, change.old, skip_nulls=True)
                parts.append(" new-tuple:")
            _tuple_or_none(parts, catalog, relation, change.new, skip_nulls=False)
        else:
            parts.append(" DELETE:")
            _tuple_or_none(parts, catalog, relation, change.old, skip_nulls=True)
        self._line(ctx, "".join(parts))

    def truncate(
        self,
        ctx: DecodingContext,
        txn: Transaction,
        relations: list[Relation],
        change: Truncation,
    ) -> None:
        self._wrote_change(ctx, txn)
        catalog = _catalog(ctx)
        names = ", ".join(_qualified_name(catalog, relation) for relation in relations)
        flags = ""
        if change.restart_seqs:
            flags += " restart_seqs"
        if change.cascade:
            flags += " cascade"
        self._line(ctx, f"table {names}: TRUNCATE:{flags or ' (no-flags)'}")

    def message(
        self,
        ctx: DecodingContext,
        txn: Transaction | None,
        lsn: Lsn,
        transactional: bool,
        prefix: str,
        content: bytes,
    ) -> None:
        if transactional and txn is not None and self._data(ctx).messages_open_xact:
            self._wrote_change(ctx, txn)
        head = f"message: transactional: {int(transactional)} prefix: {prefix}, sz: {len(content)}"
        self._line(ctx, head.encode() + b" content:" + content)

    # -- streaming -----------------------------------------------------------------------------

    def stream_start(self, ctx: DecodingContext, txn: Transaction) -> None:
        self._state(txn).stream_wrote_changes = False
        if not self._data(ctx).skip_empty_xacts:
            self._output_stream_start(ctx, txn, last_write=True)

    def stream_stop(self, ctx: DecodingContext, txn: Transaction) -> None:
        data = self._data(ctx)
        if data.skip_empty_xacts and not self._state(txn).stream_wrote_changes:
            return
        text = "closing a streamed block for transaction"
        self._line(ctx, text + (f" TXN {txn.xid}" if data.include_xids else ""))

    def stream_abort(self, ctx: DecodingContext, txn: Transaction, abort_lsn: Lsn | None) -> None:
        """Also for a subtransaction; its state lives with the top-level transaction."""
        data = self._data(ctx)
        top = txn.toptxn if txn.toptxn is not None else txn
        state = top.output_plugin_private
        wrote = isinstance(state, _TxnState) and state.xact_wrote_changes
        if txn.toptxn is None:
            txn.output_plugin_private = None
        if data.skip_empty_xacts and not wrote:
            return
        text = "aborting streamed (sub)transaction"
        self._line(ctx, text + (f" TXN {txn.xid}" if data.include_xids else ""))

    def stream_prepare(self, ctx: DecodingContext, txn: Transaction, prepare_lsn: Lsn) -> None:
        data = self._data(ctx)
        if data.skip_empty_xacts and not self._state(txn).xact_wrote_changes:
            return
        gid = quote_literal(txn.gid or "")
        if data.include_xids:
            text = f"preparing streamed transaction TXN {gid}, txid {txn.xid}"
        else:
            text = f"preparing streamed transaction {gid}"
        self._line(ctx, text + self._at(ctx, txn.prepare_ts))

    def stream_commit(self, ctx: DecodingContext, txn: Transaction, commit_lsn: Lsn) -> None:
        data = self._data(ctx)
        wrote = self._state(txn).xact_wrote_changes
        txn.output_plugin_private = None
        if data.skip_empty_xacts and not wrote:
            return
        text = "committing streamed transaction"
        if data.include_xids:
            text += f" TXN {txn.xid}"
        self._line(ctx, text + self._at(ctx, txn.commit_ts))

    def stream_change(
        self, ctx: DecodingContext, txn: Transaction, relation: Relation, change: Change
    ) -> None:
        """Only a marker: the contents would show changes that may still abort."""
        self._wrote_stream_change(ctx, txn)
        if self._data(ctx).include_xids:
            self._line(ctx, f"streaming change for TXN {txn.xid}")
        else:
            self._line(ctx, "streaming change for transaction")

    def stream_message(
        self,
        ctx: DecodingContext,
        txn: Transaction,
        lsn: Lsn,
        transactional: bool,
        prefix: str,
        content: bytes,
    ) -> None:
        if transactional and self._data(ctx).messages_open_xact:
            self._wrote_stream_change(ctx, txn)
        head = (
            f"streaming message: transactional: {int(transactional)} prefix: {prefix}, "
            f"sz: {len(content)}"
        )
        if transactional:
            self._line(ctx, head)
        else:
            self._line(ctx, head.encode() + b" content:" + content)

    def stream_truncate(
        self,
        ctx: DecodingContext,
        txn: Transaction,
        relations: list[Relation],
        change: Truncation,
    ) -> None:
        self._wrote_stream_change(ctx, txn)
        if self._data(ctx).include_xids:
            self._line(ctx, f"streaming truncate for TXN {txn.xid}")
        else:
            self._line(ctx, "streaming truncate for transaction")


# -- formatting ------------------------------------------------------------------------------


def _catalog(ctx: DecodingContext) -> Catalog:
    if ctx.catalog is None:
        raise PluginError("test_decoding needs catalog access (type names, identifier quoting)")
    return ctx.catalog


def _qualified_name(catalog: Catalog, relation: Relation) -> str:
    """``quote_qualified_identifier(namespace, relname)``."""
    schema, name = relation.schema, relation.relname
    return f"{catalog.quote_identifier(schema)}.{catalog.quote_identifier(name)}"


def _tuple_or_none(
    parts: list[str],
    catalog: Catalog,
    relation: Relation,
    row: TupleData | None,
    *,
    skip_nulls: bool,
) -> None:
    if row is None:
        parts.append(" (no-tuple-data)")
    else:
        _tuple_to_text(parts, catalog, relation, row, skip_nulls=skip_nulls)


def _tuple_to_text(
    parts: list[str],
    catalog: Catalog,
    relation: Relation,
    row: TupleData,
    *,
    skip_nulls: bool,
) -> None:
    """`` name[type]:value`` per column; NULLs left out of old tuples, as the server does."""
    columns = relation.columns
    if len(columns) != len(row.kinds):
        raise PluginError(
            f"relation {relation.schema}.{relation.relname} has {len(columns)} columns, "
            f"the row {len(row.kinds)}"
        )
    for column, kind, value in zip(columns, row.kinds, row.values, strict=True):
        if kind == _TAG_N and skip_nulls:
            continue
        parts.append(" ")
        parts.append(catalog.quote_identifier(column.name))
        parts.append("[")
        parts.append(catalog.type_name(column.type_oid))
        parts.append("]:")
        if kind == _TAG_N:
            parts.append("null")
        elif kind == _TAG_U:
            parts.append("unchanged-toast-datum")
        elif kind == _TAG_T and value is not None:
            parts.append(print_literal(column.type_oid, value.decode()))
        else:
            raise PluginError(
                f"test_decoding needs text values, column {column.name} came as {chr(kind)!r}"
            )


def print_literal(type_oid: int, text: str) -> str:
    """A value's text output as test_decoding prints it: numbers bare, bits as ``B'...'``,
    booleans as true/false, everything else single-quoted with quotes doubled."""
    if type_oid in _UNQUOTED:
        return text
    if type_oid in _BITS:
        return f"B'{text}'"
    if type_oid == _BOOLOID:
        return "true" if text == "t" else "false"
    return "'" + text.replace("'", "''") + "'"


def quote_literal(text: str) -> str:
    """The server's ``quote_literal_cstr``: quotes and backslashes doubled, ``E`` prefix
    when there is a backslash."""
    quoted = "'" + text.replace("'", "''").replace("\\", "\\\\") + "'"
    return "E" + quoted if "\\" in text else quoted
