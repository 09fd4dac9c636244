"""The folds in Arrow, for the batches that need nothing else.

Most batches of a busy table are plain inserts, updates and deletes of one relation shape,
with no key change and no truncation. For those a mirror's fold is "the last change per key
wins" (`bulk_mirror`), and a history's "each insert or update opens a version that ends at
the key's next change" (`bulk_history`); an unchanged TOAST value is the key's latest in the
batch or, when the batch has none, the target's (`missing`). Done here with Arrow's and
numpy's sorts and group-bys, without a Python object per row; the rows' text columns are then
typed column by column. Any other batch returns None and takes the general fold
(`pgcdc.targets.fold`), which is the reference for what a batch means (the tests compare
both).

The folds read a batch column-wise (`_Rows`): from the spool's column buffers
(`pgcdc.envelope.ShapeRows`, the pipeline's batches), or from the envelope's text maps (any
other caller).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pgcdc.envelope import SEQUENCE_TYPE, ChangeBatch, Shape, ShapeRows
from pgcdc.envelope.images import KIND_UNCHANGED
from pgcdc.protocol.columns import OP_DELETE, OP_INSERT, OP_UPDATE
from pgcdc.targets.fold import _shape, single_shape

__all__ = ["BulkHistory", "BulkMirror", "bulk_history", "bulk_mirror"]

_ROW_OPS = pa.array(["insert", "update", "delete"])  # (in the order of the OP_ codes)
_INDEX = "__pgcdc_index"
_AT = "__pgcdc_at"
#: int2, int4, int8: a key whose text is its number (`_numbers`).
_INTEGER_OIDS = frozenset({21, 23, 20})


@dataclass(frozen=True, slots=True)
class BulkMirror:
    """A folded batch: the rows to upsert (every column as text) and the keys to delete."""

    shape: Shape
    upserts: dict[str, pa.Array]
    upsert_rows: int
    deletes: dict[str, pa.Array]
    delete_rows: int
    #: The LSN of each upsert's change (for an error's message).
    upsert_lsns: pa.Array | None = None
    #: Whether every key's first change in the batch inserted it (`MirrorPlan.inserts_only`).
    inserts_only: bool = False
    #: Per column: the upserts whose value is an unchanged TOAST value the batch does not
    #: hold (the target's current row of the key has it), as a mask over the upserts.
    missing: dict[str, np.ndarray] = field(default_factory=dict)
    #: The LSN of one of the batch's changes (for an error's message).
    first_lsn: int | None = None


def _columns(
    maps: pa.ChunkedArray | pa.Array, names: tuple[str, ...]
) -> dict[str, pa.Array] | None:
    """Each named column's values, when every map holds exactly `names` in that order (how
    `pgcdc.envelope.EnvelopeBuilder` lays out the rows of one relation with no unchanged
    TOAST value): taken by position, far cheaper than a lookup by key per row. None when a
    map differs (or is null)."""
    if len(maps) == 0:
        return {name: pa.array([], pa.string()) for name in names}
    combined = maps.combine_chunks() if isinstance(maps, pa.ChunkedArray) else maps
    if combined.null_count:
        return None
    offsets = combined.offsets.to_numpy()
    if not np.all(np.diff(offsets) == len(names)):
        return None
    first = int(offsets[0])
    count = int(offsets[-1]) - first
    layout = pa.array(names, pa.string()).take(np.tile(np.arange(len(names)), len(combined)))
    if not pc.all(pc.equal(combined.keys.slice(first, count), layout)).as_py():
        return None
    items = combined.items.slice(first, count)
    return {
        name: items.take(pa.array(np.arange(j, count, len(names)))) for j, name in enumerate(names)
    }


def _positions(keys: pa.Array, names: tuple[str, ...]) -> np.ndarray:
    """Each map key's place in `names` (-1: not one of them), in one pass over the keys."""
    found = pc.index_in(keys, value_set=pa.array(names, pa.string()))
    return found.fill_null(-1).to_numpy(zero_copy_only=False, writable=True)


