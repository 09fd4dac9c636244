"""Arrays of any element type: ``array_out`` text and ``array_send`` binary forms.

An array codec is built from its element's codec (`array_codec`); `TypeRegistry.get` builds one
on first use for every registered type that declares an ``array_oid``, so a type module only has
to register its element type. Values are nested lists, one level per dimension; an array whose
lower bounds are not all 1 (``'[0:1]={1,2}'``) becomes a `PgArray`, which keeps them. The
elements of an array of a domain over an array are arrays themselves (``tags[]``, ``tags`` a
domain over ``text[]``: ``{"{a,b}","{}"}`` has one dimension): a one-dimensional one is a list
of lists, and one of more dimensions is always a `PgArray`, so that the two never look alike.

Text form (``array_out``): ``[lo:hi]...=`` only when a lower bound is not 1, then ``{...}``
nested once per dimension, elements separated by the element type's delimiter (``;`` for box),
``NULL`` unquoted for a null element. An element is double-quoted when it is empty, spells
``NULL`` in any case, or holds a quote, backslash, brace, delimiter or white space; inside
quotes ``"`` and ``\\`` are backslash-escaped. An empty array is ``{}`` (zero dimensions).

Binary form (``array_send``): int32 ndim, int32 has-nulls flag, element type OID, then per
dimension int32 size and int32 lower bound, then each element as int32 length (-1 for NULL)
and the element's send bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from math import prod
from typing import Any

from pgcdc.errors import ValueDecodeError
from pgcdc.types.registry import DEFAULT_REGISTRY, TypeCodec, UnknownBinary

__all__ = ["PgArray", "array_codec", "parse_array_binary", "parse_array_text", "unquote"]

_QUOTE = 0x22
_LBRACE = 0x7B
_RBRACE = 0x7D
_NULL = b"NULL"

_HEADER = struct.Struct(">iiI")
_INT32 = struct.Struct(">i")

#: Built-in fixed-width element types whose arrays without NULLs unpack in one `struct` call:
#: each element is a 4-byte length and the value.
_FIXED = {21: ("h", 2), 23: ("i", 4), 20: ("q", 8), 26: ("I", 4), 700: ("f", 4), 701: ("d", 8)}


@dataclass(frozen=True, slots=True)
class PgArray:
    """An array with a lower bound other than 1: `values` nested as for a plain array, one
    lower bound per dimension (a plain list would lose them, and with them the subscripts).
    Also a multi-dimensional array whose elements are arrays (of a domain over an array),
    whatever its bounds: nested lists would read as a one-dimensional array of them."""

    values: list[Any]
    lower_bounds: tuple[int, ...]


def unquote(data: bytes, i: int, doubled: bool = False) -> tuple[bytes, int]:
    """The string double-quoted at ``data[i]`` without quotes and backslash escapes, and the
    index after its closing quote. With `doubled`, ``""`` inside is one quote (``record_out``
    and ``range_out`` write quotes that way; ``array_out`` uses backslashes)."""
    find = data.find
    start = i + 1
    end = find(b'"', start)
    if end < 0:
        raise ValueDecodeError(f"unterminated quoted string at byte {i} of {data[:200]!r}")
    slash = find(b"\\", start, end)
    if slash < 0 and not (doubled and data[end + 1 : end + 2] == b'"'):
        return data[start:end], end + 1
    parts: list[bytes] = []
    while True:
        if slash >= 0:
            parts.append(data[start:slash])
            parts.append(data[slash + 1 : slash + 2])
            start = slash + 2
            end = find(b'"', start)
        elif doubled and data[end + 1 : end + 2] == b'"':
            parts.append(data[start : end + 1])
            start = end + 2
            end = find(b'"', start)
        else:
            parts.append(data[start:end])
            return b"".join(parts), end + 1
        if end < 0:
            raise ValueDecodeError(f"unterminated quoted string at byte {i} of {data[:200]!r}")
        slash = find(b"\\", start, end)


def _nest(flat: list[Any], dims: list[int] | tuple[int, ...]) -> list[Any]:
    """`flat` (row-major) cut into nested lists of shape `dims`."""
    for size in reversed(dims[1:]):
        flat = [flat[i : i + size] for i in range(0, len(flat), size)]
    return flat


def _lower_bounds(prefix: bytes) -> tuple[list[int], list[int]]:
    """Sizes and lower bounds from a ``[lo:hi][lo:hi]`` dimension prefix."""
    sizes: list[int] = []
    lowers: list[int] = []
    for part in prefix[1:-1].split(b"]["):
        lo, _, hi = part.partition(b":")
        lower, upper = int(lo), int(hi)
        sizes.append(upper - lower + 1)
        lowers.append(lower)
    return sizes, lowers


def _plain_dims(body: bytes, delim: bytes, ndim: int) -> list[int]:
    """The size of each dimension of a ``{...}`` body without quotes, whose braces and
    delimiters are then all structure: counted and checked with C-level `bytes` methods."""
    if ndim == 1:
        if b"{" in body[1:-1] or b"}" in body[1:-1]:
            raise ValueDecodeError(f"unbalanced braces in array text {body[:200]!r}")
        return [body.count(delim) + 1]
    # k braces closing together first end the first sub-array of depth ndim-k+1.
    counts = [body.count(delim, 0, body.find(b"}" * k)) + 1 for k in range(1, ndim + 1)]
    dims = _dims_from_counts(counts)
    if body.translate(None, _not_structure(delim)) != _skeleton(dims, delim):
        raise ValueDecodeError(f"array text is not rectangular: {body[:200]!r}")
    return dims


def _scan(body: bytes, delim: bytes, ndim: int) -> tuple[list[bytes | None], list[int]]:
    """Element texts (None for NULL) of a ``{...}`` body with quotes, and the size of each
    dimension: one pass, jumping from separator to separator with `find`."""
    tokens: list[bytes | None] = []
    append = tokens.append
    find = body.find
    first_close = [-1] * (ndim + 1)
    depth = 0
    i = 0
    n = len(body)
    d = delim[0]
    while i < n:
        c = body[i]
        if c == _LBRACE:
            depth += 1
            i += 1
        elif c == _RBRACE:
            if first_close[depth] < 0:
                first_close[depth] = len(tokens)
            depth -= 1
            i += 1
        elif c == d:
            i += 1
        else:
            if depth != ndim:
                raise ValueDecodeError(f"array text is not rectangular: {body[:200]!r}")
            if c == _QUOTE:
                j = find(b'"', i + 1)
                if j > 0 and find(b"\\", i + 1, j) < 0:
                    append(body[i + 1 : j])
                    i = j + 1
                else:
                    token, i = unquote(body, i)
                    append(token)
                continue
            j = find(delim, i)
            k = find(b"}", i)
            if j < 0 or 0 <= k < j:
                j = k
            if j < 0:
                raise ValueDecodeError(f"unterminated array text {body[:200]!r}")
            token = body[i:j]
            append(None if token == _NULL else token)
            i = j
    if depth != 0:
        raise ValueDecodeError(f"unbalanced braces in array text {body[:200]!r}")
    # first_close[k]: elements read when depth k first closed (the product of dims k..ndim).
    return tokens, _dims_from_counts([first_close[k] for k in range(ndim, 0, -1)])


_NOT_STRUCTURE: dict[bytes, bytes] = {}


def _not_structure(delim: bytes) -> bytes:
    """All bytes but braces and `delim`, to delete with `bytes.translate`."""
    table = _NOT_STRUCTURE.get(delim)
    if table is None:
        keep = b"{}" + delim
        table = _NOT_STRUCTURE[delim] = bytes(b for b in range(256) if b not in keep)
    return table


def _skeleton(dims: list[int], delim: bytes) -> bytes:
    """The braces and delimiters of a well-formed array text of shape `dims`."""
    text = b"{" + delim * (dims[-1] - 1) + b"}"
    for size in reversed(dims[:-1]):
        text = b"{" + delim.join([text] * size) + b"}"
    return text


def _dims_from_counts(counts: list[int]) -> list[int]:
    """Sizes (outermost first) from the element counts of the first sub-array of each depth,
    innermost first: [d_n, d_(n-1)*d_n, ..., total]."""
    dims = [counts[0]]
    for k in range(1, len(counts)):
        inner = counts[k - 1]
        if inner <= 0 or counts[k] % inner:
            raise ValueDecodeError("array text is not rectangular")
        dims.append(counts[k] // inner)
    dims.reverse()
    return dims


def parse_array_text(
    data: bytes,
    parse: Callable[[bytes], Any],
    delim: bytes = b",",
    text: bool = False,
    nested: bool = False,
) -> Any:
    """The value of an ``array_out`` text, each element read with `parse`. `text` says that
    `parse` is UTF-8 decoding: an array without quotes is then decoded and split in one go.
    `nested`: the elements are arrays (a multi-dimensional array is then a `PgArray`)."""
    lowers: list[int] | None = None
    sizes: list[int] | None = None
    try:
        if data[:1] == b"[":
            eq = data.index(b"=")
            sizes, lowers = _lower_bounds(data[:eq])
            data = data[eq + 1 :]
        if data[:1] != b"{" or data[-1:] != b"}":
            raise ValueDecodeError(f"invalid array text {data[:200]!r}")
        if data == b"{}":
            return []
        ndim = len(data) - len(data.lstrip(b"{"))
        values: list[Any]
        if b'"' in data:
            tokens, dims = _scan(data, delim, ndim)
            values = [None if t is None else parse(t) for t in tokens]
        else:
            dims = _plain_dims(data, delim, ndim)
            inner = data[1:-1] if ndim == 1 else data.replace(b"{", b"").replace(b"}", b"")
            if text:
                strings = inner.decode().split(delim.decode())
                if "" in strings:
                    raise ValueDecodeError(f"empty unquoted element in {data[:200]!r}")
                values = strings if "NULL" not in strings else [_none(s) for s in strings]
            else:
                parts = inner.split(delim)
                if b"" in parts:
                    raise ValueDecodeError(f"empty unquoted element in {data[:200]!r}")
                if _NULL in parts:
                    values = [None if p == _NULL else parse(p) for p in parts]
                else:
                    values = list(map(parse, parts))
    except (ValueError, IndexError) as exc:  # UnicodeDecodeError is a ValueError
        raise ValueDecodeError(f"invalid array text {data[:200]!r}: {exc}") from None
    if len(values) != prod(dims) or (sizes is not None and sizes != dims):
        raise ValueDecodeError(f"array text does not match its dimensions: {data[:200]!r}")
    if len(dims) > 1:
        values = _nest(values, dims)
        if nested:
            return PgArray(values, tuple(lowers or [1] * len(dims)))
    if lowers is not None and any(lb != 1 for lb in lowers):
        return PgArray(values, tuple(lowers))
    return values


def _none(text: str) -> str | None:
    return None if text == "NULL" else text


def parse_array_binary(
    data: bytes,
    parse: Callable[[bytes], Any],
    fixed: tuple[str, int] | None = None,
    nested: bool = False,
) -> Any:
    """The value of an ``array_send`` form, each element read with `parse`; `fixed` is the
    `struct` code and width of a fixed-width element type, for the no-NULL fast path.
    `nested`: the elements are arrays (a multi-dimensional array is then a `PgArray`)."""
    try:
        ndim, flags, _element_oid = _HEADER.unpack_from(data)
        if ndim == 0:
            if len(data) != 12:
                raise ValueDecodeError(f"empty array binary has {len(data) - 12} extra bytes")
            return []
        if not 0 < ndim <= 6 or flags not in (0, 1):
            raise ValueDecodeError(f"invalid array binary header: ndim {ndim}, flags {flags}")
        header = struct.unpack_from(f">{2 * ndim}i", data, 12)
    except struct.error as exc:
        raise ValueDecodeError(f"truncated array binary: {exc}") from None
    dims = header[0::2]
    lowers = header[1::2]
    count = prod(dims)
    pos = 12 + 8 * ndim
    values: list[Any]
    if fixed is not None and not flags and len(data) - pos == count * (4 + fixed[1]):
        pairs = struct.unpack_from(">" + ("i" + fixed[0]) * count, data, pos)
        if pairs[0::2].count(fixed[1]) != count:
            raise ValueDecodeError("array binary element of the wrong width")
        values = list(pairs[1::2])
    else:
        values = []
        append = values.append
        unpack = _INT32.unpack_from
        try:
            for _ in range(count):
                (length,) = unpack(data, pos)
                pos += 4
                if length < 0:
                    append(None)
                else:
                    end = pos + length
                    if end > len(data):
                        raise ValueDecodeError("array binary element runs past the end")
                    append(parse(data[pos:end]))
                    pos = end
        except struct.error:
            raise ValueDecodeError("truncated array binary") from None
        if pos != len(data):
            raise ValueDecodeError(f"array binary has {len(data) - pos} bytes after its elements")
    if ndim > 1:
        values = _nest(values, dims)
    if any(lb != 1 for lb in lowers) or (nested and ndim > 1):
        return PgArray(values, lowers)
    return values


def _fixed_layout(element: TypeCodec) -> tuple[str, int] | None:
    """The `struct` layout of `element` if its binary parser is a built-in fixed-width one
    (also true of a domain over it, which shares the parser)."""
    for oid, layout in _FIXED.items():
        builtin = DEFAULT_REGISTRY.codecs.get(oid)
        if builtin is not None and builtin.from_binary is element.from_binary:
            return layout
    return None


def _same_parser(element: TypeCodec, builtin_oid: int) -> bool:
    """Whether `element` reads text with the built-in type's parser (a domain over it does)."""
    builtin = DEFAULT_REGISTRY.codecs.get(builtin_oid)
    return builtin is not None and builtin.from_text is element.from_text


def array_codec(
    element: TypeCodec, oid: int | None = None, name: str | None = None, *, nested: bool = False
) -> TypeCodec:
    """The codec of the array type of `element` (by default its `array_oid`); `nested`: the
    element's values are arrays (it is a domain over an array type)."""
    array_oid = element.array_oid if oid is None else oid
    if array_oid is None:
        raise ValueError(f"type {element.name} has no array type")
    delim = element.delimiter.encode()
    text = _same_parser(element, 25)
    # int() and float() read what the built-in integer and float8 parsers read, minus a
    # Python call per element (their errors become ValueDecodeError in parse_array_text).
    parse = int if _same_parser(element, 23) else float if _same_parser(element, 701) else None
    from_text = partial(
        parse_array_text, parse=parse or element.from_text, delim=delim, text=text, nested=nested
    )
    binary: Callable[[bytes], Any] = element.from_binary or partial(UnknownBinary, element.oid)
    fixed = _fixed_layout(element)
    from_binary = partial(parse_array_binary, parse=binary, fixed=fixed, nested=nested)
    return TypeCodec(
        array_oid,
        name or f"{element.name}[]",
        from_text,
        from_binary,
        element_oid=element.oid,
        structure="array",
    )
