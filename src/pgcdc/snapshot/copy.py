"""One chunk of a table, read with ``COPY … TO STDOUT``, as typed Arrow batches.

The snapshot's rows must be exactly what the stream would have made of them:
`read_copy` gives the columns of ``relation_arrow_schema`` (no ``_pgcdc_unchanged_toast``; a
``_pgcdc_out_of_range`` column under the policy "null"), with the values
`pgcdc.types.arrow.ArrowBatchBuilder` builds from the same rows' text. COPY prints every value
with the type's output function, as pgoutput's text mode does, so under pgcdc's session
settings (`DEFAULT_SESSION_SETTINGS`) the texts are the same; only their CSV quoting differs.

The rows become string columns, then typed by `pgcdc.types.columns.TextColumns`: vectorized
where pyarrow's conversion is provably the type system's, value by value otherwise, with the
out-of-range policy. The strings come one of two ways, the same strings either way:

* with the C extension ``_copytext`` (built by ``pip install`` with a compiler, bound to the
  libpq psycopg loaded): the COPY in text format, each row taken from libpq and split into
  Arrow string buffers in C, without the GIL;
* else (``PGCDC_PURE_PYTHON=1``, no build, no libpq found): the COPY as CSV, its rows taken
  with ``PGconn.get_copy_data`` into pieces parsed by ``pyarrow.csv`` (an unquoted empty field
  is NULL, a quoted one the empty string).

The COPY is streamed (the server sends one CopyData message per row) in pieces of at most
`batch_rows` rows (and about `PIECE_BYTES`), each typed on its own, so memory holds one piece
at a time whatever the chunk's size; psycopg's `Copy` opens the COPY and cancels it when
reading stops early (an error, or the caller closing the generator).
"""

from __future__ import annotations

import functools
import os
import selectors
import time
from collections.abc import Callable, Generator, Iterator
from types import ModuleType
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.csv as pcsv
from psycopg import sql

from pgcdc.protocol import Relation
from pgcdc.types.columns import TextColumns, text_columns_schema
from pgcdc.types.mapping import DEFAULT_OPTIONS, MappingOptions
from pgcdc.types.registry import TypeRegistry

__all__ = ["copy_query", "copy_schema", "copy_texts", "read_copy"]

#: The schema of `read_copy`'s batches.
copy_schema = text_columns_schema

#: A piece of the COPY stream is parsed once it holds this many bytes (or `batch_rows` rows).
PIECE_BYTES = 64 << 20
#: pyarrow's CSV block size: the unit of its parallel parsing.
_BLOCK_SIZE = 1 << 20
_MAX_BLOCK = 2**32


# --- the query ----------------------------------------------------------------------------


def _tid(block: int, what: str) -> sql.Composable:
    if type(block) is not int or not 0 <= block < _MAX_BLOCK:
        raise ValueError(f"{what} must be a block number (0 .. 2^32-1), not {block!r}")
    return sql.SQL("{}::tid").format(sql.Literal(f"({block},0)"))


def copy_query(
    relation: Relation, source: str, *, first_block: int | None, end_block: int | None
) -> sql.Composed:
    """``COPY (SELECT <relation's columns> FROM ONLY <source> WHERE ctid >= '(first,0)' AND
    ctid < '(end,0)') TO STDOUT`` (`read_copy` adds the format): the rows of blocks
    [first_block, end_block)
    of `source` ("schema.name", split at its last dot: a partition leaf may be named other
    than the relation), a bound None leaving that side open. The columns are the relation's,
    in its order, as `read_copy` expects."""
    schema, _, name = source.rpartition(".")
    table = sql.Identifier(schema or relation.schema, name)
    columns = sql.SQL(", ").join(sql.Identifier(c.name) for c in relation.columns)
    bounds: list[sql.Composable] = []
    if first_block is not None:
        bounds.append(sql.SQL("ctid >= {}").format(_tid(first_block, "first_block")))
    if end_block is not None:
        bounds.append(sql.SQL("ctid < {}").format(_tid(end_block, "end_block")))
    where = sql.SQL(" WHERE ") + sql.SQL(" AND ").join(bounds) if bounds else sql.SQL("")
    return sql.SQL("COPY (SELECT {} FROM ONLY {}{}) TO STDOUT").format(columns, table, where)


# --- the stream ---------------------------------------------------------------------------

#: The session settings a COPY's text depends on that the server reports to the client
#: (DateStyle's output is ISO whatever its field order); a value must start like this.
_REPORTED_SETTINGS = {
    b"DateStyle": b"ISO",
    b"IntervalStyle": b"postgres",
    b"client_encoding": b"UTF8",
}


