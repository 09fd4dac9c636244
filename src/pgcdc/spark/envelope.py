"""The change envelope: one row per committed change, the schema every pgcdc stream shares.

Columns (Spark types; every column nullable):

* ``commit_lsn`` bigint, ``ordinal`` bigint and ``sequence`` struct<commit_lsn, ordinal>: the
  commit record's LSN and the change's position (1, 2, ...) within its transaction. The pair
  is unique and totally ordered, so ``sequence`` is an AUTO CDC ``sequence_by`` column. Never
  order by ``lsn``, the change's own position: a transaction that began earlier and committed
  later has lower change LSNs.
* ``xid`` bigint, ``commit_ts`` timestamp, ``origin`` string.
* ``op``: ``insert``, ``update``, ``delete``, ``truncate`` or ``message``.
* ``schema``, ``table``, ``relation_oid``, ``replica_identity`` (``d``/``n``/``f``/``i``) and
  ``columns`` (array of struct<name, type_oid, type_modifier, key>): the relation as the
  Relation message described it when the change was made, all typing needs.
* ``key`` map<string,string>: the row's identity before the change (the old key or old row's
  key columns when the server sent one, else the key columns of the new row).
* ``before`` map: the old row (replica identity full) or only its key columns; null when the
  server logged no old tuple. ``after`` map: the new row. Values are the server's text output,
  null for SQL NULL.
* ``unchanged_toast`` array<string>: columns absent from ``after`` because their TOASTed value
  did not change; a consumer keeps its current value.
* ``lsn`` bigint: the change's own WAL position.
* ``truncate_cascade``, ``truncate_restart_identity``: the flags of a TRUNCATE (one row per
  table it emptied).
* ``message_prefix``, ``message_content``, ``message_transactional``: a logical decoding
  message (``pg_logical_emit_message``). A non-transactional message is its own unit: its
  ``commit_lsn`` is the message's LSN and its ordinal 1.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql import types as st
from pyspark.sql.pandas.types import to_arrow_schema

from pgcdc.decoding.model import Change, Truncation
from pgcdc.protocol import Lsn, Message, Relation, TupleData, pg_timestamp_to_datetime

__all__ = [
    "ENVELOPE_ARROW_SCHEMA",
    "ENVELOPE_SCHEMA",
    "EnvelopeBuilder",
    "SpooledTransaction",
    "lsn_text",
    "parse_lsn",
]

_COLUMN = st.StructType(
    [
        st.StructField("name", st.StringType()),
        st.StructField("type_oid", st.LongType()),
        st.StructField("type_modifier", st.IntegerType()),
        st.StructField("key", st.BooleanType()),
    ]
)
_TEXT_MAP = st.MapType(st.StringType(), st.StringType(), valueContainsNull=True)
_SEQUENCE = st.StructType(
    [st.StructField("commit_lsn", st.LongType()), st.StructField("ordinal", st.LongType())]
)

ENVELOPE_SCHEMA = st.StructType(
    [
        st.StructField("commit_lsn", st.LongType()),
        st.StructField("ordinal", st.LongType()),
        st.StructField("sequence", _SEQUENCE),
        st.StructField("xid", st.LongType()),
        st.StructField("commit_ts", st.TimestampType()),
        st.StructField("origin", st.StringType()),
        st.StructField("op", st.StringType()),
        st.StructField("schema", st.StringType()),
        st.StructField("table", st.StringType()),
        st.StructField("relation_oid", st.LongType()),
        st.StructField("replica_identity", st.StringType()),
        st.StructField("columns", st.ArrayType(_COLUMN)),
        st.StructField("key", _TEXT_MAP),
        st.StructField("before", _TEXT_MAP),
        st.StructField("after", _TEXT_MAP),
        st.StructField("unchanged_toast", st.ArrayType(st.StringType())),
        st.StructField("lsn", st.LongType()),
        st.StructField("truncate_cascade", st.BooleanType()),
        st.StructField("truncate_restart_identity", st.BooleanType()),
        st.StructField("message_prefix", st.StringType()),
        st.StructField("message_content", st.BinaryType()),
        st.StructField("message_transactional", st.BooleanType()),
    ]
)
ENVELOPE_ARROW_SCHEMA: pa.Schema = to_arrow_schema(ENVELOPE_SCHEMA, timezone="UTC")

#: What a spooled transaction holds, in order: row changes, truncations (with the relations
#: they emptied) and logical messages.
Entry = Change | tuple[Truncation, tuple[Relation, ...]] | Message


@dataclass(slots=True)
class SpooledTransaction:
    """A committed transaction (or a non-transactional message) as the spool keeps it."""

    commit_lsn: Lsn
    end_lsn: Lsn
    xid: int | None
    commit_ts: int | None
    origin: str | None = None
    entries: list[Entry] = field(default_factory=list)

    @property
    def changes(self) -> int:
        return len(self.entries)


def lsn_text(lsn: int) -> str:
    return str(Lsn(lsn))


def parse_lsn(text: str | int) -> Lsn:
    return Lsn(text) if isinstance(text, int) else Lsn.parse(text)


def _text(row: TupleData | None, relation: Relation, only_key: bool = False) -> Any:
    """A tuple as (name, text) pairs; unchanged TOAST columns are left out."""
    if row is None:
        return None
    pairs = []
    for column, kind, value in zip(relation.columns, row.kinds, row.values, strict=True):
        if kind == 0x75 or (only_key and not column.flags & 1):
            continue
        pairs.append((column.name, None if value is None else value.decode()))
    return pairs


def _key(change: Change) -> Any:
    """The row's identity before the change."""
    relation = change.relation
    row = change.old if change.old is not None else change.new
    return _text(row, relation, only_key=True)


