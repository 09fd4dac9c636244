"""Codecs for types only the database knows: enums, domains, composites, user range types, and
arrays of them, described by ``pg_type`` rows.

pgoutput's Relation message gives each column's type OID (a domain's own OID, not its base
type's). `describe_types` reads the OIDs asked for and every type they are built on in one
recursive query into `TypeDescription`s: plain data keyed by OID (the pg_type row and what the
codec depends on: enum labels, composite attributes, domain base types, range subtypes, array
elements). They are read once, where a catalog is at hand (the pipeline's driver), and travel
as data to wherever values are typed (a Spark task never reaches for a catalog);
`TypeDescriptions.registry` builds the codecs from them, each one:

* enum: the label, a ``str`` (text and binary forms are both the label's bytes);
* domain: its base type's codec (``typbasetype``, possibly an array or another domain);
* composite: a ``dict`` of attribute name to value, attributes in order (dropped ones are not
  sent); text ``(1,"a b",)`` (an empty field is NULL, ``""`` the empty string), binary an
  int32 field count, then per field its type OID, int32 length (-1 for NULL) and bytes;
* range and multirange types made with ``CREATE TYPE ... AS RANGE``;
* arrays of all of these (through the element's ``array_oid``, see `TypeRegistry.get`);
* any other type (e.g. an extension's base type): its text as a ``str``, and `UnknownBinary`
  in binary mode.

Descriptions are the catalog as it was when they were read; a composite type altered later
(an attribute added, say) is described again by `TypeCatalog`, and a value printed before the
change still reads (`composite_codec`); one that does not fit is a `StaleType`. `resolve` adds
what a registry lacks straight from a catalog.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from pgcdc.errors import ValueDecodeError
from pgcdc.types.arrays import array_codec, unquote
from pgcdc.types.ranges import multirange_codec, range_codec
from pgcdc.types.registry import TypeCodec, TypeRegistry, UnknownBinary

__all__ = [
    "CompositeField",
    "StaleType",
    "TypeCatalog",
    "TypeDescription",
    "TypeDescriptions",
    "add_descriptions",
    "composite_codec",
    "describe_types",
    "enum_codec",
    "resolve",
]

_INT32 = struct.Struct(">i")
_FIELD = struct.Struct(">Ii")


class CatalogQuery(Protocol):
    """What `resolve` needs of a catalog (e.g. `pgcdc.decoding.catalog.Catalog`)."""

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]: ...


class StaleType(ValueDecodeError):
    """A value does not fit its type's description: the type was altered since it was read
    (an attribute added to or dropped from a composite, say). Describing it again mends it."""

    def __init__(self, message: str, type_oid: int) -> None:
        super().__init__(message)
        self.type_oid = type_oid

    def __reduce__(self) -> Any:
        return (type(self), (str(self), self.type_oid))


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
    dropped: Sequence[int] = (),
) -> TypeCodec:
    """A composite type with attributes `fields` (name, codec) in order. In binary mode a field
    whose type OID differs from its codec's (the attribute's type was altered) is read with
    `registry`'s codec for the OID sent.

    A value printed before the type was altered has another number of fields: fewer when
    attributes were added since (``ADD ATTRIBUTE`` appends; the others are NULL, as the
    server reads such a stored value), more when some were dropped since: `dropped` are
    their places among all the attributes (dropped ones included, in attnum order), and
    their values are left out. Any other count is a `StaleType`: the description is older
    than the value."""
    names = [f for f, _ in fields]
    text_parsers = [c.from_text for _, c in fields]
    binary_parsers: list[tuple[int, Callable[[bytes], Any]]] = [
        (c.oid, c.from_binary or _unknown_binary(c.oid)) for _, c in fields
    ]
    count = len(fields)
    every = count + len(dropped)
    #: Per field of a value with every attribute: its place among the live ones (None: gone).
    places: list[int | None] = []
    for position in range(every):
        places.append(
            None if position in dropped else position - sum(d < position for d in dropped)
        )

    def layout(sent: int, data: bytes) -> list[int | None]:
        """For each field of a value with `sent` fields, the live attribute it is."""
        if sent <= count:
            return list(range(sent))
        if dropped and sent == every:
            return places
        raise StaleType(
            f"{name} value has {sent} fields, the catalog says {count}: {data[:200]!r}", oid
        )

    def from_text(data: bytes) -> dict[str, Any]:
        if data[:1] != b"(" or data[-1:] != b")":
            raise ValueDecodeError(f"invalid {name} text {data[:200]!r}")
        end = len(data) - 1
        if not count and not dropped and end == 1:
            return {}  # a type without attributes: "()"
        raws: list[bytes | None] = []
        i = 1
        find = data.find
        try:
            while True:
                c = data[i]
                if c == 0x22:  # '"'
                    raw, i = unquote(data, i, doubled=True)
                    raws.append(raw)
                elif c == 0x2C or i == end:  # an empty field is NULL
                    raws.append(None)
                else:
                    j = find(b",", i)
                    if j < 0 or j > end:
                        j = end
                    raws.append(data[i:j])
                    i = j
                if i == end:
                    break
                if data[i] != 0x2C:  # ','
                    raise ValueDecodeError(f"invalid {name} text {data[:200]!r}")
                i += 1
        except IndexError:
            raise ValueDecodeError(f"truncated {name} text {data[:200]!r}") from None
        values: dict[str, Any] = dict.fromkeys(names)
        for cell, k in zip(raws, layout(len(raws), data), strict=True):
            if k is not None and cell is not None:
                values[names[k]] = text_parsers[k](cell)
        return values

    def from_binary(data: bytes) -> dict[str, Any]:
        try:
            (sent,) = _INT32.unpack_from(data)
            values: dict[str, Any] = dict.fromkeys(names)
            pos = 4
            for k in layout(sent, data):
                type_oid, length = _FIELD.unpack_from(data, pos)
                pos += 8
                if length < 0:
                    continue
                pos += length
                if pos > len(data):
                    raise ValueDecodeError(f"{name} binary field runs past the end")
                if k is None:
                    continue
                expected, parse = binary_parsers[k]
                if type_oid != expected:
                    codec = registry.get(type_oid)
                    parse = codec.from_binary or _unknown_binary(type_oid)
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
       t.typtypmod,
       (SELECT r.rngsubtype::int8 FROM pg_catalog.pg_range r WHERE r.rngtypid = t.oid),
       (SELECT r.rngtypid::int8 FROM pg_catalog.pg_range r
        WHERE t.typtype = 'm' AND (pg_catalog.to_jsonb(r) ->> 'rngmultitypid')::oid = t.oid),
       ARRAY(SELECT ARRAY[a.attnum::text, a.attname::text, a.atttypid::text, a.atttypmod::text,
                          a.attisdropped::text]
             FROM pg_catalog.pg_attribute a
             WHERE t.typtype = 'c' AND a.attrelid = t.typrelid AND a.attnum > 0
             ORDER BY a.attnum),
       ARRAY(SELECT e.enumlabel::text FROM pg_catalog.pg_enum e
             WHERE t.typtype = 'e' AND e.enumtypid = t.oid ORDER BY e.enumsortorder)
FROM wanted w
JOIN pg_catalog.pg_type t ON t.oid = w.oid
"""


