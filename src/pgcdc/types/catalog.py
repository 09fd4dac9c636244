"""Codecs for types only the database knows: enums, domains, composites, user range types, and
arrays of them, read from ``pg_type`` with `resolve`.

pgoutput's Relation message gives each column's type OID (a domain's own OID, not its base
type's); `resolve` takes the OIDs a registry does not know, reads them and every type they are
built on in one recursive query, and adds a codec for each:

* enum: the label, a ``str`` (text and binary forms are both the label's bytes);
* domain: its base type's codec (``typbasetype``, possibly an array or another domain);
* composite: a ``dict`` of attribute name to value, attributes in order (dropped ones are not
  sent); text ``(1,"a b",)`` (an empty field is NULL, ``""`` the empty string), binary an
  int32 field count, then per field its type OID, int32 length (-1 for NULL) and bytes;
* range and multirange types made with ``CREATE TYPE ... AS RANGE``;
* arrays of all of these (through the element's ``array_oid``, see `TypeRegistry.get`);
* any other type (e.g. an extension's base type): its text as a ``str``, and `UnknownBinary`
  in binary mode.

Codecs are built from the catalog as it is when `resolve` runs; a type altered later (an
attribute added, say) needs `resolve` again on a fresh registry.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, Protocol

from pgcdc.errors import ValueDecodeError
from pgcdc.types.arrays import array_codec, unquote
from pgcdc.types.ranges import multirange_codec, range_codec
from pgcdc.types.registry import TypeCodec, TypeRegistry, UnknownBinary

__all__ = ["composite_codec", "enum_codec", "resolve"]

_INT32 = struct.Struct(">i")
_FIELD = struct.Struct(">Ii")


class CatalogQuery(Protocol):
    """What `resolve` needs of a catalog (e.g. `pgcdc.decoding.catalog.Catalog`)."""

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]: ...


def _text(data: bytes) -> str:
    return data.decode()


def enum_codec(oid: int, name: str, *, array_oid: int | None = None) -> TypeCodec:
    """An enum: its label (``enum_send`` sends the label's text, too)."""
    return TypeCodec(oid, name, _text, _text, array_oid, structure="enum")


def _unknown_binary(oid: int) -> Callable[[bytes], Any]:
    """The binary parser of a type without one: its bytes, kept with the OID."""
    return lambda data: UnknownBinary(oid, data)


def composite_codec(
    oid: int,
    name: str,
    fields: Sequence[tuple[str, TypeCodec]],
    registry: TypeRegistry,
    *,
    array_oid: int | None = None,
    delimiter: str = ",",
) -> TypeCodec:
    """A composite type with attributes `fields` (name, codec) in order. In binary mode a field
    whose type OID differs from its codec's (the attribute's type was altered) is read with
    `registry`'s codec for the OID sent."""
    names = [f for f, _ in fields]
    text_parsers = [c.from_text for _, c in fields]
    binary_parsers: list[tuple[int, Callable[[bytes], Any]]] = [
        (c.oid, c.from_binary or _unknown_binary(c.oid)) for _, c in fields
    ]
    count = len(fields)

    def from_text(data: bytes) -> dict[str, Any]:
        if data[:1] != b"(" or data[-1:] != b")":
            raise ValueDecodeError(f"invalid {name} text {data[:200]!r}")
        end = len(data) - 1
        values: dict[str, Any] = {}
        i = 1
        find = data.find
        try:
            for k in range(count):
                if k:
                    if data[i] != 0x2C:  # ','
                        raise ValueDecodeError(f"{name} text has too few fields: {data[:200]!r}")
                    i += 1
                c = data[i]
                if c == 0x22:  # '"'
                    raw, i = unquote(data, i, doubled=True)
                    values[names[k]] = text_parsers[k](raw)
                elif c == 0x2C or i == end:  # an empty field is NULL
                    values[names[k]] = None
                else:
                    j = find(b",", i)
                    if j < 0 or j > end:
                        j = end
                    values[names[k]] = text_parsers[k](data[i:j])
                    i = j
        except IndexError:
            raise ValueDecodeError(f"truncated {name} text {data[:200]!r}") from None
        if i != end:
            raise ValueDecodeError(f"{name} text has more than {count} fields: {data[:200]!r}")
        return values

    def from_binary(data: bytes) -> dict[str, Any]:
        try:
            (sent,) = _INT32.unpack_from(data)
            if sent != count:
                raise ValueDecodeError(
                    f"{name} binary has {sent} fields, the catalog said {count} (type altered?)"
                )
            values: dict[str, Any] = {}
            pos = 4
            for k in range(count):
                type_oid, length = _FIELD.unpack_from(data, pos)
                pos += 8
                if length < 0:
                    values[names[k]] = None
                    continue
                expected, parse = binary_parsers[k]
                if type_oid != expected:
                    codec = registry.get(type_oid)
                    parse = codec.from_binary or _unknown_binary(type_oid)
                pos += length
                if pos > len(data):
                    raise ValueDecodeError(f"{name} binary field runs past the end")
                values[names[k]] = parse(data[pos - length : pos])
        except struct.error:
            raise ValueDecodeError(f"truncated {name} binary {data[:64].hex()}") from None
        if pos != len(data):
            raise ValueDecodeError(f"{name} binary has bytes after its fields")
        return values

    typed_fields = tuple((field_name, codec.oid) for field_name, codec in fields)
    return TypeCodec(
        oid,
        name,
        from_text,
        from_binary,
        array_oid,
        delimiter,
        extra={"fields": typed_fields},
        structure="composite",
    )


# The wanted types and, recursively, what they are built on: array elements (a true array is
# a base type output by array_out; a domain over one has the same typoutput), domain base
# types, range subtypes, a multirange's range, composite attributes. ``rngmultitypid`` (PG 14+)
# is read through to_jsonb so that the query also runs on older servers.
_TYPES_SQL = """
WITH RECURSIVE wanted(oid) AS (
    SELECT unnest(%s::pg_catalog.oid[])
  UNION
    SELECT dep.oid
    FROM wanted w
    JOIN pg_catalog.pg_type t ON t.oid = w.oid
    CROSS JOIN LATERAL (
        SELECT t.typelem
        WHERE t.typtype = 'b' AND t.typoutput = 'pg_catalog.array_out'::pg_catalog.regproc
      UNION ALL
        SELECT t.typbasetype WHERE t.typtype = 'd'
      UNION ALL
        SELECT r.rngsubtype FROM pg_catalog.pg_range r WHERE r.rngtypid = t.oid
      UNION ALL
        SELECT r.rngtypid FROM pg_catalog.pg_range r
        WHERE t.typtype = 'm' AND (pg_catalog.to_jsonb(r) ->> 'rngmultitypid')::oid = t.oid
      UNION ALL
        SELECT a.atttypid FROM pg_catalog.pg_attribute a
        WHERE t.typtype = 'c' AND a.attrelid = t.typrelid AND a.attnum > 0
          AND NOT a.attisdropped
    ) AS dep(oid)
)
SELECT t.oid::int8,
       pg_catalog.format_type(t.oid, NULL),
       t.typtype::text,
       t.typdelim::text,
       NULLIF(t.typarray, 0)::int8,
       CASE WHEN t.typtype = 'b' AND t.typoutput = 'pg_catalog.array_out'::pg_catalog.regproc
            THEN t.typelem::int8 END,
       NULLIF(t.typbasetype, 0)::int8,
       (SELECT r.rngsubtype::int8 FROM pg_catalog.pg_range r WHERE r.rngtypid = t.oid),
       (SELECT r.rngtypid::int8 FROM pg_catalog.pg_range r
        WHERE t.typtype = 'm' AND (pg_catalog.to_jsonb(r) ->> 'rngmultitypid')::oid = t.oid),
       ARRAY(SELECT a.attname::text FROM pg_catalog.pg_attribute a
             WHERE t.typtype = 'c' AND a.attrelid = t.typrelid AND a.attnum > 0
               AND NOT a.attisdropped ORDER BY a.attnum),
       ARRAY(SELECT a.atttypid::int8 FROM pg_catalog.pg_attribute a
             WHERE t.typtype = 'c' AND a.attrelid = t.typrelid AND a.attnum > 0
               AND NOT a.attisdropped ORDER BY a.attnum)
FROM wanted w
JOIN pg_catalog.pg_type t ON t.oid = w.oid
"""


def resolve(registry: TypeRegistry, catalog: CatalogQuery, oids: Iterable[int]) -> None:
    """Add to `registry` a codec for each of `oids` it does not know, and for the types they
    are built on, from one catalog query. OIDs not in ``pg_type`` are left to the registry's
    text fallback."""
    missing = sorted({oid for oid in oids if oid not in registry})
    if not missing:
        return
    rows = {row[0]: row for row in catalog.query(_TYPES_SQL, (missing,))}

    def build(oid: int) -> TypeCodec:
        if oid in registry or oid not in rows:
            return registry.get(oid)
        row = rows[oid]
        name, typtype, delim, array_oid = row[1:5]
        element, base, subtype, range_oid, attnames, atttypes = row[5:11]
        codec: TypeCodec
        if element is not None:  # an array type (array_out), of any element type
            element_codec = build(element)
            if oid in registry:  # derived from the element's array_oid
                return registry.get(oid)
            codec = array_codec(element_codec, oid, name)
        elif typtype == "d":
            codec = replace(
                build(base),
                oid=oid,
                name=name,
                array_oid=array_oid,
                delimiter=delim,
                element_oid=base,
                extra={},
                structure="domain",
            )
        elif typtype == "e":
            codec = enum_codec(oid, name, array_oid=array_oid)
        elif typtype == "c":
            fields = [(n, build(t)) for n, t in zip(attnames, atttypes, strict=True)]
            codec = composite_codec(
                oid, name, fields, registry, array_oid=array_oid, delimiter=delim
            )
        elif typtype == "r" and subtype is not None:
            build(subtype)
            codec = range_codec(oid, name, subtype, registry, array_oid=array_oid)
        elif typtype == "m" and range_oid is not None:
            build(range_oid)
            subtype = registry.get(range_oid).element_oid
            if subtype is None:
                codec = TypeCodec(oid, name, _text, None, array_oid, delim, structure="unknown")
            else:
                codec = multirange_codec(
                    oid, name, subtype, range_oid, registry, array_oid=array_oid
                )
        else:  # a base type nobody registered: its text, UnknownBinary in binary mode
            codec = TypeCodec(oid, name, _text, None, array_oid, delim, structure="unknown")
        return registry.add(codec)

    for oid in missing:
        build(oid)