_NO_RELATION = (None, None, None, None, None)
_NO_EXTRAS = (None, None, None, None, None)


class EnvelopeBuilder:
    """Turns spooled transactions into envelope record batches (`ENVELOPE_ARROW_SCHEMA`).

    Values must be text (the pipeline's sessions never ask for binary)."""

    def __init__(self) -> None:
        self._rows: list[tuple[Any, ...]] = []
        self._relations: dict[int, tuple[Relation, Any]] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def _columns(self, relation: Relation) -> Any:
        cached = self._relations.get(relation.relid)
        if cached is None or cached[0] is not relation:
            columns = [
                {
                    "name": c.name,
                    "type_oid": c.type_oid,
                    "type_modifier": c.type_modifier,
                    "key": bool(c.flags & 1),
                }
                for c in relation.columns
            ]
            cached = (relation, columns)
            self._relations[relation.relid] = cached
        return cached[1]

    def add(self, txn: SpooledTransaction) -> None:
        commit = int(txn.commit_lsn)
        ts = None if txn.commit_ts is None else pg_timestamp_to_datetime(txn.commit_ts)
        append = self._rows.append
        ordinal = 0

        def head(op: str, rel: Relation | None) -> tuple[Any, ...]:
            seq = {"commit_lsn": commit, "ordinal": ordinal}
            if rel is None:
                return (commit, ordinal, seq, txn.xid, ts, txn.origin, op, *_NO_RELATION)
            return (
                commit,
                ordinal,
                seq,
                txn.xid,
                ts,
                txn.origin,
                op,
                rel.namespace,
                rel.relname,
                rel.relid,
                rel.replica_identity,
                self._columns(rel),
            )

        for entry in txn.entries:
            if isinstance(entry, Change):
                ordinal += 1
                rel, new = entry.relation, entry.new
                append(
                    (
                        *head(entry.action.value, rel),
                        _key(entry),
                        _text(entry.old, rel, only_key=entry.old_kind == "K"),
                        _text(new, rel),
                        None if new is None else list(entry.unchanged_toast_columns),
                        entry.lsn,
                        *_NO_EXTRAS,
                    )
                )
            elif isinstance(entry, Message):
                ordinal += 1
                append(
                    (
                        *head("message", None),
                        None,
                        None,
                        None,
                        None,
                        entry.lsn,
                        None,
                        None,
                        entry.prefix,
                        entry.content,
                        entry.transactional,
                    )
                )
            else:
                truncation, relations = entry
                for rel in relations:
                    ordinal += 1
                    append(
                        (
                            *head("truncate", rel),
                            None,
                            None,
                            None,
                            None,
                            truncation.lsn,
                            truncation.cascade,
                            truncation.restart_seqs,
                            None,
                            None,
                            None,
                        )
                    )

    def add_all(self, txns: Iterable[SpooledTransaction]) -> None:
        for txn in txns:
            self.add(txn)

    def flush(self) -> pa.RecordBatch:
        rows, self._rows = self._rows, []
        columns = list(zip(*rows, strict=True)) if rows else [[] for _ in ENVELOPE_ARROW_SCHEMA]
        arrays = [
            pa.array(col, type=f.type)
            for col, f in zip(columns, ENVELOPE_ARROW_SCHEMA, strict=True)
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=ENVELOPE_ARROW_SCHEMA)
