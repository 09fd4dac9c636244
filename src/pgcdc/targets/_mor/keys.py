"""Row keys as numbers a sorted index can search (numpy, no I/O).

A key of one column whose values are integers underneath (integers, dates, timestamps,
decimals of up to 18 digits, booleans) is its own number: exact, unless the column holds nulls
(the smallest int64 stands for them, and matches are checked). Any other key (strings, several
columns, floats, wider decimals) is a 64-bit hash of its columns; a match by hash is then
checked against the values (`same_keys`), so collisions cost a comparison, never a wrong row.
Which of the two depends on the key's types only: every file and batch of a table are coded
alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["KeyCodes", "key_codes", "same_keys"]

U64 = npt.NDArray[np.uint64]
_NULL = np.uint64(0x9E3779B97F4A7C15)
_MULTIPLIER = np.uint64(0xFF51AFD7ED558CCD)
#: A null in a key of one integer column (a value too, checked against the key's values).
_NULL_CODE = np.int64(np.iinfo(np.int64).min)


@dataclass(frozen=True, slots=True)
class KeyCodes:
    """One number per row; `exact`: equal numbers are equal keys."""

    codes: npt.NDArray[np.int64] | U64
    exact: bool


def _array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if pa.types.is_string_view(array.type):
        array = array.cast(pa.large_string())
    elif pa.types.is_binary_view(array.type):
        array = array.cast(pa.large_binary())
    return array


def _integer_like(kind: pa.DataType) -> bool:
    return (
        pa.types.is_integer(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_date(kind)
        or pa.types.is_timestamp(kind)
        or pa.types.is_time(kind)
        or pa.types.is_duration(kind)
        or (pa.types.is_decimal128(kind) and kind.precision <= 18)
    )


def _as_int64(array: pa.Array) -> npt.NDArray[np.int64]:
    """The integers under an integer-like array (nulls as 0)."""
    kind = array.type
    if pa.types.is_decimal128(kind):
        words = _fixed_words(array, 2)
        return words[:, 0].view(np.int64).copy()  # the low word: exact below 10**18
    if pa.types.is_boolean(kind):
        return np.asarray(array.fill_null(False).to_numpy(zero_copy_only=False), np.int64)
    if pa.types.is_uint64(kind):
        return array.fill_null(0).to_numpy(zero_copy_only=False).view(np.int64)
    if not pa.types.is_integer(kind):
        width = 32 if kind.bit_width == 32 else 64
        array = array.view(pa.int32() if width == 32 else pa.int64())
    return np.asarray(array.fill_null(0).to_numpy(zero_copy_only=False), np.int64)


def _fixed_words(array: pa.Array, words: int) -> U64:
    """Fixed-width values (decimals) as `words` uint64 words each."""
    data = array.buffers()[1]
    raw = np.frombuffer(data, np.uint64)[: (array.offset + len(array)) * words]
    return raw.reshape(-1, words)[array.offset :]


def _mix(x: U64) -> U64:
    x = x ^ (x >> np.uint64(33))
    x = x * _MULTIPLIER
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xC4CEB9FE1A85EC53)
    return x ^ (x >> np.uint64(33))


def _bytes_hash(array: pa.Array) -> U64:
    """A hash of each string or binary value, eight bytes at a time."""
    large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    buffers = array.buffers()
    raw_offsets = np.frombuffer(buffers[1], np.int64 if large else np.int32)
    offsets = raw_offsets[array.offset : array.offset + len(array) + 1].astype(np.int64)
    data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.empty(0, np.uint8)
    padded = np.concatenate([data, np.zeros(8, np.uint8)])
    words = np.lib.stride_tricks.as_strided(padded, (len(data) + 1, 8), (1, 1)).view("<u8")[:, 0]
    starts, lengths = offsets[:-1], offsets[1:] - offsets[:-1]
    out = lengths.astype(np.uint64) * _MULTIPLIER
    order = np.argsort(-lengths, kind="stable")
    longest = np.sort(lengths)[::-1]
    step = 0
    while True:
        active = int(np.searchsorted(-longest, -step, side="left"))  # rows longer than step
        if active == 0:
            break
        rows = order[:active]
        remaining = lengths[rows] - step
        word = words[starts[rows] + step]
        short = remaining < 8
        if short.any():
            keep = (np.uint64(1) << (remaining[short].astype(np.uint64) * np.uint64(8))) - 1
            word[short] &= keep
        out[rows] = _mix(out[rows] ^ word)
        step += 8
    return out


def _column_hash(array: pa.Array) -> U64:
    kind = array.type
    if _integer_like(kind):
        codes = _as_int64(array).view(np.uint64)
    elif pa.types.is_floating(kind):
        values = np.asarray(array.cast(pa.float64()).fill_null(0).to_numpy(zero_copy_only=False))
        values = np.where(values == 0, 0.0, values)  # -0.0 is 0.0
        values = np.where(np.isnan(values), np.nan, values)
        codes = values.view(np.uint64)
    elif pa.types.is_decimal(kind):
        words = _fixed_words(array, kind.byte_width // 8)
        codes = np.zeros(len(array), np.uint64)
        for i in range(words.shape[1]):
            codes = _mix(codes ^ words[:, i])
    elif (
        pa.types.is_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_large_binary(kind)
    ):
        codes = _bytes_hash(array)
    elif pa.types.is_fixed_size_binary(kind):
        codes = _bytes_hash(array.cast(pa.binary()))
    else:
        raise TypeError(f"a key column of type {kind} cannot be indexed")
    if array.null_count:
        valid = np.asarray(array.is_valid().to_numpy(zero_copy_only=False), np.bool_)
        codes = np.where(valid, codes, _NULL)
    return codes


def key_codes(columns: Sequence[pa.Array | pa.ChunkedArray]) -> KeyCodes:
    """The numbers of the keys made of `columns` (same length, typed as the table's)."""
    arrays = [_array(c) for c in columns]
    if len(arrays) == 1 and _integer_like(arrays[0].type):
        # The number space depends on the type alone, so that a file whose key column holds
        # nulls (versions a new key did not exist for) and a batch without any are searched
        # with the same numbers: a null is _NULL_CODE, and such codes are checked (`exact`).
        array = arrays[0]
        values = _as_int64(array)
        if array.null_count:
            valid = np.asarray(array.is_valid().to_numpy(zero_copy_only=False), np.bool_)
            return KeyCodes(np.where(valid, values, _NULL_CODE), False)
        return KeyCodes(values, True)
    codes = np.zeros(len(arrays[0]) if arrays else 0, np.uint64)
    for array in arrays:
        codes = _mix(codes * _MULTIPLIER + _column_hash(array))
    return KeyCodes(codes, False)


def same_keys(
    left: Sequence[pa.Array | pa.ChunkedArray],
    left_rows: npt.NDArray[np.int64],
    right: Sequence[pa.Array | pa.ChunkedArray],
    right_rows: npt.NDArray[np.int64],
) -> npt.NDArray[np.bool_]:
    """Whether key row `left_rows[i]` of `left` equals row `right_rows[i]` of `right` (nulls
    equal nulls, as keys are compared). Chunked columns are not combined: only the rows
    compared are taken."""
    same = np.ones(len(left_rows), np.bool_)
    for a, b in zip(left, right, strict=True):
        x, y = _array(a.take(pa.array(left_rows))), _array(b.take(pa.array(right_rows)))
        equal = pc.fill_null(pc.equal(x, y), False)
        both_null = pc.and_(pc.is_null(x), pc.is_null(y))
        same &= np.asarray(pc.or_(equal, both_null).to_numpy(zero_copy_only=False), np.bool_)
    return same
