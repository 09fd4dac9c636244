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
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pgcdc.envelope import SEQUENCE_TYPE, Shape
from pgcdc.targets.fold import _shape, single_shape

__all__ = ["BulkHistory", "BulkMirror", "bulk_history", "bulk_mirror"]

_ROW_OPS = pa.array(["insert", "update", "delete"])
_INDEX = "__pgcdc_index"
_AT = "__pgcdc_at"


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


def _columns(maps: pa.ChunkedArray, names: tuple[str, ...]) -> dict[str, pa.Array] | None:
    """Each named column's values, when every map holds exactly `names` in that order (how
    `pgcdc.envelope.EnvelopeBuilder` lays out the rows of one relation with no unchanged
    TOAST value): taken by position, far cheaper than a lookup by key per row. None when a
    map differs (or is null)."""
    if len(maps) == 0:
        return {name: pa.array([], pa.string()) for name in names}
    combined = maps.combine_chunks()
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
class _Plain:
    """A batch of one relation shape, with keys, no key change, no unchanged TOAST value of
    a key column, no truncation: each row's key (text, by key column) and the rows'
    sequence order."""

    shape: Shape
    names: tuple[str, ...]
    keys: dict[str, pa.Array]
    #: Row numbers in sequence order, and each row's place in it.
    order: pa.Array
    ranks: pa.Array
    #: Whether some update leaves TOAST values unchanged (never a key column's).
    unchanged: bool = False


def _plain(rows: pa.Table) -> _Plain | None:
    """The batch's keys and order, when it is plain (updates may leave TOAST values of
    columns other than the key's unchanged)."""
    if rows.num_rows == 0:
        return None
    ops = rows.column("op")
    if not pc.all(pc.is_in(ops, value_set=_ROW_OPS)).as_py():
        return None
    toast = rows.column("unchanged_toast")
    has_toast = bool(pc.max(pc.fill_null(pc.list_value_length(toast), 0)).as_py())
    if not single_shape(rows):
        return None
    shape = _shape(rows, 0)
    keys = shape.key_names
    if not keys or shape.full_identity:
        return None
    if has_toast and pc.any(pc.is_in(pc.list_flatten(toast), pa.array(keys))).as_py():
        return None  # a key column's value unchanged: the general fold says what that means
    before = _columns(rows.column("key"), keys)
    updated = pc.equal(ops, "update").combine_chunks()
    names = tuple(c.name for c in shape.columns)
    after = rows.column("after").filter(updated)
    after_keys = _sparse_columns(after, keys)[0] if has_toast else _columns(after, names)
    if before is None or after_keys is None:
        return None
    for name in keys:  # a key change needs the general fold
        if pc.any(pc.not_equal(before[name].filter(updated), after_keys[name])).as_py():
            return None
    order = pc.sort_indices(rows, sort_keys=[("commit_lsn", "ascending"), ("ordinal", "ascending")])
    ranks = pc.sort_indices(order)  # each row's position in sequence order
    return _Plain(shape, names, before, order, ranks, has_toast)


@dataclass(frozen=True, slots=True)
class _Inserts:
    """A batch of inserts into a table without identity (no key): each row is a row of its
    own, in sequence order."""

    shape: Shape
    values: dict[str, pa.Array]
    lsns: pa.Array
    starts: pa.Array


def _inserts_without_key(rows: pa.Table) -> _Inserts | None:
    if rows.num_rows == 0 or not pc.all(pc.equal(rows.column("op"), "insert")).as_py():
        return None
    if not single_shape(rows):
        return None
    shape = _shape(rows, 0)
    if shape.key_names:
        return None
    order = pc.sort_indices(rows, sort_keys=[("commit_lsn", "ascending"), ("ordinal", "ascending")])
    ordered = rows.select(["after", "lsn", "commit_lsn", "ordinal"]).take(order)
    values = _columns(ordered.column("after"), tuple(c.name for c in shape.columns))
    if values is None:
        return None
    starts = _sequences(
        ordered.column("commit_lsn").to_numpy(), ordered.column("ordinal").to_numpy()
    )
    return _Inserts(shape, values, ordered.column("lsn").combine_chunks(), starts)