def _check_session(conn: psycopg.Connection[Any]) -> None:
    for name, wanted in _REPORTED_SETTINGS.items():
        value = conn.pgconn.parameter_status(name)
        if value is not None and not value.startswith(wanted):
            raise ValueError(
                f"read_copy needs the session's {name.decode()} to be {wanted.decode()!r} "
                f"(see DEFAULT_SESSION_SETTINGS), not {value.decode()!r}"
            )


def _pieces(
    conn: psycopg.Connection[Any], query: Any, batch_rows: int, piece_bytes: int
) -> Generator[tuple[bytearray, int], None, None]:
    """The COPY's output in pieces of whole rows: (CSV bytes, row count).

    The server sends one CopyData message per row; libpq's buffered ones are drained with
    ``get_copy_data`` (psycopg's `Copy.read` costs a generator per row); when none is
    buffered, wait for the socket. psycopg's `Copy` opened the COPY and, on an exception
    (or this generator being closed early), cancels it."""
    with conn.cursor() as cursor, cursor.copy(query):
        pgconn = conn.pgconn
        get = pgconn.get_copy_data
        with selectors.DefaultSelector() as selector:
            selector.register(pgconn.socket, selectors.EVENT_READ)
            piece = bytearray()
            rows = 0
            while True:
                size, data = get(1)
                if size > 0:
                    piece += data
                    rows += 1
                    if rows >= batch_rows or len(piece) >= piece_bytes:
                        yield piece, rows
                        piece = bytearray()
                        rows = 0
                elif size == 0:
                    selector.select()
                    pgconn.consume_input()
                elif size == -1:
                    break
                else:
                    raise psycopg.OperationalError(
                        f"reading COPY data failed: {pgconn.get_error_message()}"
                    )
            _finish(pgconn, selector)
        if rows:
            yield piece, rows


@functools.cache
def _copytext() -> ModuleType | None:
    """The C extension, bound to the libpq psycopg uses (None: not built, turned off, or no
    loaded libpq of psycopg's version found)."""
    if os.environ.get("PGCDC_PURE_PYTHON"):
        return None
    try:
        from pgcdc.snapshot import _copytext  # type: ignore[attr-defined]
    except ImportError:
        return None
    try:
        with open("/proc/self/maps") as maps:  # the libraries this process has loaded
            paths = {line.split(None, 5)[-1].strip() for line in maps if "libpq" in line}
    except OSError:
        return None
    version = psycopg.pq.version()
    for path in sorted(paths, key=lambda p: "psycopg" not in p):  # psycopg's own first
        if os.path.basename(path).startswith("libpq") and _copytext.bind(path, version):
            return _copytext
    return None


def _drained(
    conn: psycopg.Connection[Any], query: Any, reader: Any, batch_rows: int
) -> Generator[tuple[int, list[pa.Array]], None, None]:
    """The text-format COPY's rows taken by `reader` (the C extension's `CopyColumns`):
    (rows, string columns)."""
    pointer = conn.pgconn.pgconn_ptr  # type: ignore[attr-defined]

    def take() -> tuple[int, list[pa.Array]]:
        rows, columns = reader.take()
        return rows, [
            pa.Array.from_buffers(
                pa.string(),
                rows,
                [
                    None if valid is None else pa.py_buffer(valid),
                    pa.py_buffer(offsets),
                    pa.py_buffer(values),
                ],
                null_count=nulls,
            )
            for valid, offsets, values, nulls in columns
        ]

    with conn.cursor() as cursor, cursor.copy(query):
        pgconn = conn.pgconn
        with selectors.DefaultSelector() as selector:
            selector.register(pgconn.socket, selectors.EVENT_READ)
            while True:
                status = reader.drain(pointer, batch_rows, PIECE_BYTES)
                if status == 1:
                    yield take()
                elif status == 0:
                    selector.select()
                    pgconn.consume_input()
                elif status == -1:
                    break
                else:
                    raise psycopg.OperationalError(
                        f"reading COPY data failed: {pgconn.get_error_message()}"
                    )
            _finish(pgconn, selector)
    if reader.rows:
        yield take()


def _finish(pgconn: Any, selector: selectors.BaseSelector) -> None:
    """Take the COPY's results after its end (COMMAND_OK, or the error that ended it)."""
    error = None
    while True:
        while pgconn.is_busy():
            selector.select()
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None:
            break
        if result.status != psycopg.pq.ExecStatus.COMMAND_OK and error is None:
            error = psycopg.errors.error_from_result(result, encoding="utf-8")
    if error is not None:
        raise error