def _sparse_columns(
    maps: pa.ChunkedArray | pa.Array, names: tuple[str, ...]
) -> tuple[dict[str, pa.Array], dict[str, np.ndarray]]:
    """Each named column's values by name, for maps that may lack some (an update's unchanged
    TOAST values; a null map lacks all): null where absent, and per name some map lacks,
    where (a mask over the maps)."""
    combined = maps.combine_chunks() if isinstance(maps, pa.ChunkedArray) else maps
    count = len(combined)
    offsets = combined.offsets.to_numpy()
    first, end = int(offsets[0]), int(offsets[-1])
    parents = np.repeat(np.arange(count), np.diff(offsets))
    valid = combined.is_valid().to_numpy(zero_copy_only=False)
    items = combined.items.slice(first, end - first)
    positions = _positions(combined.keys.slice(first, end - first), names)
    positions[~valid[parents]] = -1  # a null map's entries (none from the builder) are not read
    values: dict[str, pa.Array] = {}
    absent: dict[str, np.ndarray] = {}
    for j, name in enumerate(names):
        entries = np.flatnonzero(positions == j)
        at = np.full(count, -1, dtype=np.int64)  # each map's entry of the name
        at[parents[entries]] = entries
        lacking = at < 0
        values[name] = items.take(pa.array(at, mask=lacking))
        if lacking.any():
            absent[name] = lacking
    return values, absent


@dataclass(frozen=True, slots=True)
class _Rows:
    """A batch of one relation shape's inserts, updates and deletes, with keys and no key
    change (or, for a table without a key, inserts only), column-wise: what the folds read."""

    shape: Shape
    #: Per row: its operation (``OP_*``), commit LSN, ordinal and LSN.
    ops: np.ndarray
    commit_lsn: np.ndarray
    ordinal: np.ndarray
    lsn: pa.Array
    #: Per key column, each row's key (the old tuple's where it has one, else the new).
    keys: dict[str, pa.Array]
    #: Per column some update leaves unchanged (a TOAST value): which rows.
    unchanged: dict[str, np.ndarray]
    #: The named columns' text in the rows `at` (null where the row holds no value; with
    #: `mask`, also where it is set).
    values: Callable[[tuple[str, ...], np.ndarray, np.ndarray | None], dict[str, pa.Array]]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.shape.columns)

    def sequence_order(self) -> np.ndarray:
        """The row numbers in (commit LSN, ordinal) order."""
        return np.lexsort((self.ordinal, self.commit_lsn))


def _rows_of(rows: pa.Table | ChangeBatch) -> _Rows | None:
    """The batch column-wise, when it is one the folds here take."""
    if isinstance(rows, pa.Table):
        return _envelope_rows(rows)
    shapes = rows.shape_rows()
    if shapes is None or len(shapes) != 1 or not len(shapes[0]):
        return None
    return _shape_rows(shapes[0])


def _shape_rows(rows: ShapeRows) -> _Rows | None:
    """From the spool's column buffers: the cells of row i, column j at i * ncols + j."""
    shape, ncols, count = rows.shape, len(rows.shape.columns), len(rows)
    ops = rows.op
    key_at = [j for j, c in enumerate(shape.columns) if c.key]
    unchanged_cells = rows.new_kinds == KIND_UNCHANGED
    keys: dict[str, pa.Array] = {}
    if not key_at:
        if not bool(np.all(ops == OP_INSERT)):
            return None
    else:
        if shape.full_identity or unchanged_cells[:, key_at].any():
            return None
        cells = np.arange(count) * ncols
        has_old = rows.old_kind != 0
        moved = has_old & (ops == OP_UPDATE)
        for j in key_at:
            new, old = rows.new_values.take(cells + j), rows.old_values.take(cells + j)
            if moved.any() and pc.any(pc.not_equal(new.filter(moved), old.filter(moved))).as_py():
                return None  # a key change needs the general fold
            keys[shape.columns[j].name] = pc.if_else(pa.array(has_old), old, new)
    names = tuple(c.name for c in shape.columns)
    unchanged = {
        names[j]: unchanged_cells[:, j] for j in range(ncols) if unchanged_cells[:, j].any()
    }
    values = rows.new_values

    def cells_of(
        wanted: tuple[str, ...], at: np.ndarray, mask: np.ndarray | None = None
    ) -> dict[str, pa.Array]:
        out = {}
        for name in wanted:
            index = at * ncols + names.index(name)
            out[name] = values.take(pa.array(index, mask=mask))
        return out

    return _Rows(
        shape,
        ops,
        rows.commit_lsn,
        rows.ordinal,
        pa.array(rows.lsn, pa.int64()),
        keys,
        unchanged,
        cells_of,
    )