@dataclass(frozen=True, slots=True)
class CompositeField:
    """One attribute of a composite type, as ``pg_attribute`` has it (a dropped one too: the
    values printed before it was dropped have it)."""

    attnum: int
    name: str
    type_oid: int
    type_modifier: int = -1
    dropped: bool = False


@dataclass(frozen=True, slots=True)
class TypeDescription:
    """What typing a value of one type needs to know of it: its ``pg_type`` row and what its
    values are made of (plain data: it pickles, compares and hashes)."""

    oid: int
    #: ``format_type(oid, NULL)``: schema-qualified where the search path needs it.
    name: str
    #: ``typtype``: b(ase), c(omposite), d(omain), e(num), m(ultirange), p(seudo), r(ange).
    typtype: str
    delimiter: str = ","
    array_oid: int | None = None
    #: An array type's element (a base type output by ``array_out``).
    element_oid: int | None = None
    #: A domain's base type and its type modifier.
    base_oid: int | None = None
    base_modifier: int = -1
    #: A range's subtype; a multirange's range type.
    subtype_oid: int | None = None
    range_oid: int | None = None
    fields: tuple[CompositeField, ...] = ()
    labels: tuple[str, ...] = ()

    @property
    def depends_on(self) -> tuple[int, ...]:
        """The OIDs this type's values are built of."""
        found = (self.element_oid, self.base_oid, self.subtype_oid, self.range_oid)
        attributes = tuple(f.type_oid for f in self.fields if not f.dropped)
        return tuple(o for o in found if o is not None) + attributes