def bulk_mirror(rows: pa.Table) -> BulkMirror | None:
    """The batch folded in Arrow, or None when it needs the general fold."""
    if (inserts := _inserts_without_key(rows)) is not None:
        count = len(inserts.lsns)
        return BulkMirror(inserts.shape, inserts.values, count, {}, 0, inserts.lsns, True)
    plain = _plain(rows)
    if plain is None:
        return None
    keys, names = plain.shape.key_names, plain.names
    table = pa.table({**{f"k{i}": plain.keys[n] for i, n in enumerate(keys)}, _INDEX: plain.ranks})
    grouped = table.group_by([f"k{i}" for i in range(len(keys))], use_threads=False)
    ranks_of = grouped.aggregate([(_INDEX, "max"), (_INDEX, "min")])
    last_rank = ranks_of.column(f"{_INDEX}_max")
    ops = rows.column("op")
    first_ops = pc.take(ops, pc.take(plain.order, ranks_of.column(f"{_INDEX}_min")))
    inserts_only = bool(pc.all(pc.equal(first_ops, "insert")).as_py())
    winners = pc.take(plain.order, last_rank)
    last = rows.select(["op", "key", "after", "lsn"]).take(winners)
    deleted = pc.equal(last.column("op"), "delete")
    kept = last.filter(pc.invert(deleted))
    gone = last.filter(deleted)
    deletes = _columns(gone.column("key"), keys)
    missing: dict[str, np.ndarray] = {}
    upserts: dict[str, pa.Array] | None
    if plain.unchanged:
        upserts, absent = _sparse_columns(kept.column("after"), names)
        kept_keys = _columns(kept.column("key"), keys)
        assert kept_keys is not None  # `_plain` read every row's key so
        row_deletes = pc.equal(rows.column("op"), "delete").to_numpy(zero_copy_only=False)
        for name, lacking in absent.items():
            upserts[name], missing_here = _latest_known(
                rows, plain, row_deletes, kept_keys, upserts[name], lacking, name
            )
            if missing_here.any():
                missing[name] = missing_here
    else:
        upserts = _columns(kept.column("after"), names)
    if upserts is None or deletes is None:
        return None
    lsns = kept.column("lsn").combine_chunks()
    return BulkMirror(
        plain.shape, upserts, kept.num_rows, deletes, gone.num_rows, lsns, inserts_only, missing
    )


def _latest_known(
    rows: pa.Table,
    plain: _Plain,
    deletes: np.ndarray,
    kept_keys: dict[str, pa.Array],
    current: pa.Array,
    lacking: np.ndarray,
    name: str,
) -> tuple[pa.Array, np.ndarray]:
    """Column `name` of the upserts (`kept_keys`: their keys, each its key's last change;
    `current`: their values; `deletes`: which of the batch's rows are deletes) where the
    `lacking` ones (an unchanged TOAST value) take the key's latest value in the batch: that
    of its last earlier insert or update that carried one, unless a delete came after it
    (null then, as the general fold has it; from the server, an insert comes in between,
    which carries every value). And which upserts the batch holds no value for, nor deleted:
    the target's current row has it."""
    keys = plain.shape.key_names
    names = [f"k{i}" for i in range(len(keys))]
    values, absent = _sparse_columns(rows.column("after"), (name,))
    known = ~absent.get(name, np.zeros(rows.num_rows, dtype=bool))
    carried = pa.array(np.flatnonzero(known | deletes))  # a delete: none known after it
    carriers = pa.table(
        {
            **{n: plain.keys[k].take(carried) for n, k in zip(names, keys, strict=True)},
            _INDEX: plain.ranks.take(carried),
        }
    )
    latest = carriers.group_by(names, use_threads=False).aggregate([(_INDEX, "max")])
    wanted = np.flatnonzero(lacking)
    asked = pa.table(
        {
            **{n: kept_keys[k].take(pa.array(wanted)) for n, k in zip(names, keys, strict=True)},
            _AT: pa.array(np.arange(len(wanted))),
        }
    )
    found = asked.join(latest, names, join_type="left outer", use_threads=False).sort_by(_AT)
    latest_row = pc.take(plain.order, found.column(f"{_INDEX}_max"))
    none = latest_row.is_null().to_numpy(zero_copy_only=False)  # the target's value
    rows_at = latest_row.fill_null(0).to_numpy(zero_copy_only=False)
    filled = values[name].take(pa.array(rows_at, mask=none | deletes[rows_at]))
    chosen = np.arange(len(current))
    chosen[wanted] = len(current) + np.arange(len(wanted))
    column = pa.concat_arrays([current, filled]).take(pa.array(chosen))
    missing = np.zeros(len(current), dtype=bool)
    missing[wanted] = none
    return column, missing


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


