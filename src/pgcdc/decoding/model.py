"""What output plugin callbacks receive: transactions, row changes and truncations.

These mirror the server's ReorderBufferTXN and ReorderBufferChange as far as pgoutput carries
them. Relations are the codec's `Relation` messages (schema, name, replica identity, columns
with type OID, typmod and key flag); values stay as the server sent them (`TupleData`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from pgcdc.protocol import Lsn, Relation, TupleData, pg_timestamp_to_datetime

__all__ = ["Change", "ChangeAction", "Transaction", "Truncation"]


@dataclass(slots=True)
class Transaction:
    """One (top-level) transaction as the callbacks see it.

    Fields fill in as the stream tells them: a streamed transaction knows only its `xid`
    until Stream Commit or Stream Prepare; `gid` and the prepare fields are set for prepared
    transactions. Times are microseconds since 2000-01-01 UTC as on the wire; the `*_time`
    properties give datetimes. `output_plugin_private` is the plugin's own per-transaction
    state, as ``txn->output_plugin_private`` in the server.
    """

    xid: int
    #: LSN of the commit (or prepare) record: Begin's final_lsn, Commit's commit_lsn.
    final_lsn: Lsn | None = None
    end_lsn: Lsn | None = None
    commit_ts: int | None = None
    origin: str | None = None
    origin_lsn: Lsn | None = None
    gid: str | None = None
    prepare_lsn: Lsn | None = None
    prepare_end_lsn: Lsn | None = None
    prepare_ts: int | None = None
    #: True for a transaction that reaches the plugin through the streaming callbacks.
    streamed: bool = False
    #: For an aborted streamed subtransaction: its top-level transaction (``txn->toptxn``).
    toptxn: Transaction | None = None
    output_plugin_private: Any = None
    #: Row changes delivered so far (insert/update/delete/truncate), as ``txn->nentries``.
    nentries: int = 0

    @property
    def commit_time(self) -> datetime | None:
        return None if self.commit_ts is None else pg_timestamp_to_datetime(self.commit_ts)

    @property
    def prepare_time(self) -> datetime | None:
        return None if self.prepare_ts is None else pg_timestamp_to_datetime(self.prepare_ts)


class ChangeAction(StrEnum):
    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class Change:
    """An INSERT, UPDATE or DELETE of one row.

    `old` is the old key (`old_kind` ``K``: non-key columns come as NULL) or the whole old row
    (``O``, replica identity full); None when the server logged no old tuple. `new` is None for
    a DELETE. `lsn` is the change's own WAL position (order by commit, not by it). `subxid` is
    the (sub)transaction that made the change when it came in a streamed block. For a plugin
    that asks for undecoded rows (`OutputPlugin.undecoded_rows`), `raw` holds the message's
    bytes (`pgcdc.protocol.UndecodedChange`) and `new` and `old` are None.
    """

    action: ChangeAction
    relation: Relation
    new: TupleData | None
    old: TupleData | None = None
    old_kind: str | None = None
    lsn: Lsn | None = None
    subxid: int | None = None
    raw: bytes | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        # Spilled transactions are pickled change by change; see TupleData.__reduce__.
        fields = (self.action, self.relation, self.new, self.old, self.old_kind, self.lsn)
        return (Change, (*fields, self.subxid, self.raw))

    @property
    def unchanged_toast_columns(self) -> tuple[str, ...]:
        """Names of the columns whose TOASTed value did not change and was not sent."""
        if self.new is None:
            return ()
        columns = self.relation.columns
        return tuple(columns[i].name for i in self.new.unchanged_toast_columns)

    def new_values(self) -> dict[str, bytes | None]:
        """Column name to value as sent (None for NULL and for unchanged TOAST)."""
        return _values(self.relation, self.new)

    def old_values(self) -> dict[str, bytes | None]:
        return _values(self.relation, self.old)


def _values(relation: Relation, row: TupleData | None) -> dict[str, bytes | None]:
    if row is None:
        return {}
    return {column.name: value for column, value in zip(relation.columns, row.values, strict=True)}


@dataclass(frozen=True, slots=True)
class Truncation:
    """The flags of a TRUNCATE; the relations come as a separate callback argument."""

    cascade: bool
    restart_seqs: bool
    lsn: Lsn | None = None
    subxid: int | None = None
    relids: tuple[int, ...] = field(default=())