def describe_types(catalog: CatalogQuery, oids: Iterable[int]) -> dict[int, TypeDescription]:
    """`oids` and every type they are built on, described from one catalog query (OIDs not
    in ``pg_type`` are left out: the registry's text fallback types them)."""
    wanted = sorted(set(oids))
    if not wanted:
        return {}
    found = {}
    for row in catalog.query(_TYPES_SQL, (wanted,)):
        oid, name, typtype, delimiter, array_oid, element, base, base_mod = row[:8]
        subtype, range_oid, attributes, labels = row[8:12]
        found[oid] = TypeDescription(
            oid,
            name,
            typtype,
            delimiter,
            array_oid,
            element,
            base,
            -1 if base_mod is None else int(base_mod),
            subtype,
            range_oid,
            tuple(
                CompositeField(int(n), a, int(t), int(m), dropped == "true")
                for n, a, t, m, dropped in attributes or ()
            ),
            tuple(labels or ()),
        )
    return found


class TypeDescriptions(Mapping[int, TypeDescription]):
    """Type descriptions by OID (immutable; pickles as plain data). `registry` gives the codecs
    of the built-in types plus these, built once per distinct set of descriptions."""

    __slots__ = ("_by_oid", "_key")

    def __init__(self, descriptions: Iterable[TypeDescription] = ()) -> None:
        self._by_oid = {d.oid: d for d in descriptions}
        self._key = frozenset(self._by_oid.values())

    def __getitem__(self, oid: int) -> TypeDescription:
        return self._by_oid[oid]

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_oid)

    def __len__(self) -> int:
        return len(self._by_oid)

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TypeDescriptions) and self._key == other._key

    def __reduce__(self) -> Any:
        return (TypeDescriptions, (tuple(self._by_oid.values()),))

    def __repr__(self) -> str:
        return f"TypeDescriptions({sorted(self._by_oid)})"

    def closure(self, oids: Iterable[int]) -> TypeDescriptions:
        """The descriptions `oids` need: theirs and, recursively, their dependencies'."""
        seen: dict[int, TypeDescription] = {}
        stack = list(oids)
        while stack:
            oid = stack.pop()
            if oid in seen or oid not in self._by_oid:
                continue
            description = seen[oid] = self._by_oid[oid]
            stack.extend(description.depends_on)
            if description.array_oid is not None:
                stack.append(description.array_oid)
        return TypeDescriptions(seen.values())

    def merged(self, other: Iterable[TypeDescription]) -> TypeDescriptions:
        """These with `other`'s (which win where both describe an OID)."""
        return TypeDescriptions([*self._by_oid.values(), *other])

    def registry(self) -> TypeRegistry:
        """A registry with the built-in types and a codec for each description (cached: the
        same descriptions give the same registry, which must not be changed)."""
        return _registry(self)


@functools.lru_cache(maxsize=64)
def _registry(descriptions: TypeDescriptions) -> TypeRegistry:
    from pgcdc.types.registry import DEFAULT_REGISTRY

    registry = DEFAULT_REGISTRY.copy()
    add_descriptions(registry, descriptions)
    return registry