def _envelope_rows(rows: pa.Table) -> _Rows | None:
    """From envelope rows: the maps' values by name."""
    if rows.num_rows == 0:
        return None
    codes = pc.index_in(rows.column("op"), value_set=_ROW_OPS)
    if codes.null_count or not single_shape(rows):
        return None
    ops = codes.to_numpy(zero_copy_only=False).astype(np.uint8)
    shape = _shape(rows, 0)
    keys, names = shape.key_names, tuple(c.name for c in shape.columns)
    toast = rows.column("unchanged_toast")
    has_toast = bool(pc.max(pc.fill_null(pc.list_value_length(toast), 0)).as_py())
    after = rows.column("after").combine_chunks()

    def values(
        wanted: tuple[str, ...], at: np.ndarray, mask: np.ndarray | None = None
    ) -> dict[str, pa.Array]:
        maps = after.take(pa.array(at, mask=mask))
        exact = None if has_toast or mask is not None else _columns(maps, wanted)
        return exact if exact is not None else _sparse_columns(maps, wanted)[0]

    before: dict[str, pa.Array] = {}
    if not keys:
        if not bool(np.all(ops == OP_INSERT)):
            return None
    else:
        if shape.full_identity:
            return None
        if has_toast and pc.any(pc.is_in(pc.list_flatten(toast), pa.array(keys))).as_py():
            return None  # a key column's value unchanged: the general fold says what that means
        found = _columns(rows.column("key"), keys)
        if found is None:
            return None
        before = found
        updated = ops == OP_UPDATE
        if updated.any():
            after_keys = values(keys, np.flatnonzero(updated))
            for name in keys:  # a key change needs the general fold
                if pc.any(pc.not_equal(before[name].filter(updated), after_keys[name])).as_py():
                    return None
    unchanged: dict[str, np.ndarray] = {}
    if has_toast:
        _, absent = _sparse_columns(after, names)
        kept = ops != OP_DELETE  # (a delete's row holds no value at all)
        unchanged = {n: m & kept for n, m in absent.items() if (m & kept).any()}
    return _Rows(
        shape,
        ops,
        rows.column("commit_lsn").to_numpy(),
        rows.column("ordinal").to_numpy(),
        rows.column("lsn").combine_chunks(),
        before,
        unchanged,
        values,
    )


