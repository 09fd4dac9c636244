"""``json``: pgcdc's own change envelope, one JSON object per line.

Each row change becomes one line::

    {"op": "update", "schema": "public", "table": "t",
     "commit_lsn": "0/1958AA0", "ordinal": 2, "xid": 735,
     "commit_ts": "2026-11-22T02:04:50.207368+00:00", "origin": null,
     "key": {"id": "1"}, "before": null, "after": {"id": "1", "v": "z"},
     "unchanged_toast": [], "lsn": "0/19589F0"}

``(commit_lsn, ordinal)`` is unique and totally ordered across the lines of committed
transactions (non-transactional messages, below, have no commit_lsn), so it can sequence
changes (Spark's AUTO CDC ``sequence_by``); never order by ``lsn``, a change's own position.
``key`` identifies the row before the change: the old key when the server sent one (a key
change or replica identity full), otherwise the key columns of the new row.
``before`` is the old row, or only the old key's columns (None when nothing was logged).
Values are the server's text output (strings, JSON null for NULL); columns in
``unchanged_toast`` were not sent and keep their previous value. With ``--binary`` the
server's binary values appear as ``\\x``-prefixed hex.

A TRUNCATE gives one line per table (``op`` "truncate", with ``cascade`` and
``restart_seqs``); a logical message gives ``op`` "message" with ``prefix``, ``content``
(text, or ``\\x`` hex when not UTF-8) and ``transactional``; non-transactional messages carry
``commit_lsn`` null and the message's ``lsn``.

Options: ``include-columns`` adds ``columns`` (name, type OID, typmod, key flag) to each
line, what typing needs without a catalog; ``include-begin-commit`` adds ``begin`` and
``commit`` lines with the transaction's ``end_lsn``.

The plugin has no streaming or two-phase callbacks on purpose: a line is written only for
committed data, so a consumer never has to take anything back.
"""

from __future__ import annotations

import json
from typing import Any

from pgcdc.decoding import (
    Change,
    DecodingContext,
    OutputPlugin,
    OutputPluginOptions,
    Transaction,
    Truncation,
)
from pgcdc.envelope.images import KIND_BINARY, key_pairs, row_pairs
from pgcdc.errors import PluginOptionError
from pgcdc.protocol import Lsn, Relation, TupleData

__all__ = ["JsonEnvelope"]

_OPTIONS = ("include-columns", "include-begin-commit")


class JsonEnvelope(OutputPlugin):
    def startup(self, ctx: DecodingContext, options: OutputPluginOptions, is_init: bool) -> None:
        for name in ctx.options:
            if name not in _OPTIONS:
                raise PluginOptionError(
                    f"option {name!r} is unknown to the json plugin (known: {', '.join(_OPTIONS)})"
                )
        ctx.output_plugin_private = _Settings(
            columns=ctx.bool_option("include-columns", False),
            begin_commit=ctx.bool_option("include-begin-commit", False),
        )

    def begin(self, ctx: DecodingContext, txn: Transaction) -> None:
        txn.output_plugin_private = 0  # ordinal of the last line written for this transaction
        if ctx.output_plugin_private.begin_commit:
            _emit(ctx, _source(txn, "begin"))

    def change(
        self, ctx: DecodingContext, txn: Transaction, relation: Relation, change: Change
    ) -> None:
        line = _source(txn, change.action.value, relation)
        line["key"] = _key(relation, change)
        line["before"] = _row(relation, change.old, key_only=change.old_kind == "K")
        line["after"] = _row(relation, change.new)
        line["unchanged_toast"] = list(change.unchanged_toast_columns)
        line["lsn"] = _lsn(change.lsn)
        _emit(ctx, _number(ctx, txn, line, relation))

    def truncate(
        self,
        ctx: DecodingContext,
        txn: Transaction,
        relations: list[Relation],
        change: Truncation,
    ) -> None:
        for relation in relations:
            line = _source(txn, "truncate", relation)
            line["cascade"] = change.cascade
            line["restart_seqs"] = change.restart_seqs
            line["lsn"] = _lsn(change.lsn)
            _emit(ctx, _number(ctx, txn, line, relation))

    def message(
        self,
        ctx: DecodingContext,
        txn: Transaction | None,
        lsn: Lsn,
        transactional: bool,
        prefix: str,
        content: bytes,
    ) -> None:
        line = _source(txn, "message") if txn is not None else _nontransactional()
        line["prefix"] = prefix
        line["content"] = _text(content)
        line["transactional"] = transactional
        line["lsn"] = _lsn(lsn)
        _emit(ctx, _number(ctx, txn, line, None) if txn is not None else line)

    def commit(self, ctx: DecodingContext, txn: Transaction, commit_lsn: Lsn) -> None:
        if ctx.output_plugin_private.begin_commit:
            line = _source(txn, "commit")
            line["end_lsn"] = _lsn(txn.end_lsn)
            _emit(ctx, line)


class _Settings:
    __slots__ = ("begin_commit", "columns")

    def __init__(self, columns: bool, begin_commit: bool) -> None:
        self.columns = columns
        self.begin_commit = begin_commit


def _source(txn: Transaction, op: str, relation: Relation | None = None) -> dict[str, Any]:
    line: dict[str, Any] = {"op": op}
    if relation is not None:
        line["schema"] = relation.schema
        line["table"] = relation.relname
    line["commit_lsn"] = _lsn(txn.final_lsn)
    line["ordinal"] = None
    line["xid"] = txn.xid
    commit_time = txn.commit_time
    line["commit_ts"] = None if commit_time is None else commit_time.isoformat()
    line["origin"] = txn.origin
    return line


def _nontransactional() -> dict[str, Any]:
    return {"op": "message", "commit_lsn": None, "ordinal": None, "xid": None}


def _number(
    ctx: DecodingContext, txn: Transaction, line: dict[str, Any], relation: Relation | None
) -> dict[str, Any]:
    txn.output_plugin_private = (txn.output_plugin_private or 0) + 1
    line["ordinal"] = txn.output_plugin_private
    if relation is not None and ctx.output_plugin_private.columns:
        line["columns"] = [
            {
                "name": column.name,
                "type_oid": column.type_oid,
                "type_modifier": column.type_modifier,
                "key": column.is_key,
            }
            for column in relation.columns
        ]
    return line


def _value(kind: int, value: bytes) -> str:
    """A sent value: the server's text, or ``\\x`` hex of a binary one."""
    return "\\x" + value.hex() if kind == KIND_BINARY else value.decode()


def _key(relation: Relation, change: Change) -> dict[str, str | None] | None:
    """The replica identity of the row before the change (`pgcdc.envelope.images`)."""
    pairs = key_pairs(relation, change.new, change.old, value=_value)
    return dict(pairs) if pairs else None


def _row(
    relation: Relation, row: TupleData | None, key_only: bool = False
) -> dict[str, str | None] | None:
    """Column name to value, by the envelope's rule (`pgcdc.envelope.images`)."""
    pairs = row_pairs(relation, row, key_only=key_only, value=_value)
    return None if pairs is None else dict(pairs)


def _text(content: bytes) -> str:
    try:
        return content.decode()
    except UnicodeDecodeError:
        return "\\x" + content.hex()


def _lsn(lsn: Lsn | None) -> str | None:
    return None if lsn is None else str(Lsn(lsn))


def _emit(ctx: DecodingContext, line: dict[str, Any]) -> None:
    ctx.prepare_write()
    ctx.append(json.dumps(line, ensure_ascii=False, separators=(", ", ": ")))
    ctx.write()
