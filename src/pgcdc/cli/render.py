"""One line per pgoutput message: readable text or JSON, for `pgcdc tail` and `pgcdc decode`."""

from __future__ import annotations

import json
from dataclasses import fields, is_dataclass
from datetime import datetime
from typing import Any

from pgcdc.protocol import (
    Delete,
    Insert,
    Lsn,
    Message,
    PgoutputMessage,
    Relation,
    Truncate,
    TupleData,
    Update,
)
from pgcdc.types.temporal import timestamptz_from_microseconds

__all__ = ["message_json", "message_text", "tuple_dict"]

_TIMESTAMPS = {"commit_ts", "prepare_ts", "rollback_ts", "abort_ts"}


def _value(kind: int, value: bytes | None) -> Any:
    if kind == 0x74:  # 't'
        assert value is not None
        return value.decode(errors="replace")
    if kind == 0x62:  # 'b'
        assert value is not None
        return {"binary": value.hex()}
    if kind == 0x75:  # 'u'
        return {"unchanged_toast": True}
    return None


def tuple_dict(data: TupleData, relation: Relation | None) -> dict[str, Any]:
    """Column name -> value (text as str, binary as hex, unchanged TOAST marked)."""
    names = (
        [c.name for c in relation.columns]
        if relation is not None and len(relation.columns) == len(data)
        else [str(i) for i in range(len(data))]
    )
    return {
        name: _value(kind, value)
        for name, kind, value in zip(names, data.kinds, data.values, strict=True)
    }


def _timestamp(micros: int) -> str:
    """A wire timestamp in ISO 8601; one outside `datetime`'s years 1-9999 (any int64 is
    valid on the wire) as the server prints it, e.g. ``infinity``."""
    value = timestamptz_from_microseconds(micros)
    return value.isoformat() if isinstance(value, datetime) else str(value)


def _field(name: str, value: Any, relation: Relation | None) -> Any:
    if isinstance(value, TupleData):
        return tuple_dict(value, relation)
    if isinstance(value, Lsn):
        return str(value)
    if name in _TIMESTAMPS and isinstance(value, int):
        return _timestamp(value)
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return {"hex": value.hex()}
    if isinstance(value, tuple):  # Relation.columns, Truncate.relids
        return [_obj(v) if is_dataclass(v) else v for v in value]
    return value


def _obj(value: Any) -> dict[str, Any]:
    return {f.name: getattr(value, f.name) for f in fields(value)}


def message_json(
    message: PgoutputMessage, lsn: Lsn | int, relations: dict[int, Relation]
) -> dict[str, Any]:
    relation = relations.get(getattr(message, "relid", -1))
    out: dict[str, Any] = {"lsn": str(Lsn(lsn)), "type": type(message).__name__}
    for f in fields(message):  # type: ignore[arg-type]
        value = getattr(message, f.name)
        if value is None and f.name == "xid":
            continue
        out[f.name] = _field(f.name, value, relation)
    if relation is not None:
        out["table"] = f"{relation.schema}.{relation.relname}"
    if isinstance(message, Truncate):
        out["tables"] = [
            f"{r.schema}.{r.relname}" if (r := relations.get(i)) else str(i) for i in message.relids
        ]
    return out


def _tuple_text(data: TupleData, relation: Relation | None) -> str:
    parts = []
    for name, value in tuple_dict(data, relation).items():
        if isinstance(value, dict):
            shown = "unchanged-toast" if "unchanged_toast" in value else "\\x" + value["binary"]
        elif value is None:
            shown = "null"
        else:
            shown = "'" + value.replace("'", "''") + "'"
        parts.append(f"{name}={shown}")
    return " ".join(parts)


def message_text(message: PgoutputMessage, lsn: Lsn | int, relations: dict[int, Relation]) -> str:
    head = f"{Lsn(lsn)!s:>17} {type(message).__name__}"
    xid = getattr(message, "xid", None)
    if xid is not None and isinstance(message, Insert | Update | Delete | Truncate | Message):
        head += f" (xid {xid})"
    relation = relations.get(getattr(message, "relid", -1))
    table = f"{relation.schema}.{relation.relname}" if relation else None
    if isinstance(message, Insert):
        return f"{head} {table}: {_tuple_text(message.new, relation)}"
    if isinstance(message, Update):
        old = (
            f" old[{message.old_kind}]: {_tuple_text(message.old, relation)}" if message.old else ""
        )
        return f"{head} {table}:{old} new: {_tuple_text(message.new, relation)}"
    if isinstance(message, Delete):
        return f"{head} {table} old[{message.old_kind}]: {_tuple_text(message.old, relation)}"
    if isinstance(message, Relation):
        cols = ", ".join(f"{c.name} {c.type_oid}{'*' if c.is_key else ''}" for c in message.columns)
        return (
            f"{head} {message.relid} {message.schema}.{message.relname} "
            f"identity={message.replica_identity} ({cols})"
        )
    data = message_json(message, lsn, relations)
    for key in ("lsn", "type", "table"):
        data.pop(key, None)
    rest = " ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in data.items())
    return f"{head} {rest}".rstrip()