def bulk_mirror(rows: pa.Table | ChangeBatch) -> BulkMirror | None:
    """The batch folded in Arrow, or None when it needs the general fold."""
    r = _rows_of(rows)
    if r is None:
        return None
    shape, names, keys = r.shape, r.names, r.shape.key_names
    order = r.sequence_order()
    if not keys:  # inserts into a table without a key: each row is a row of its own
        values = r.values(names, order, None)
        lsns = r.lsn.take(order)
        return BulkMirror(shape, values, len(order), {}, 0, lsns, True, {}, lsns[0].as_py())
    ranks = np.empty(len(order), np.int64)
    ranks[order] = np.arange(len(order))  # each row's place in sequence order
    numbers = _numbers(r)
    firsts, winners = _first_and_last(r, ranks, order, numbers)
    inserts_only = bool(np.all(r.ops[firsts] == OP_INSERT))
    deleted = r.ops[winners] == OP_DELETE
    kept, gone = winners[~deleted], winners[deleted]
    deletes = {k: r.keys[k].take(gone) for k in keys}
    upserts = r.values(names, kept, None)
    missing: dict[str, np.ndarray] = {}
    for name, unchanged in r.unchanged.items():
        lacking = unchanged[kept]
        if lacking.any():
            upserts[name], missing_here = _latest_known(
                r, order, ranks, numbers, kept, upserts[name], lacking, name
            )
            if missing_here.any():
                missing[name] = missing_here
    lsns = r.lsn.take(kept)
    first = r.lsn[0].as_py()
    return BulkMirror(
        shape, upserts, len(kept), deletes, len(gone), lsns, inserts_only, missing, first
    )


def _numbers(r: _Rows) -> np.ndarray | None:
    """The batch's keys as numbers when the key is one integer column (its text is the
    number), else None. Grouped by sorting numbers, a small batch of a steady load costs
    less than by a hash aggregation (and its rows are written in key order)."""
    keys = r.shape.key_names
    if len(keys) != 1:
        return None
    column = r.keys[keys[0]]
    oid = next(c.type_oid for c in r.shape.columns if c.name == keys[0])
    if oid not in _INTEGER_OIDS or column.null_count:
        return None
    return np.asarray(pc.cast(column, pa.int64()))