def _sequences(lsns: np.ndarray, ordinals: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    mask = None if valid is None else pa.array(~valid)
    return pa.StructArray.from_arrays(
        [pa.array(lsns, pa.int64()), pa.array(ordinals, pa.int64())],
        fields=list(SEQUENCE_TYPE),
        mask=mask,
    )


def bulk_history(rows: pa.Table) -> BulkHistory | None:
    """The batch turned into versions in Arrow (what `fold_history` makes of it), or None
    when it needs the general fold: each insert or update opens a version that ends at the
    key's next change; a key's first change ends the target's current version. Without a
    key, each insert is a version that never ends."""
    if (inserts := _inserts_without_key(rows)) is not None:
        count = len(inserts.lsns)
        never = _sequences(
            np.zeros(count, np.int64), np.zeros(count, np.int64), np.zeros(count, bool)
        )
        none = _sequences(np.zeros(0, np.int64), np.zeros(0, np.int64))
        return BulkHistory(
            inserts.shape,
            inserts.values,
            count,
            inserts.starts,
            never,
            {},
            none,
            0,
            True,
            inserts.lsns,
        )
    plain = _plain(rows)
    if plain is None:
        return None
    keys, names = plain.shape.key_names, plain.names
    n = rows.num_rows
    order = plain.order
    ops = pc.take(rows.column("op"), order).to_numpy(zero_copy_only=False)
    lsns = pc.take(rows.column("commit_lsn"), order).to_numpy()
    ordinals = pc.take(rows.column("ordinal"), order).to_numpy()
    keyed = pa.table(
        {
            **{f"k{i}": pc.take(plain.keys[k], order) for i, k in enumerate(keys)},
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
    opens = np.flatnonzero(ops != "delete")
    nxt = following[opens]
    has_end = nxt >= 0
    nxt = np.where(has_end, nxt, 0)
    missing: dict[str, np.ndarray] = {}
    versions: dict[str, pa.Array] | None
    if plain.unchanged:
        starts = np.concatenate([[True], ~same])
        versions, missing = _versions_known(
            pc.take(rows.column("after"), order), names, ops, at, starts, opens
        )
    else:
        versions = _columns(pc.take(rows.column("after"), pc.take(order, pa.array(opens))), names)
    if versions is None:
        return None
    version_lsns = pc.take(rows.column("lsn"), pc.take(order, pa.array(opens))).combine_chunks()
    closes = {k: pc.take(plain.keys[k], pc.take(order, pa.array(first))) for k in keys}
    return BulkHistory(
        plain.shape,
        versions,
        len(opens),
        _sequences(lsns[opens], ordinals[opens]),
        _sequences(lsns[nxt], ordinals[nxt], has_end),
        {k: v.combine_chunks() if isinstance(v, pa.ChunkedArray) else v for k, v in closes.items()},
        _sequences(lsns[first], ordinals[first]),
        int((ops == "delete").sum()),
        bool((ops[first] == "insert").all()),
        version_lsns,
        missing,
    )


def _versions_known(
    after: pa.ChunkedArray | pa.Array,
    names: tuple[str, ...],
    ops: np.ndarray,
    by_key: np.ndarray,
    starts: np.ndarray,
    opens: np.ndarray,
) -> tuple[dict[str, pa.Array], dict[str, np.ndarray]]:
    """The versions' values (rows at `opens`; all in sequence order) where an unchanged
    TOAST value is the key's latest earlier one in the batch (null after a delete, as the
    general fold has it), and per column the versions the batch holds no value for (the
    target's current version has it). `by_key`: the rows by key, then sequence; `starts`:
    where each key's rows start in it."""
    count = len(ops)
    values, absent = _sparse_columns(after, names)
    deletes = ops == "delete"
    positions = np.arange(count)
    group_start = np.maximum.accumulate(np.where(starts, positions, 0))
    chosen = pa.array(opens)
    versions: dict[str, pa.Array] = {}
    missing: dict[str, np.ndarray] = {}
    for name in names:
        lacking = absent.get(name)
        if lacking is None or not lacking[opens].any():
            versions[name] = values[name].take(chosen)
            continue
        carries = (~lacking | deletes)[by_key]
        latest = np.maximum.accumulate(np.where(carries, positions, -1))  # at or before
        source = np.full(count, -1)
        source[by_key] = np.where(latest >= group_start, by_key[np.maximum(latest, 0)], -1)
        take = np.where(lacking, source, positions)[opens]
        none = take < 0
        null = none | deletes[np.maximum(take, 0)]
        versions[name] = values[name].take(pa.array(np.maximum(take, 0), mask=null))
        if none.any():
            missing[name] = none
    return versions, missing
