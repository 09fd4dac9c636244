"""The change envelope's Arrow schema: one row per committed change.

Columns (every one nullable):

* ``commit_lsn`` int64, ``ordinal`` int64 and ``sequence`` struct<commit_lsn, ordinal>: the
  commit record's LSN and the change's position (1, 2, ...) within its transaction. The pair
  is unique and totally ordered, so ``sequence`` is an AUTO CDC ``sequence_by`` column. Never
  order by ``lsn``, the change's own position: a transaction that began earlier and committed
  later has lower change LSNs.
* ``xid`` int64, ``commit_ts`` timestamp[us, UTC], ``origin`` string.
* ``op``: ``insert``, ``update``, ``delete``, ``truncate``, ``message``, or ``read``: a row of
  the initial copy (in a change log, as a Debezium snapshot's ``r``), at the copy's consistent
  point with a negative ordinal (before every change the stream brings after it).
* ``schema``, ``table``, ``relation_oid``, ``replica_identity`` (``d``/``n``/``f``/``i``) and
  ``columns`` (list of struct<name, type_oid, type_modifier, key, attnum>): the relation as the
  Relation message described it when the change was made, all typing needs, and each
  column's identity (``attnum``: a Relation message names columns, and a name can move to
  another column; 0 when not known).
* ``key``, ``before``, ``after``: maps of the server's text output (null for SQL NULL); see
  `pgcdc.envelope.images` for what each holds.
* ``unchanged_toast`` list<string>: columns absent from ``after`` because their TOASTed value
  did not change; a consumer keeps its current value.
* ``lsn`` int64: the change's own WAL position.
* ``truncate_cascade``, ``truncate_restart_identity``: the flags of a TRUNCATE (one row per
  table it emptied).
* ``message_prefix``, ``message_content``, ``message_transactional``: a logical decoding
  message (``pg_logical_emit_message``). A non-transactional message is its own unit: its
  ``commit_lsn`` is the message's LSN and its ordinal 1.

The layout is exactly the Arrow form of the Spark schema `pgcdc.spark.envelope.ENVELOPE_SCHEMA`
(derived from this one), so batches built here go to Spark unchanged.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = [
    "COLUMN_TYPE",
    "ENVELOPE_ARROW_SCHEMA",
    "SEQUENCE_TYPE",
    "TEXT_MAP",
    "envelope_field",
]

#: One column of the relation: what typing a value needs, and what the column is (its
#: ``attnum`` in the table, or the partitioned table's for a partition's; 0 when unknown).
COLUMN_TYPE = pa.struct(
    [
        ("name", pa.string()),
        ("type_oid", pa.int64()),
        ("type_modifier", pa.int32()),
        ("key", pa.bool_()),
        ("attnum", pa.int32()),
    ]
)
#: (commit_lsn, ordinal): the total order of changes.
SEQUENCE_TYPE = pa.struct([("commit_lsn", pa.int64()), ("ordinal", pa.int64())])
#: Column name to the server's text output.
TEXT_MAP = pa.map_(pa.string(), pa.string())

ENVELOPE_ARROW_SCHEMA = pa.schema(
    [
        ("commit_lsn", pa.int64()),
        ("ordinal", pa.int64()),
        ("sequence", SEQUENCE_TYPE),
        ("xid", pa.int64()),
        ("commit_ts", pa.timestamp("us", tz="UTC")),
        ("origin", pa.string()),
        ("op", pa.string()),
        ("schema", pa.string()),
        ("table", pa.string()),
        ("relation_oid", pa.int64()),
        ("replica_identity", pa.string()),
        ("columns", pa.list_(pa.field("element", COLUMN_TYPE))),
        ("key", TEXT_MAP),
        ("before", TEXT_MAP),
        ("after", TEXT_MAP),
        ("unchanged_toast", pa.list_(pa.field("element", pa.string()))),
        ("lsn", pa.int64()),
        ("truncate_cascade", pa.bool_()),
        ("truncate_restart_identity", pa.bool_()),
        ("message_prefix", pa.string()),
        ("message_content", pa.binary()),
        ("message_transactional", pa.bool_()),
    ]
)


def envelope_field(name: str) -> pa.Field:
    return ENVELOPE_ARROW_SCHEMA.field(name)