def _parse(piece: bytearray, names: list[str]) -> list[pa.Array]:
    """A piece's CSV as one string array per column (NULL: an unquoted empty field)."""
    block_size = _BLOCK_SIZE
    convert = pcsv.ConvertOptions(
        column_types=dict.fromkeys(names, pa.string()),
        strings_can_be_null=True,
        quoted_strings_can_be_null=False,
        null_values=[""],
        check_utf8=True,
    )
    parse = pcsv.ParseOptions(
        delimiter=",",
        quote_char='"',
        double_quote=True,
        escape_char=False,
        newlines_in_values=True,
        ignore_empty_lines=False,  # a row of one NULL column is an empty line
    )
    buffer = pa.py_buffer(piece)
    block_size = max(block_size, len(piece) + 1)  # one block: columns of one chunk, no copy
    while True:
        read = pcsv.ReadOptions(column_names=names, block_size=block_size)
        try:
            table = pcsv.read_csv(buffer, read, parse, convert)
            break
        except pa.ArrowInvalid as exc:
            # A row longer than a block (a big value) needs a block that holds it.
            if "straddl" not in str(exc) or block_size > len(piece):
                raise
            block_size = len(piece) + 1
    return [column.combine_chunks() for column in table.columns]


def read_copy(
    conn: psycopg.Connection[Any],
    query: Any,
    relation: Relation,
    registry: TypeRegistry,
    options: MappingOptions = DEFAULT_OPTIONS,
    *,
    batch_rows: int = 200_000,
    table_name: str | None = None,
    timings: dict[str, float] | None = None,
    on_texts: Callable[[list[pa.Array]], None] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Run `query` (a ``COPY … TO STDOUT`` of `relation`'s columns in order, as `copy_query`
    makes, with no format) on `conn` and yield its rows as record batches of `copy_schema`, of
    at most `batch_rows` rows each (none for no rows).

    `conn` is an open psycopg connection, already in the transaction (snapshot) to read and
    with pgcdc's session settings (`DEFAULT_SESSION_SETTINGS`; a reported one that differs
    raises ValueError). Values are typed exactly as `ArrowBatchBuilder` types the same rows'
    text; errors name the table `table_name` ("schema.name", default the relation's).
    `timings`, when given, gets the seconds spent typing added under "type" (the rest of the
    time taken to iterate is the COPY's: the server, the transfer, splitting the rows).
    `on_texts`, when given, gets each piece's string columns before they are typed (a change
    log's snapshot reads are made of them)."""
    if batch_rows < 1:
        raise ValueError("batch_rows must be at least 1")
    _check_session(conn)
    columns = TextColumns(relation, registry, options, table_name)

    def typed(strings: list[pa.Array], rows: int) -> pa.RecordBatch:
        if timings is None:
            return columns.batch(strings, rows)
        started = time.perf_counter()
        batch = columns.batch(strings, rows)
        timings["type"] = timings.get("type", 0.0) + time.perf_counter() - started
        return batch

    for rows, strings in copy_texts(conn, query, len(relation.columns), batch_rows=batch_rows):
        if on_texts is not None:
            on_texts(strings)
        yield typed(strings, rows)


def copy_texts(
    conn: psycopg.Connection[Any], query: Any, columns: int, *, batch_rows: int = 200_000
) -> Iterator[tuple[int, list[pa.Array]]]:
    """Run `query` (a ``COPY … TO STDOUT`` of `columns` columns, with no format) on `conn`
    and yield its rows as (row count, one string array per column: each value exactly as
    the type's output function printed it, NULL as null), at most `batch_rows` rows at a
    time. A COPY the caller stops reading is cancelled."""
    fast = _copytext()
    if fast is not None and getattr(conn.pgconn, "pgconn_ptr", None):
        drained = _drained(conn, query, fast.CopyColumns(columns), batch_rows)
        try:
            yield from drained
        finally:
            drained.close()  # now, not when collected: an unfinished COPY is cancelled
        return
    names = [f"c{i}" for i in range(columns)]
    csv = (sql.SQL(query) if isinstance(query, str) else query) + sql.SQL(" (FORMAT csv)")
    pieces = _pieces(conn, csv, batch_rows, PIECE_BYTES)
    try:
        for piece, rows in pieces:
            strings = _parse(piece, names) if names else []
            if strings and len(strings[0]) != rows:
                raise ValueError(f"COPY sent {rows} rows, its CSV holds {len(strings[0])}")
            yield rows, strings
    finally:
        pieces.close()  # now, not when collected: an unfinished COPY is cancelled
