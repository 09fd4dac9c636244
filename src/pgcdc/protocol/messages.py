"""Typed, immutable pgoutput messages (logical replication protocol versions 1-4).

Field names are the protocol's own. LSNs are `Lsn`; timestamps stay as the wire's integer
microseconds since 2000-01-01 UTC (exact, and cheap on the hot path) with a datetime property
beside them. Column values stay as the bytes the server sent: turning them into Python values
is the type system's job (`pgcdc.types`), and keeping bytes makes the encoder an exact inverse.

`xid` on Relation, Type, Insert, Update, Delete, Truncate and Message is the (sub)transaction
id prefix that the server adds only inside a Stream Start ... Stream Stop block; it is None
elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, ClassVar, Literal

from pgcdc.protocol.lsn import Lsn, pg_timestamp_to_datetime

__all__ = [
    "Begin",
    "BeginPrepare",
    "Column",
    "Commit",
    "CommitPrepared",
    "Delete",
    "Insert",
    "Message",
    "Origin",
    "PgoutputMessage",
    "Prepare",
    "Relation",
    "RollbackPrepared",
    "StreamAbort",
    "StreamCommit",
    "StreamPrepare",
    "StreamStart",
    "StreamStop",
    "Truncate",
    "TupleData",
    "Type",
    "UndecodedChange",
    "Update",
]

OldTupleKind = Literal["K", "O"]


@dataclass(frozen=True, slots=True)
class TupleData:
    """One row as pgoutput sends it.

    `kinds` has one byte per column: ``n`` NULL, ``u`` unchanged TOASTed value (not sent),
    ``t`` text output, ``b`` binary send output. `values` holds the bytes of ``t``/``b`` columns
    and None for ``n``/``u``.
    """

    kinds: bytes
    values: tuple[bytes | None, ...]

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled in bulk when a buffered transaction spills to disk; the dataclass default
        # (field-by-field state) costs several times more.
        return (TupleData, (self.kinds, self.values))

    def __len__(self) -> int:
        return len(self.kinds)

    def kind(self, index: int) -> str:
        return chr(self.kinds[index])

    def is_null(self, index: int) -> bool:
        return self.kinds[index] == 0x6E  # 'n'

    def is_unchanged_toast(self, index: int) -> bool:
        return self.kinds[index] == 0x75  # 'u'

    @property
    def unchanged_toast_columns(self) -> tuple[int, ...]:
        """Indexes of columns whose TOASTed value did not change and was not sent."""
        return tuple(i for i, k in enumerate(self.kinds) if k == 0x75)

    def text(self, index: int) -> str | None:
        """A column's value decoded as UTF-8 text (the session's pinned client_encoding)."""
        value = self.values[index]
        return None if value is None else value.decode()


@dataclass(frozen=True, slots=True)
class Column:
    """A column of a Relation message. Bit 0 of `flags` marks a replica identity key column."""

    flags: int
    name: str
    type_oid: int
    type_modifier: int

    @property
    def is_key(self) -> bool:
        return bool(self.flags & 1)


class PgoutputMessage:
    """Base class of every pgoutput message; `type_code` is the first byte on the wire."""

    __slots__ = ()
    type_code: ClassVar[bytes]


@dataclass(frozen=True, slots=True)
class Begin(PgoutputMessage):
    type_code: ClassVar[bytes] = b"B"
    final_lsn: Lsn
    commit_ts: int
    xid: int

    @property
    def commit_time(self) -> datetime:
        return pg_timestamp_to_datetime(self.commit_ts)


@dataclass(frozen=True, slots=True)
class Commit(PgoutputMessage):
    type_code: ClassVar[bytes] = b"C"
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_ts: int
    flags: int = 0

    @property
    def commit_time(self) -> datetime:
        return pg_timestamp_to_datetime(self.commit_ts)


@dataclass(frozen=True, slots=True)
class Origin(PgoutputMessage):
    type_code: ClassVar[bytes] = b"O"
    origin_lsn: Lsn
    origin_name: str


@dataclass(frozen=True, slots=True)
class Relation(PgoutputMessage):
    """Describes a relation before its first change (and again after invalidations).

    `namespace` is as sent: the empty string stands for ``pg_catalog``; `schema` resolves it.
    `replica_identity` is ``pg_class.relreplident``: d(efault), n(othing), f(ull) or i(ndex).
    """

    type_code: ClassVar[bytes] = b"R"
    relid: int
    namespace: str
    relname: str
    replica_identity: str
    columns: tuple[Column, ...]
    xid: int | None = None

    @property
    def schema(self) -> str:
        return self.namespace or "pg_catalog"

    @property
    def key_columns(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.is_key)


@dataclass(frozen=True, slots=True)
class Type(PgoutputMessage):
    """Names a non-built-in type used by a following Relation (a domain's base type name)."""

    type_code: ClassVar[bytes] = b"Y"
    type_oid: int
    namespace: str
    name: str
    xid: int | None = None

    @property
    def schema(self) -> str:
        return self.namespace or "pg_catalog"


@dataclass(frozen=True, slots=True)
class Insert(PgoutputMessage):
    type_code: ClassVar[bytes] = b"I"
    relid: int
    new: TupleData
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Update(PgoutputMessage):
    """`old_kind` is ``K`` (old key: non-key columns are NULL fillers), ``O`` (the whole old row,
    replica identity full) or None (no old tuple was logged)."""

    type_code: ClassVar[bytes] = b"U"
    relid: int
    old_kind: OldTupleKind | None
    old: TupleData | None
    new: TupleData
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Delete(PgoutputMessage):
    type_code: ClassVar[bytes] = b"D"
    relid: int
    old_kind: OldTupleKind
    old: TupleData
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class UndecodedChange(PgoutputMessage):
    """An Insert, Update or Delete whose TupleData was left undecoded, for a consumer that
    stores changes and decodes them later in bulk (`Decoder(undecoded_rows=True)`;
    `pgcdc.protocol.columns`). `message` is the message's bytes without a stream block's xid
    prefix; `code` its first byte (``I``, ``U`` or ``D``). Only its relation is checked."""

    type_code: ClassVar[bytes] = b"I"  # (or U, D: see `code`)
    code: int
    relid: int
    message: bytes
    xid: int | None = None


TRUNCATE_CASCADE = 1
TRUNCATE_RESTART_IDENTITY = 2


@dataclass(frozen=True, slots=True)
class Truncate(PgoutputMessage):
    type_code: ClassVar[bytes] = b"T"
    options: int
    relids: tuple[int, ...]
    xid: int | None = None

    @property
    def cascade(self) -> bool:
        return bool(self.options & TRUNCATE_CASCADE)

    @property
    def restart_identity(self) -> bool:
        return bool(self.options & TRUNCATE_RESTART_IDENTITY)


@dataclass(frozen=True, slots=True)
class Message(PgoutputMessage):
    """A logical decoding message (``pg_logical_emit_message``); bit 0 of `flags` marks it
    transactional. `content` is raw bytes, never converted."""

    type_code: ClassVar[bytes] = b"M"
    flags: int
    lsn: Lsn
    prefix: str
    content: bytes
    xid: int | None = None

    @property
    def transactional(self) -> bool:
        return bool(self.flags & 1)


@dataclass(frozen=True, slots=True)
class StreamStart(PgoutputMessage):
    type_code: ClassVar[bytes] = b"S"
    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop(PgoutputMessage):
    type_code: ClassVar[bytes] = b"E"


@dataclass(frozen=True, slots=True)
class StreamCommit(PgoutputMessage):
    type_code: ClassVar[bytes] = b"c"
    xid: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_ts: int
    flags: int = 0

    @property
    def commit_time(self) -> datetime:
        return pg_timestamp_to_datetime(self.commit_ts)


@dataclass(frozen=True, slots=True)
class StreamAbort(PgoutputMessage):
    """Aborts a streamed transaction (`subxid == xid`) or one of its subtransactions.

    `abort_lsn` and `abort_ts` are sent only when the session asked for ``streaming 'parallel'``.
    """

    type_code: ClassVar[bytes] = b"A"
    xid: int
    subxid: int
    abort_lsn: Lsn | None = None
    abort_ts: int | None = None

    @property
    def is_toplevel(self) -> bool:
        return self.xid == self.subxid


@dataclass(frozen=True, slots=True)
class BeginPrepare(PgoutputMessage):
    type_code: ClassVar[bytes] = b"b"
    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_ts: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class Prepare(PgoutputMessage):
    type_code: ClassVar[bytes] = b"P"
    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_ts: int
    xid: int
    gid: str
    flags: int = 0


@dataclass(frozen=True, slots=True)
class CommitPrepared(PgoutputMessage):
    type_code: ClassVar[bytes] = b"K"
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_ts: int
    xid: int
    gid: str
    flags: int = 0


@dataclass(frozen=True, slots=True)
class RollbackPrepared(PgoutputMessage):
    type_code: ClassVar[bytes] = b"r"
    prepare_end_lsn: Lsn
    rollback_end_lsn: Lsn
    prepare_ts: int
    rollback_ts: int
    xid: int
    gid: str
    flags: int = 0


@dataclass(frozen=True, slots=True)
class StreamPrepare(PgoutputMessage):
    type_code: ClassVar[bytes] = b"p"
    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_ts: int
    xid: int
    gid: str
    flags: int = 0


def fast_constructor(cls: type) -> Any:
    """A positional constructor for a frozen slots dataclass, for the decoder's hot path.

    A frozen dataclass's ``__init__`` assigns through ``object.__setattr__`` field by field,
    which costs about as much as decoding a column; setting the slots directly is about twice
    as cheap and gives an identical, equally immutable object. (Generated like dataclasses
    generates ``__init__``.)
    """
    names = [f.name for f in fields(cls)]
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    body = []
    for i, name in enumerate(names):
        namespace[f"_set{i}"] = getattr(cls, name).__set__
        body.append(f"    _set{i}(obj, {name})\n")
    source = f"def make({', '.join(names)}):\n    obj = _new(_cls)\n{''.join(body)}    return obj\n"
    exec(source, namespace)
    return namespace["make"]
