"""How a batch is written into a Delta table: one MERGE per run of changes (or an append, an
overwrite), and the rewrites a schema change needs. No CDC semantics here: the plans come folded
(`pgcdc.targets.fold`), typed (`pgcdc.targets._typing`).

* a mirror: "upsert" rows update or insert by key, "delete" rows delete; after a truncation
  the table is overwritten with what follows it;
* a history: "close" rows end the current version of their key (one that started before),
  "insert" rows add versions not already there; after a truncation, the versions no row
  matched end at it;
* a table under REPLICA IDENTITY FULL (a multiset): the keys that lose copies are read, every
  current copy of them deleted and what remains inserted again (MERGE cannot delete some of
  several identical rows);
* a table without identity: appended.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, write_deltalake

from pgcdc.envelope import Shape
from pgcdc.errors import TargetError
from pgcdc.targets._arrow import (
    ACTION,
    MAX_IN_LIST,
    before_sql,
    cast_or_null,
    conform,
    data_schema,
    literals,
    log,
    pick,
    q,
    same_schema,
    seq,
    seq_sql,
    with_column,
)
from pgcdc.targets._merge_on_read import MergeOnRead
from pgcdc.targets._meta import COLUMNS, recorded, recorded_columns
from pgcdc.targets._table import TableIO
from pgcdc.targets._typing import BatchTyping
from pgcdc.targets.added_columns import ColumnFill, fill_values
from pgcdc.targets.base import END_AT, SEQUENCE_TYPE, START_AT, Mode
from pgcdc.targets.fold import (
    HistoryPlan,
    Image,
    Key,
    MirrorPlan,
    MultisetPlan,
    Seq,
    describe_seq,
)
from pgcdc.targets.naming import Naming, plan_naming
from pgcdc.targets.reconcile import hashable

__all__ = ["Writer", "key_filter"]


def key_filter(key_names: Sequence[str], rows: pa.Table) -> str | None:
    """A condition on the target alone that every row matching one of `rows` by key meets:
    its first key column among the rows' values (``t.k IN (...)``, or between their least
    and greatest when they are many). With literals delta-rs skips the files whose column
    statistics exclude them (a MERGE's own ``t.k = s.k`` prunes nothing). None for a key
    type without literals here, or no rows."""
    if not key_names or rows.num_rows == 0 or key_names[0] not in rows.column_names:
        return None
    name = f"t.{q(key_names[0])}"
    column = rows.column(key_names[0])
    if column.null_count == len(column):
        return f"{name} IS NULL"
    values = pc.unique(column.drop_null() if column.null_count else column)
    if len(values) > MAX_IN_LIST:
        bounds = pc.min_max(values)
        listed = literals(
            pa.chunked_array([[bounds["min"].as_py(), bounds["max"].as_py()]], column.type)
        )
        condition = None if listed is None else f"{name} BETWEEN {listed[0]} AND {listed[1]}"
    else:
        listed = literals(pa.chunked_array([values]))
        condition = None if listed is None else f"{name} IN ({', '.join(listed)})"
    if condition is not None and column.null_count:  # a key of identity FULL may hold NULL
        condition = f"({condition} OR {name} IS NULL)"
    return condition


class Writer:
    """Writes into the table `io` holds, of a target of `mode`."""

    def __init__(self, io: TableIO, mode: Mode) -> None:
        self.io = io
        self.mode = mode
        self.path = io.path
        #: Writes with deletion vectors, where the table has them.
        self.mor = MergeOnRead(io, mode)

    def follow_columns(
        self, table: DeltaTable | None, last: dict[str, Any], shapes: list[Shape]
    ) -> tuple[DeltaTable | None, Naming]:
        """Columns followed by what they are (`pgcdc.targets.naming`): the target's columns
        renamed, and those whose names other columns took removed, in one commit without a
        watermark that records the columns as renamed (done again after a crash, it finds
        nothing to do)."""
        columns = None if table is None else recorded(last)
        existing = [] if table is None else data_schema(self.io.schema(table)).names
        naming = plan_naming(columns, existing, shapes)
        if table is None or not naming.changes_target:
            return table, naming
        data = self.io.query(table, "SELECT * FROM t", self.io.schema(table))
        data = data.drop_columns(list(naming.removed))
        data = data.rename_columns([naming.renames.get(n, n) for n in data.column_names])
        assert naming.recorded is not None
        metadata = {COLUMNS: recorded_columns(naming.recorded)}
        write_deltalake(
            table,
            data,
            mode="overwrite",
            schema_mode="overwrite",
            commit_properties=CommitProperties(custom_metadata=metadata),
        )
        log.info(
            "%s: columns renamed (%s) and removed (%s) as the source's",
            self.path,
            ", ".join(f"{a} to {b}" for a, b in naming.renames.items()) or "none",
            ", ".join(sorted(naming.removed)) or "none",
        )
        return table, naming

    def rewrite(
        self,
        table: DeltaTable,
        schema: pa.Schema,
        fills: dict[str, tuple[ColumnFill, Shape]],
        typing: BatchTyping,
    ) -> None:
        """The whole table again, in one commit without a watermark: with wider column types,
        and each added or retyped column holding its fill (a history: in its current
        versions; a retyped column's ended versions keep their values cast to the new type,
        or null where they cannot be). Done again after a crash, it writes the same."""
        data = self.io.query(table, "SELECT * FROM t", self.io.schema(table))
        ended: dict[str, pa.Array] = {}
        for column in set(typing.retyped) & set(data.column_names):
            old = data.column(column)
            if self.mode == "history":
                ended[column] = cast_or_null(old, schema.field(column).type, self.path, column)
            data = data.drop_columns([column])
        data = conform(data, schema)
        for column, (fill, shape) in fills.items():
            keys = data.select(list(shape.key_names)) if fill.rows is not None else data.select([])
            latest = typing.builder(typing.latest) if typing.latest is not None else None
            values = fill_values(typing.builder(shape), column, fill, keys, latest)
            if self.mode == "history":
                current = pc.is_null(data.column(END_AT))
                before = ended.get(column, pa.nulls(len(values), values.type))
                values = pc.if_else(current, values, before)
            data = with_column(data, column, values)
        write_deltalake(table, data, mode="overwrite", schema_mode="overwrite")

    def retype(self, table: DeltaTable, schema: pa.Schema, changed: set[str]) -> None:
        """The whole table again, in one commit without a watermark, with the `changed`
        columns in `schema`'s types: cast (widened, a composite reshaped), or null where a
        value cannot be (a column retyped: its values in a history's ended versions).
        Done again after a crash, it writes the same."""
        data = self.io.query(table, "SELECT * FROM t", self.io.schema(table))
        kept = data.drop_columns(sorted(changed))
        retyped = conform(kept, pa.schema([f for f in schema if f.name in data.column_names]))
        for column in changed:
            to = schema.field(column).type
            retyped = with_column(
                retyped, column, cast_or_null(data.column(column), to, self.path, column)
            )
        write_deltalake(table, retyped, mode="overwrite", schema_mode="overwrite")

    def check_new_key(self, table: DeltaTable, shape: Shape, seq: Seq) -> None:
        """Rows are matched by `shape`'s key from `seq` on, a key other than before (a new
        primary key or replica identity index). The source has a value in each of its
        columns in every row; a row of the target without one (a column added with values
        read per key, missing for a row deleted or re-keyed since) would never be matched
        again: stop rather than keep it, or insert its next version beside it."""
        if shape.full_identity or not shape.key_names or self.mode == "changelog":
            return
        if not set(self.io.schema(table).names).issuperset(shape.key_names):
            return  # a key column new to the table: added by this batch, with its values
        nulls = " OR ".join(f"{q(k)} IS NULL" for k in shape.key_names)
        current = f" AND {q(END_AT)} IS NULL" if self.mode == "history" else ""
        counted = self.io.query(
            table,
            f"SELECT count(*) AS n FROM t WHERE ({nulls}){current}",
            pa.schema([("n", pa.int64())]),
        )
        missing = counted.column("n")[0].as_py()
        if missing:
            raise TargetError(
                f"{shape.name}: rows are matched by ({', '.join(shape.key_names)}) from "
                f"{describe_seq(seq)} on, and {missing} row(s) of the target hold no value "
                "in it (values read per key from the source, for rows changed or deleted "
                "since): their later changes could not find them; recopy the table"
            )

    def key_match(self, shape: Shape | None) -> list[str]:
        if shape is None or not shape.key_names:
            return ["FALSE"]  # no identity: rows are only ever inserted
        if shape.full_identity:
            return [f"(t.{q(k)} IS NOT DISTINCT FROM s.{q(k)})" for k in shape.key_names]
        return [f"t.{q(k)} = s.{q(k)}" for k in shape.key_names]

    def write_mirror(
        self,
        typing: BatchTyping,
        table: DeltaTable,
        plan: MirrorPlan,
        data: pa.Table,
        schema: pa.Schema,
        commit: CommitProperties | None,
    ) -> bool:
        """One commit: an overwrite after a truncation, else a MERGE. Whether it wrote."""
        images = list(plan.upserts.values())
        data = self.fill_unchanged(typing, table, data, images, 0, plan.lookups, schema)
        current = self.io.schema(table)
        if plan.truncated:
            write_deltalake(
                table,
                conform(data, schema),
                mode="overwrite",
                schema_mode=None if same_schema(current, schema) else "overwrite",
                commit_properties=commit,
            )
            return True
        if data.num_rows == 0:
            return False
        shape = (images or list(plan.deletes.values()))[0].shape
        if plan.inserts_only and shape.key_names and not self.holds_any(table, shape, data):
            upserts = data.filter(pc.equal(data.column(ACTION), "upsert")).drop_columns([ACTION])
            return upserts.num_rows > 0 and self.append_rows(table, upserts, schema, commit)
        return self.merge_mirror(table, shape, data, schema, commit)

    def holds_any(self, table: DeltaTable, shape: Shape, rows: pa.Table) -> bool:
        """Whether the target may hold a row (a history: a current version) of one of the
        keys of `rows`: counted over the files the keys' literals do not exclude (none, for
        keys past the table's), by the first key column (a composite key may count rows of
        other keys: then the batch is merged, as any other)."""
        if not shape.key_names:  # no identity: every row is a row of its own
            return False
        narrow = key_filter(shape.key_names, rows)
        if narrow is None:
            return True
        if self.mode == "history":
            narrow += f" AND t.{q(END_AT)} IS NULL"
        counted = self.io.query(
            table, f"SELECT count(*) AS n FROM t WHERE {narrow}", pa.schema([("n", pa.int64())])
        )
        return bool(counted.column("n")[0].as_py())

    def merge_mirror(
        self,
        table: DeltaTable,
        shape: Shape,
        data: pa.Table,
        schema: pa.Schema,
        commit: CommitProperties | None,
    ) -> bool:
        """`data` (with its action column) merged by key. Whether it wrote."""
        if not shape.key_names:
            return self.append_rows(table, data, schema, commit)
        if self.mor.usable(table, schema):
            self.mor.mirror(table, shape, data, schema, commit)
            return True
        match = self.key_match(shape)
        narrow = key_filter(shape.key_names, data)
        if narrow is not None:
            match.append(narrow)
        before = table.version()
        columns = {q(n): f"s.{q(n)}" for n in schema.names}
        (
            table.merge(
                data,
                " AND ".join(match),
                source_alias="s",
                target_alias="t",
                merge_schema=self.io.adds_columns(table, schema),
                commit_properties=commit,
            )
            .when_matched_update(columns, predicate=f"s.{q(ACTION)} = 'upsert'")
            .when_matched_delete(predicate=f"s.{q(ACTION)} = 'delete'")
            .when_not_matched_insert(columns, predicate=f"s.{q(ACTION)} = 'upsert'")
            .execute()
        )
        return table.version() != before

    def write_history(
        self,
        typing: BatchTyping,
        table: DeltaTable,
        plan: HistoryPlan,
        data: pa.Table,
        schema: pa.Schema,
        commit: CommitProperties | None,
    ) -> bool:
        """One MERGE: "close" rows end the current version of their key (one that started
        before), "insert" rows add versions not already there; after a truncation, the
        versions no row matched end at it."""
        images = [v.image for v in plan.versions]
        data = self.fill_unchanged(
            typing, table, data, images, len(plan.closes), plan.lookups, schema
        )
        if data.num_rows == 0 and plan.truncated_at is None:
            return False
        shapes = [image.shape for _, image in plan.closes.values()] + [i.shape for i in images]
        shape = shapes[0] if shapes else None
        if shape is not None and not shape.key_names and plan.truncated_at is None:
            return self.append_rows(table, data, schema, commit)
        return self.merge_history(
            table, shape, data, schema, commit, plan.truncated_at, plan.inserts_only
        )

    def merge_history(
        self,
        table: DeltaTable,
        shape: Shape | None,
        data: pa.Table,
        schema: pa.Schema,
        commit: CommitProperties | None,
        truncated_at: Seq | None = None,
        inserts_only: bool = False,
    ) -> bool:
        """`data` ("close" rows: a key and the sequence its current version ends at;
        "insert" rows: versions) merged by key; or appended, when every key was inserted
        first (`HistoryPlan.inserts_only`) and the target has no current version of any.
        Whether it wrote."""
        if shape is not None and inserts_only and not self.holds_any(table, shape, data):
            versions = data.filter(pc.equal(data.column(ACTION), "insert")).drop_columns([ACTION])
            return versions.num_rows > 0 and self.append_rows(table, versions, schema, commit)
        if (
            shape is not None
            and shape.key_names
            and truncated_at is None
            and self.mor.usable(table, schema)
        ):
            self.mor.history(table, shape, data, schema, commit)
            return True
        match = self.key_match(shape)
        action = f"s.{q(ACTION)}"
        start, end = f"t.{q(START_AT)}", f"t.{q(END_AT)}"
        closing = f"{action} = 'close' AND {end} IS NULL AND {before_sql(start, f's.{q(END_AT)}')}"
        same_start = (
            f"{start}['commit_lsn'] = s.{q(START_AT)}['commit_lsn'] AND "
            f"{start}['ordinal'] = s.{q(START_AT)}['ordinal']"
        )
        inserting = f"{action} = 'insert' AND {same_start}"
        if match == ["FALSE"]:
            predicate = "FALSE"
        else:
            assert shape is not None
            narrow = key_filter(shape.key_names, data)
            match += [] if narrow is None else [narrow]
            predicate = " AND ".join([*match, f"(({closing}) OR ({inserting}))"])
        before = table.version()
        merger = (
            table.merge(
                data,
                predicate,
                source_alias="s",
                target_alias="t",
                merge_schema=self.io.adds_columns(table, schema),
                commit_properties=commit,
            )
            .when_matched_update({q(END_AT): f"s.{q(END_AT)}"}, predicate=f"{action} = 'close'")
            .when_not_matched_insert(
                {q(n): f"s.{q(n)}" for n in schema.names}, predicate=f"{action} = 'insert'"
            )
        )
        if truncated_at is not None:
            at = seq_sql(truncated_at)
            merger = merger.when_not_matched_by_source_update(
                {q(END_AT): at}, predicate=f"{end} IS NULL AND {before_sql(start, at)}"
            )
        merger.execute()
        return table.version() != before

    def write_multiset(
        self,
        table: DeltaTable,
        plan: MultisetPlan,
        data: pa.Table,
        schema: pa.Schema,
        commit: CommitProperties | None,
    ) -> bool:
        """One commit for a REPLICA IDENTITY FULL table, whose rows are a multiset. Keys that
        lose copies of the target's own are read, then replaced: every current copy of the
        key is deleted and what remains inserted again (a mirror: the copies left; a
        history: the current versions, the oldest ones ended at the removals' sequences), as
        MERGE cannot delete some of several identical rows. Added copies are inserted.
        After a truncation, a mirror is overwritten with the copies added since."""
        history = self.mode == "history"
        count = len(plan.versions)
        added, keys = data.slice(0, count), data.slice(count)
        if not history:
            added = added.filter(pc.is_null(added.column(END_AT))).drop_columns([START_AT, END_AT])
            keys = keys.drop_columns([START_AT, END_AT])
        if plan.truncated_at is not None and not history:
            write_deltalake(
                table,
                conform(added, schema),
                mode="overwrite",
                schema_mode=None if same_schema(self.io.schema(table), schema) else "overwrite",
                commit_properties=commit,
            )
            return True
        kept = self.remaining_copies(table, plan, keys, schema)
        if history and plan.truncated_at is not None and kept.num_rows:
            open_ = pc.is_null(kept.column(END_AT))
            ends = pc.if_else(
                open_, pa.scalar(seq(plan.truncated_at), SEQUENCE_TYPE), kept.column(END_AT)
            )
            kept = with_column(kept, END_AT, ends)
        source = pa.concat_tables(
            [
                conform(keys, schema).append_column(ACTION, pa.repeat("delete", keys.num_rows)),
                conform(added, schema).append_column(ACTION, pa.repeat("insert", added.num_rows)),
                conform(kept, schema).append_column(ACTION, pa.repeat("insert", kept.num_rows)),
            ]
        )
        if source.num_rows == 0 and plan.truncated_at is None:
            return False
        shape = next(iter(plan.images.values())).shape if plan.images else None
        conditions = [*self.key_match(shape), f"s.{q(ACTION)} = 'delete'"]
        if shape is not None and (narrow := key_filter(shape.key_names, source)) is not None:
            conditions.append(narrow)
        match = " AND ".join(conditions)
        if history:
            match += f" AND t.{q(END_AT)} IS NULL"
        before = table.version()
        merger = (
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
        )
        if history and plan.truncated_at is not None:
            at = seq_sql(plan.truncated_at)
            end, start = f"t.{q(END_AT)}", f"t.{q(START_AT)}"
            merger = merger.when_not_matched_by_source_update(
                {q(END_AT): at}, predicate=f"{end} IS NULL AND {before_sql(start, at)}"
            )
        merger.execute()
        return table.version() != before

    def remaining_copies(
        self, table: DeltaTable, plan: MultisetPlan, keys: pa.Table, schema: pa.Schema
    ) -> pa.Table:
        """The target's current copies of each key with removals, read, minus the removed
        ones (`copies_left`)."""
        history = self.mode == "history"
        names = list(next(iter(plan.images.values())).shape.key_names) if plan.removals else []
        wanted = [*names, START_AT] if history else names
        if not plan.removals:
            return pick(schema, wanted).empty_table() if history else schema.empty_table()
        columns = [f.name for f in schema if f.name not in (START_AT, END_AT)]
        extra = [START_AT, END_AT] if history else []
        current = self.current(table, names, [*columns, *extra], keys.select(names), schema)
        return copies_left(current, keys.select(names), plan, history)

    def append_rows(
        self,
        table: DeltaTable,
        data: pa.Table,
        schema: pa.Schema,
        commit: CommitProperties | None,
    ) -> bool:
        """Rows of a table without identity: nothing to match, so an append (a MERGE would
        compare every new row with every row of the table)."""
        write_deltalake(
            table,
            conform(data, schema),
            mode="append",
            schema_mode="merge" if self.io.adds_columns(table, schema) else None,
            commit_properties=commit,
        )
        return True

    def fill_unchanged(
        self,
        typing: BatchTyping,
        table: DeltaTable,
        data: pa.Table,
        images: Sequence[Image],
        offset: int,
        lookups: dict[Key, Image],
        schema: pa.Schema,
    ) -> pa.Table:
        """`data` (rows `offset`… are `images`) with each `missing` value taken from the
        target's current row of its key; a key the target lacks leaves null."""
        present = set(self.io.schema(table).names)  # a column added by this batch has no value
        columns = sorted({c for image in images for c in image.missing if c in present})
        if not columns or not lookups:
            return data
        keys = list(lookups)
        key_names = list(lookups[keys[0]].shape.key_names)
        if not present.issuperset(key_names):
            return data
        typed_keys = typing.type_images([lookups[k] for k in keys], pick(schema, key_names))
        typed_rows = typed_keys.select(key_names).to_pylist()
        by_text = {k: hashable(tuple(r.values())) for k, r in zip(keys, typed_rows, strict=True)}
        current = self.current(table, key_names, columns, typed_keys, schema)
        index = _row_index(current, key_names)
        for column in columns:
            positions = np.full(data.num_rows, -1, dtype=np.int64)
            for i, image in enumerate(images):
                key = image.missing.get(column)
                if key is not None:
                    positions[offset + i] = index.get(by_text[key], -1)
            data = _replace_rows(data, column, current, positions)
        return data

    def fill_missing(
        self,
        table: DeltaTable,
        key_names: tuple[str, ...],
        data: pa.Table,
        missing: Mapping[str, np.ndarray],
        schema: pa.Schema,
        offset: int = 0,
    ) -> pa.Table:
        """`data` with the `missing` values of its rows `offset`... (per column, a mask over
        them: a mirror's upserts, a history's versions) taken from the target's current row
        of their key; a key the target lacks keeps null (`BulkMirror.missing`)."""
        present = set(self.io.schema(table).names)  # a column added by this batch has none
        columns = [c for c in missing if c in present]
        if not columns or not present.issuperset(key_names):
            return data
        size = len(next(iter(missing.values())))
        asked = offset + np.flatnonzero(np.logical_or.reduce([missing[c] for c in columns]))
        keys = data.select(list(key_names)).take(pa.array(asked))
        found = np.full(data.num_rows, -1, dtype=np.int64)
        matches = self.mor.current(table, key_names, keys, columns)
        if matches is not None and matches.values is not None:
            current = matches.values
            found[asked[matches.key_row]] = np.arange(len(matches))
        else:
            current = self.current(table, list(key_names), columns, keys, schema)
            index = _row_index(current, list(key_names))
            for at, row in zip(asked, keys.to_pylist(), strict=True):
                found[at] = index.get(hashable(tuple(row.values())), -1)
        for column in columns:
            take = np.zeros(data.num_rows, dtype=bool)
            take[offset : offset + size] = missing[column]
            data = _replace_rows(data, column, current, np.where(take, found, -1))
        return data

    def current(
        self,
        table: DeltaTable,
        key_names: list[str],
        columns: list[str],
        typed_keys: pa.Table,
        schema: pa.Schema,
    ) -> pa.Table:
        """The target's current rows of the keys: key columns and `columns`."""
        wanted = list(dict.fromkeys([*key_names, *columns]))
        conditions = []
        if self.mode == "history":
            conditions.append(f"t.{q(END_AT)} IS NULL")
        narrow = key_filter(key_names, typed_keys)  # narrows; matched exactly later
        if narrow is not None:
            conditions.append(narrow)
        sql = f"SELECT {', '.join('t.' + q(c) for c in wanted)} FROM t"
        if conditions:
            sql += " WHERE " + " AND ".join(conditions)
        return self.io.query(table, sql, pick(schema, wanted))

    # --- writing -----------------------------------------------------------------------


def _row_index(rows: pa.Table, key_names: list[str]) -> dict[Any, int]:
    """The position of each key's row in `rows` (values as `hashable` makes them)."""
    return {
        hashable(tuple(row[n] for n in key_names)): i
        for i, row in enumerate(rows.select(key_names).to_pylist())
    }


def _replace_rows(
    data: pa.Table, column: str, current: pa.Table, positions: np.ndarray
) -> pa.Table:
    """`data` whose `column` takes, in each row with a position (>= 0), the value of the
    `current` row there."""
    if not (positions >= 0).any():
        return data
    at = data.schema.get_field_index(column)
    values = data.column(at).combine_chunks()
    pool = pa.concat_arrays([values, current.column(column).combine_chunks().cast(values.type)])
    chosen = np.where(positions >= 0, data.num_rows + positions, np.arange(data.num_rows))
    return data.set_column(at, column, pool.take(pa.array(chosen)))


def copies_left(current: pa.Table, keys: pa.Table, plan: MultisetPlan, history: bool) -> pa.Table:
    """Of the target's `current` copies of the keys with removals (`keys`, typed, in the
    order of `plan.removals`), the ones left after the removals (a history: all of them,
    the oldest ended at the removals' sequences). Raises when the target holds fewer copies
    than the changes remove."""
    names = keys.column_names
    by_key: dict[Any, list[int]] = {}
    for i, row in enumerate(current.select(names).to_pylist()):
        by_key.setdefault(hashable(tuple(row.values())), []).append(i)
    take: list[int] = []
    ends: list[dict[str, int] | None] = []
    starts = current.column(START_AT).to_pylist() if history else None
    for typed, (key, removals) in zip(keys.to_pylist(), plan.removals.items(), strict=True):
        copies = by_key.get(hashable(tuple(typed.values())), [])
        if len(copies) < len(removals):
            image = plan.images[key]
            raise TargetError(
                f"{image.shape.name}: {len(removals)} change(s) up to "
                f"{describe_seq(removals[-1])} remove a row the target holds "
                f"{len(copies)} time(s): "
                f"({', '.join(f'{k}={v}' for k, v in image.values.items())})"
            )
        if history:
            assert starts is not None
            copies.sort(key=lambda i: (starts[i]["commit_lsn"], starts[i]["ordinal"]))
            take += copies
            ends += [seq(at) for at in removals] + [None] * (len(copies) - len(removals))
        else:
            take += copies[len(removals) :]
    kept = current.take(pa.array(take, pa.int64()))
    if history:
        kept = with_column(kept, END_AT, pa.array(ends, SEQUENCE_TYPE))
    return kept