def add_descriptions(registry: TypeRegistry, descriptions: Mapping[int, TypeDescription]) -> None:
    """Add a codec for each described type `registry` does not know (and for the described
    types it is built on)."""

    def build(oid: int) -> TypeCodec:
        if oid in registry or oid not in descriptions:
            return registry.get(oid)
        d = descriptions[oid]
        name, delim, array_oid = d.name, d.delimiter, d.array_oid
        codec: TypeCodec
        if d.element_oid is not None:  # an array type (array_out), of any element type
            element_codec = build(d.element_oid)
            if oid in registry:  # derived from the element's array_oid
                return registry.get(oid)
            codec = array_codec(
                element_codec, oid, name, nested=registry.holds_arrays(d.element_oid)
            )
        elif d.typtype == "d" and d.base_oid is not None:
            codec = replace(
                build(d.base_oid),
                oid=oid,
                name=name,
                array_oid=array_oid,
                delimiter=delim,
                element_oid=d.base_oid,
                extra={},
                structure="domain",
            )
        elif d.typtype == "e":
            codec = enum_codec(oid, name, array_oid=array_oid)
        elif d.typtype == "c":
            fields = [(f.name, build(f.type_oid)) for f in d.fields if not f.dropped]
            dropped = [i for i, f in enumerate(d.fields) if f.dropped]
            codec = composite_codec(
                oid, name, fields, registry, array_oid=array_oid, delimiter=delim, dropped=dropped
            )
        elif d.typtype == "r" and d.subtype_oid is not None:
            build(d.subtype_oid)
            codec = range_codec(oid, name, d.subtype_oid, registry, array_oid=array_oid)
        elif d.typtype == "m" and d.range_oid is not None:
            build(d.range_oid)
            subtype = registry.get(d.range_oid).element_oid
            if subtype is None:
                codec = TypeCodec(oid, name, _text, None, array_oid, delim, structure="unknown")
            else:
                codec = multirange_codec(
                    oid, name, subtype, d.range_oid, registry, array_oid=array_oid
                )
        else:  # a base type nobody registered: its text, UnknownBinary in binary mode
            codec = TypeCodec(oid, name, _text, None, array_oid, delim, structure="unknown")
        return registry.add(codec)

    for oid in sorted(descriptions):
        build(oid)


def resolve(registry: TypeRegistry, catalog: CatalogQuery, oids: Iterable[int]) -> None:
    """Add to `registry` a codec for each of `oids` it does not know, and for the types they
    are built on, from one catalog query. OIDs not in ``pg_type`` are left to the registry's
    text fallback."""
    missing = [oid for oid in set(oids) if oid not in registry]
    add_descriptions(registry, describe_types(catalog, missing))


class TypeCatalog:
    """The descriptions of the types a pipeline has met, read from `catalog` on first need and
    again when one turns out stale (`refresh`); `registry` holds their codecs too, on top of
    those of the types that need no description (the built-in ones, or the given registry's,
    which is copied)."""

    def __init__(self, catalog: CatalogQuery, registry: TypeRegistry | None = None) -> None:
        from pgcdc.types.registry import DEFAULT_REGISTRY

        self.catalog = catalog
        #: The types that need no description (the built-in ones).
        self.builtin = (registry if registry is not None else DEFAULT_REGISTRY).copy()
        self.registry = self.builtin.copy()
        self.known = TypeDescriptions()

    def describe(self, oids: Iterable[int]) -> TypeDescriptions:
        """The descriptions `oids` need (built-in types need none), read if not known yet.
        Composite types are read again each time (``ALTER TYPE … ADD ATTRIBUTE`` sends
        nothing a stream sees): the descriptions are never older than the values typed.

        An OID is looked for in the descriptions, never in `registry`: that one also knows
        the array type of every described type (`TypeRegistry.get` derives it from the
        element's ``typarray``), yet the descriptions lack it until it is read, and a task
        typing with them alone would take such an array for an unknown type (its text)."""
        wanted = set(oids)
        missing = [o for o in wanted if o not in self.known and o not in self.builtin]
        if missing:
            self._learn(describe_types(self.catalog, missing))
        found = self.known.closure(wanted)
        composites = [d.oid for d in found.values() if d.typtype == "c"]
        if composites:
            fresh = describe_types(self.catalog, composites)
            if any(self.known.get(oid) != d for oid, d in fresh.items()):
                self._rebuild(fresh)
                found = self.known.closure(wanted)
        return found

    def _rebuild(self, fresh: dict[int, TypeDescription]) -> None:
        """Take `fresh` descriptions; the registry is built anew (types built on them, a
        domain or an array, change too)."""
        self.known = self.known.merged(fresh.values())
        self.registry = self.builtin.copy()
        add_descriptions(self.registry, self.known)

    def _learn(self, found: dict[int, TypeDescription]) -> None:
        self.known = self.known.merged(found.values())
        add_descriptions(self.registry, found)