def _last_per_number(numbers: np.ndarray, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct `numbers` (sorted) and the position of each one's highest rank."""
    by_number = np.lexsort((ranks, numbers))
    ordered = numbers[by_number]
    last = np.flatnonzero(np.append(ordered[1:] != ordered[:-1], bool(len(ordered))))
    return ordered[last], by_number[last]


def _first_and_last(
    r: _Rows, ranks: np.ndarray, order: np.ndarray, numbers: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Per key of the batch: the row of its first change and the row of its last, in
    sequence order (`ranks`: each row's place in it; `order`: the rows in it); by `numbers`
    when the key has them (`_numbers`), else by an Acero aggregation."""
    if numbers is not None:
        _, last = _last_per_number(numbers, ranks)
        _, first = _last_per_number(numbers, -ranks)
        return first, last
    keys = r.shape.key_names
    table = pa.table({**{f"k{i}": r.keys[n] for i, n in enumerate(keys)}, _INDEX: ranks})
    grouped = table.group_by([f"k{i}" for i in range(len(keys))], use_threads=False)
    ranks_of = grouped.aggregate([(_INDEX, "max"), (_INDEX, "min")])
    first = ranks_of.column(f"{_INDEX}_min").to_numpy()
    return order[first], order[ranks_of.column(f"{_INDEX}_max").to_numpy()]


def _latest_known(
    r: _Rows,
    order: np.ndarray,
    ranks: np.ndarray,
    numbers: np.ndarray | None,
    kept: np.ndarray,
    current: pa.Array,
    lacking: np.ndarray,
    name: str,
) -> tuple[pa.Array, np.ndarray]:
    """Column `name` of the upserts (`kept`: their rows, each its key's last change;
    `current`: their values) where the `lacking` ones (an unchanged TOAST value) take the
    key's latest value in the batch: that of its last earlier insert or update that carried
    one, unless a delete came after it (null then, as the general fold has it; from the
    server, an insert comes in between, which carries every value). And which upserts the
    batch holds no value for, nor deleted: the target's current row has it."""
    deletes = r.ops == OP_DELETE
    carried = np.flatnonzero(~r.unchanged[name])  # a delete: none known after it
    wanted = np.flatnonzero(lacking)
    if numbers is None:
        none, latest_rank = _latest_carriers(r, ranks, carried, kept[wanted])
    elif len(carried):
        known, last = _last_per_number(numbers[carried], ranks[carried])
        asked = numbers[kept[wanted]]
        at = np.minimum(np.searchsorted(known, asked), len(known) - 1)
        none = known[at] != asked
        latest_rank = np.where(none, 0, ranks[carried[last[at]]])
    else:
        none, latest_rank = np.ones(len(wanted), np.bool_), np.zeros(len(wanted), np.int64)
    rows_at = order[latest_rank]
    filled = r.values((name,), rows_at, none | deletes[rows_at])[name]
    chosen = np.arange(len(current))
    chosen[wanted] = len(current) + np.arange(len(wanted))
    column = pa.concat_arrays([current, filled]).take(pa.array(chosen))
    missing = np.zeros(len(current), dtype=bool)
    missing[wanted] = none
    return column, missing


def _latest_carriers(
    r: _Rows, ranks: np.ndarray, carried: np.ndarray, asked: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For the keys of rows `asked`: whether none of the rows `carried` has it, and the
    highest rank of those that do (0 where none), by an Acero aggregation and join."""
    keys = r.shape.key_names
    names = [f"k{i}" for i in range(len(keys))]
    rows = pa.array(carried)
    carriers = pa.table(
        {
            **{n: r.keys[k].take(rows) for n, k in zip(names, keys, strict=True)},
            _INDEX: pa.array(ranks).take(rows),
        }
    )
    latest = carriers.group_by(names, use_threads=False).aggregate([(_INDEX, "max")])
    wanted = pa.table(
        {
            **{n: r.keys[k].take(pa.array(asked)) for n, k in zip(names, keys, strict=True)},
            _AT: pa.array(np.arange(len(asked))),
        }
    )
    found = wanted.join(latest, names, join_type="left outer", use_threads=False).sort_by(_AT)
    latest_rank = found.column(f"{_INDEX}_max")
    none = latest_rank.is_null().to_numpy(zero_copy_only=False)  # the target's value
    return none, latest_rank.fill_null(0).to_numpy(zero_copy_only=False)


@dataclass(frozen=True, slots=True)
class BulkHistory:
    """A history's batch folded: the versions it opens (every column as text, with their
    start and end sequences), and per key the sequence its target version ends at (the
    key's first change; `HistoryPlan.closes`)."""

    shape: Shape
    versions: dict[str, pa.Array]
    version_rows: int
    starts: pa.Array
    ends: pa.Array
    closes: dict[str, pa.Array]
    close_ends: pa.Array
    deletes: int
    inserts_only: bool
    #: The LSN of each version's change (for an error's message).
    version_lsns: pa.Array
    #: Per column: the versions whose value is an unchanged TOAST value the batch does not
    #: hold (the target's current version of the key has it), as a mask over the versions.
    missing: dict[str, np.ndarray] = field(default_factory=dict)
    #: The LSN of one of the batch's changes (for an error's message).
    first_lsn: int | None = None


def _sequences(lsns: np.ndarray, ordinals: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    mask = None if valid is None else pa.array(~valid)
    return pa.StructArray.from_arrays(
        [pa.array(lsns, pa.int64()), pa.array(ordinals, pa.int64())],
        fields=list(SEQUENCE_TYPE),
        mask=mask,
    )


def bulk_history(rows: pa.Table | ChangeBatch) -> BulkHistory | None:
    """The batch turned into versions in Arrow (what `fold_history` makes of it), or None
    when it needs the general fold: each insert or update opens a version that ends at the
    key's next change; a key's first change ends the target's current version. Without a
    key, each insert is a version that never ends."""
    r = _rows_of(rows)
    if r is None:
        return None
    shape, names, keys = r.shape, r.names, r.shape.key_names
    order = r.sequence_order()
    n = len(order)
    ops, lsns, ordinals = r.ops[order], r.commit_lsn[order], r.ordinal[order]
    if not keys:  # inserts into a table without a key: versions that never end
        never = _sequences(np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, bool))
        none = _sequences(np.zeros(0, np.int64), np.zeros(0, np.int64))
        values = r.values(names, order, None)
        starts = _sequences(lsns, ordinals)
        changes = r.lsn.take(order)
        first = changes[0].as_py()
        return BulkHistory(shape, values, n, starts, never, {}, none, 0, True, changes, {}, first)
    keyed = pa.table(
        {
            **{f"k{i}": r.keys[k].take(order) for i, k in enumerate(keys)},
            _INDEX: pa.array(np.arange(n)),
        }
    )
    by_key = keyed.sort_by(
        [*((f"k{i}", "ascending") for i in range(len(keys))), (_INDEX, "ascending")]
    )
    at = by_key.column(_INDEX).to_numpy()
    same = np.ones(n - 1, dtype=bool)
    for i in range(len(keys)):
        column = by_key.column(f"k{i}").combine_chunks()
        equal = pc.equal(column.slice(0, n - 1), column.slice(1)).fill_null(False)
        same &= equal.to_numpy(zero_copy_only=False)
    following = np.full(n, -1)
    following[at[:-1][same]] = at[1:][same]
    first = at[np.concatenate([[True], ~same])]
    opens = np.flatnonzero(ops != OP_DELETE)
    nxt = following[opens]
    has_end = nxt >= 0
    nxt = np.where(has_end, nxt, 0)
    missing: dict[str, np.ndarray] = {}
    if r.unchanged:
        starts = np.concatenate([[True], ~same])
        versions, missing = _versions_known(r, order, ops, at, starts, opens)
    else:
        versions = r.values(names, order[opens], None)
    return BulkHistory(
        shape,
        versions,
        len(opens),
        _sequences(lsns[opens], ordinals[opens]),
        _sequences(lsns[nxt], ordinals[nxt], has_end),
        {k: r.keys[k].take(order[first]) for k in keys},
        _sequences(lsns[first], ordinals[first]),
        int((ops == OP_DELETE).sum()),
        bool((ops[first] == OP_INSERT).all()),
        r.lsn.take(order[opens]),
        missing,
        r.lsn[0].as_py(),
    )


def _versions_known(
    r: _Rows,
    order: np.ndarray,
    ops: np.ndarray,
    by_key: np.ndarray,
    starts: np.ndarray,
    opens: np.ndarray,
) -> tuple[dict[str, pa.Array], dict[str, np.ndarray]]:
    """The versions' values (rows at `opens`; `ops` and positions in sequence order, `order`
    the row numbers in it) where an unchanged TOAST value is the key's latest earlier one in
    the batch (null after a delete, as the general fold has it), and per column the versions
    the batch holds no value for (the target's current version has it). `by_key`: the
    positions by key, then sequence; `starts`: where each key's rows start in it."""
    count = len(ops)
    deletes = ops == OP_DELETE
    positions = np.arange(count)
    group_start = np.maximum.accumulate(np.where(starts, positions, 0))
    versions = r.values(tuple(n for n in r.names if n not in r.unchanged), order[opens], None)
    missing: dict[str, np.ndarray] = {}
    for name, unchanged in r.unchanged.items():
        lacking = unchanged[order]
        if not lacking[opens].any():
            versions[name] = r.values((name,), order[opens], None)[name]
            continue
        carries = (~lacking | deletes)[by_key]
        latest = np.maximum.accumulate(np.where(carries, positions, -1))  # at or before
        source = np.full(count, -1)
        source[by_key] = np.where(latest >= group_start, by_key[np.maximum(latest, 0)], -1)
        take = np.where(lacking, source, positions)[opens]
        none = take < 0
        null = none | deletes[np.maximum(take, 0)]
        versions[name] = r.values((name,), order[np.maximum(take, 0)], null)[name]
        if none.any():
            missing[name] = none
    return {name: versions[name] for name in r.names}, missing
