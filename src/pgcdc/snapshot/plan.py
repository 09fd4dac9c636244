"""What an initial copy reads: each table's leaves (itself, or a partitioned table's
partitions) cut into block (ctid) ranges of about the same size.

A plan is made once, stored with the pipeline's state and reused when a copy resumes, so a
chunk means the same block range in every run. The last chunk of each leaf is open-ended: rows
a later run finds past the planned size are still read.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from pgcdc.errors import PgcdcError

__all__ = ["Chunk", "SnapshotError", "plan_chunks"]

#: About 128 MB of heap per chunk (8 kB blocks): fewer, larger Delta commits copy faster.
DEFAULT_CHUNK_BLOCKS = 16384

_LEAVES_SQL = """
WITH given AS (SELECT %s::regclass AS relid),
leaves AS (
    SELECT t.relid FROM given, pg_catalog.pg_partition_tree(given.relid) t WHERE t.isleaf
    UNION ALL  -- a table that is not partitioned has no partition tree
    SELECT relid FROM given
    WHERE NOT EXISTS (SELECT 1 FROM given g, pg_catalog.pg_partition_tree(g.relid))
)
SELECT n.nspname, c.relname, c.relkind::text,
       (pg_catalog.pg_relation_size(c.oid) / current_setting('block_size')::int)::int8,
       greatest(c.reltuples, 0)::int8
FROM leaves JOIN pg_catalog.pg_class c ON c.oid = leaves.relid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'm')
ORDER BY n.nspname, c.relname
"""


class SnapshotError(PgcdcError):
    """An initial copy cannot start or go on (the message names the table and the cause)."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """Blocks [first_block, end_block) of one leaf of `table` (end None: to the end)."""

    id: str
    table: str
    leaf: str
    first_block: int
    end_block: int | None
    estimated_rows: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Chunk:
        return cls(**data)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def qualified(table: str) -> str:
    schema, _, name = table.rpartition(".")
    return f"{_quote(schema or 'public')}.{_quote(name)}"


def plan_chunks(
    conn: Any, table: str, chunk_blocks: int = DEFAULT_CHUNK_BLOCKS, label: str | None = None
) -> list[Chunk]:
    """The chunks of `table` ("schema.name"), read through `conn` (a psycopg connection),
    filed under `label` (the pipeline's name for the table, if it was renamed since)."""
    try:
        leaves = conn.execute(_LEAVES_SQL, (qualified(table),)).fetchall()
    except Exception as exc:
        raise SnapshotError(f"cannot plan the copy of {table}: {exc}".strip()) from None
    chunks: list[Chunk] = []
    for schema, name, _, pages, tuples in leaves:
        leaf = f"{schema}.{name}"
        starts = list(range(0, max(int(pages), 1), chunk_blocks))
        per_block = tuples / pages if pages else 0
        for i, first in enumerate(starts):
            end = starts[i + 1] if i + 1 < len(starts) else None
            blocks = (end if end is not None else max(int(pages), first + 1)) - first
            chunks.append(
                Chunk(f"{leaf}:{first}", label or table, leaf, first, end, int(blocks * per_block))
            )
    return chunks


def dump_plan(chunks: list[Chunk]) -> str:
    return json.dumps([c.to_json() for c in chunks])


def load_plan(text: str) -> list[Chunk]:
    return [Chunk.from_json(c) for c in json.loads(text)]
