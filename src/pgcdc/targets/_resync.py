"""A target made equal to a copy of its table, only what differs written (after the slot was
lost, or rows moved with no change the stream carries): the differences come from
`pgcdc.targets.reconcile`, the MERGEs are the `Writer`'s."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable

from pgcdc.envelope import ColumnInfo, Shape
from pgcdc.targets._arrow import (
    ACTION,
    RECONCILED,
    conform,
    data_schema,
    q,
    seq,
    sequences,
    with_action,
    with_column,
)
from pgcdc.targets._merge import Writer
from pgcdc.targets.base import END_AT, SEQUENCE_TYPE, START_AT
from pgcdc.targets.reconcile import diff_by_key, diff_multiset, hashable

__all__ = ["Reconciler"]


class Reconciler(Writer):
    """Writes the differences between a table and a copy of its source (see the module)."""

    def reconcile_keyed(
        self,
        table: DeltaTable,
        data: pa.Table,
        rows: pa.Table,
        keys: Sequence[str],
        schema: pa.Schema,
        point: int,
        commit: CommitProperties,
        keep_missing: bool = False,
    ) -> bool:
        diff = diff_by_key(data, rows, keys)
        if keep_missing:
            diff = replace(diff, deletes=diff.deletes.slice(0, 0))
        if diff.empty:
            return False
        match = " AND ".join(f"t.{q(k)} = s.{q(k)}" for k in keys)
        if self.mode == "mirror":
            source = pa.concat_tables(
                [
                    with_action(conform(diff.inserts, data_schema(schema)), "upsert"),
                    with_action(conform(diff.updates, data_schema(schema)), "upsert"),
                    with_action(conform(diff.deletes, data_schema(schema)), "delete"),
                ]
            )
            shape = Shape("", "", 0, "d", tuple(ColumnInfo(k, 0, -1, True) for k in keys))
            return self.merge_mirror(table, shape, source, data_schema(schema), commit)
        ended = pa.concat_tables([diff.updates.select(list(keys)), diff.deletes])
        opened = pa.concat_tables([diff.updates, diff.inserts])
        closes = conform(ended, data_schema(schema))
        closes = closes.append_column(START_AT, pa.nulls(len(closes), SEQUENCE_TYPE))
        # ended at (point, RECONCILED), before the new versions start: no overlap
        closes = closes.append_column(
            END_AT, pa.repeat(pa.scalar(seq((point, RECONCILED)), SEQUENCE_TYPE), len(closes))
        )
        opens = conform(opened, data_schema(schema))
        opens = opens.append_column(START_AT, sequences(point, RECONCILED + 1, len(opens)))
        opens = opens.append_column(END_AT, pa.nulls(len(opens), SEQUENCE_TYPE))
        source = pa.concat_tables([with_action(closes, "close"), with_action(opens, "insert")])
        return self.merge_versions(table, source, match, schema, commit)

    def reconcile_multiset(
        self,
        table: DeltaTable,
        data: pa.Table,
        rows: pa.Table,
        schema: pa.Schema,
        point: int,
        commit: CommitProperties,
    ) -> bool:
        diff = diff_multiset(data, rows)
        if diff.empty:
            return False
        names = rows.column_names
        held = set(self.io.schema(table).names)  # (a column new to the target: not compared)
        match = " AND ".join(
            f"(t.{q(n)} IS NOT DISTINCT FROM s.{q(n)})" for n in names if n in held
        )
        if self.mode == "mirror":
            # a row with copies too many: every copy goes, and as many as the source has
            # come back (MERGE cannot delete some of several identical rows); the rest stay
            whole = data.select(names)
            rows_of = [hashable(tuple(r.values())) for r in whole.to_pylist()]
            counts = Counter(rows_of)
            back = [i for i, gone in diff.surplus.items() for _ in range(counts[rows_of[i]] - gone)]
            surplus = whole.take(pa.array(list(diff.surplus), pa.int64()))
            returning = whole.take(pa.array(back, pa.int64()))
            source = pa.concat_tables(
                [
                    with_action(conform(surplus, schema), "delete"),
                    with_action(conform(returning, schema), "insert"),
                    with_action(conform(diff.additions, schema), "insert"),
                ]
            )
            deleting = f"{match} AND s.{q(ACTION)} = 'delete'"
            self.merge_copies(table, source, deleting, schema, commit)
            return True
        values = data.select(names).to_pylist()
        starts = data.column(START_AT).to_pylist()
        copies: dict[Any, list[int]] = {}
        for i, row in enumerate(values):
            copies.setdefault(hashable(tuple(row.values())), []).append(i)
        removed = [copies[hashable(tuple(values[i].values()))] for i in diff.surplus]
        again: list[int] = []
        ends: list[dict[str, int] | None] = []
        for at, count in zip(removed, diff.surplus.values(), strict=True):
            at.sort(key=lambda i: (starts[i]["commit_lsn"], starts[i]["ordinal"]))
            again += at  # every current copy goes, and comes back: the oldest `count` ended
            ends += [seq((point, RECONCILED))] * count + [None] * (len(at) - count)
        kept = conform(data.take(pa.array(again, pa.int64())), schema)
        kept = with_column(kept, END_AT, pa.array(ends, SEQUENCE_TYPE))
        matches = data.select(names).take(pa.array(list(diff.surplus), pa.int64()))
        matches = conform(matches, schema)
        added = conform(diff.additions, data_schema(schema))
        added = added.append_column(START_AT, sequences(point, RECONCILED + 1, len(added)))
        added = added.append_column(END_AT, pa.nulls(len(added), SEQUENCE_TYPE))
        source = pa.concat_tables(
            [
                with_action(matches, "close"),
                with_action(kept, "insert"),
                with_action(conform(added, schema), "insert"),
            ]
        )
        return self.merge_versions(table, source, match, schema, commit, replace=True)

    def merge_versions(
        self,
        table: DeltaTable,
        source: pa.Table,
        match: str,
        schema: pa.Schema,
        commit: CommitProperties,
        *,
        replace: bool = False,
    ) -> bool:
        """One MERGE into a history: "close" rows end (or, `replace`, delete: the copies are
        inserted again) the current versions they match; "insert" rows are added."""
        action = f"s.{q(ACTION)}"
        predicate = f"{match} AND t.{q(END_AT)} IS NULL AND {action} = 'close'"
        merger = table.merge(
            source,
            predicate,
            source_alias="s",
            target_alias="t",
            merge_schema=self.io.adds_columns(table, schema),
            commit_properties=commit,
        )
        if replace:
            merger = merger.when_matched_delete()
        else:
            merger = merger.when_matched_update({q(END_AT): f"s.{q(END_AT)}"})
        merger.when_not_matched_insert(
            {q(n): f"s.{q(n)}" for n in schema.names}, predicate=f"{action} = 'insert'"
        ).execute()
        return True

    def merge_copies(
        self,
        table: DeltaTable,
        source: pa.Table,
        match: str,
        schema: pa.Schema,
        commit: CommitProperties | None,
    ) -> None:
        """One MERGE of whole-row copies: "delete" rows remove every copy they match,
        "insert" rows are added."""
        (
            table.merge(
                source,
                match,
                source_alias="s",
                target_alias="t",
                merge_schema=self.io.adds_columns(table, schema),
                commit_properties=commit,
            )
            .when_matched_delete()
            .when_not_matched_insert(
                {q(n): f"s.{q(n)}" for n in schema.names},
                predicate=f"s.{q(ACTION)} = 'insert'",
            )
            .execute()
        )
