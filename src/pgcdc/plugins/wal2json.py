"""The ``wal2json`` output plugin (format versions 1 and 2), rewritten in Python on pgoutput.

The output is meant to be the server plugin's (wal2json 2.5), byte for byte, so that consumers
written against wal2json keep working; ``tests/plugins/test_wal2json.py`` holds it against the
real plugin. Options are wal2json's: ``format-version`` (1, the default, or 2),
``include-transaction`` (v2), ``include-xids``, ``include-timestamp``, ``include-lsn``,
``include-origin``, ``include-schemas``, ``include-types``, ``include-typmod`` (v1),
``include-type-oids``, ``include-domain-data-type``, ``include-column-positions``,
``include-not-null``, ``include-default``, ``include-pk``, ``pretty-print`` (v1),
``write-in-chunks`` (v1), ``actions``, ``filter-tables``, ``add-tables``, ``filter-origins``,
``filter-msg-prefixes`` and ``add-msg-prefixes``. ``include-unchanged-toast`` is refused as
deprecated, anything else as ``option "NAME" = "VALUE" is unknown``, as the server does.

Options are read as wal2json reads them, refusals worded as the server words them: booleans
by the server's ``parse_bool`` (``-o include-xids`` alone is true; ``' 1'`` is refused),
``format-version`` by its ``parse_int`` (``0x2``, ``1.5`` and ``' 2 '`` are 2), lists split
at commas as wal2json splits them (``filter-origins`` ids as ``atoi`` reads them, an empty
item being 0).

Values are the text pgoutput sends (output functions run by the walsender under pgcdc's pinned
DateStyle ISO, TimeZone UTC, IntervalStyle postgres, extra_float_digits 3, bytea_output hex);
wal2json types them by column type: int2/int4/int8/oid/float4/float8/numeric unquoted (NaN and
+-Infinity become ``null``), bool as ``true``/``false``, bytea as its hex digits without
``\\x``, NULL as ``null``, anything else (domains over numbers too) as a JSON string. Unchanged
TOASTed columns are left out of the row, as wal2json does. Timestamps are the server's
``timestamptz_to_str`` in a UTC session over the whole int64 range (``+00``, `` BC``, years
past 9999, ``infinity``). Column defaults are ``pg_get_expr`` run in a catalog session with the
same pinned settings, so a default's literals read as the server prints them in pgcdc's
walsender session. Replica identity comes from the Relation message's key flags (the
server's ``rd_replidindex``): v1 ``oldkeys`` leaves out NULLs, v2 ``identity`` does not;
without an old tuple an UPDATE's identity is taken from the new row. The output is bytes:
message content that is not UTF-8 is written as it came, as the server writes it.

wal2json 2.5's quirks are kept, since consumers parse them: v2 always prints typmods
(``include-typmod`` only acts on v1); v1 prints ``pk`` only for replica identity DEFAULT, v2
for any table with a primary key; v1 ``include-not-null`` without ``include-types`` prints
``"columnoptionals":[]``; defaults are written unescaped (a default with a double quote or a
backslash gives invalid JSON there too); TRUNCATE has no v1 output; type names that
``format_type`` quoted are not escaped again; v1's change counter lives for the session and
only a begin resets it, so a non-transactional message right after a transaction of two or
more changes is ``{"change":[,{...}]}`` (invalid JSON, as the server writes it); message
content ends at its first NUL byte.

Where the output cannot match, because pgoutput does not carry what wal2json sees:

- empty transactions (DDL only, or only changes pgoutput does not publish): pgoutput on 15+
  sends nothing, wal2json writes ``{"action":"B"}``/``{"action":"C"}`` or ``{"change":[]}``;
  such a transaction also resets v1's change counter, so the comma of a non-transactional
  message that follows it can differ too;
- changes of tables outside the publication (use ``FOR ALL TABLES`` to see what wal2json sees),
  and generated columns (pgoutput before 18 does not send them, wal2json prints them);
- type names, not-null flags, defaults, column positions, primary keys of tables whose replica
  identity is not DEFAULT, and origin ids come from the current catalog, not from the historic
  snapshot of the change;
- non-transactional messages are never filtered by origin (pgoutput does not say theirs);
- pgoutput's Begin does not carry the transaction's end LSN, so with ``include-lsn`` (v2 with
  ``include-transaction``, v1 with ``write-in-chunks``) a transaction's writes are held until
  its commit; the text is the same, only later.

Nor can an option value that ends in a lone backslash: wal2json reads past the end of its
string there.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from pgcdc.decoding import (
    Change,
    ChangeAction,
    DecodingContext,
    OutputPlugin,
    OutputPluginOptions,
    OutputType,
    Transaction,
    Truncation,
)
from pgcdc.errors import PluginError, PluginOptionError
from pgcdc.plugins.pgtext import timestamptz_to_str
from pgcdc.protocol import Lsn, Relation, TupleData

__all__ = ["SelectTable", "Wal2Json", "parse_select_tables", "split_list"]

log = logging.getLogger("pgcdc.plugins.wal2json")

_BOOLOID, _BYTEAOID = 16, 17
_NUMBERS = frozenset({20, 21, 23, 26, 700, 701, 1700})  # int8 int2 int4 oid float4 float8 numeric
_NUMBER_CHARS = frozenset("0123456789+-eE.")
_SPECIAL_NUMBERS = ("nan", "infinity", "-infinity")
_SPACE = " \t\n\v\f\r"  # C isspace() in the C locale
_TAG_N, _TAG_U, _TAG_T = 0x6E, 0x75, 0x74  # TupleData kinds n, u, t
_ACTIONS = ("insert", "update", "delete", "truncate")
_BOOL_OPTIONS = {
    "include-transaction": "include_transaction",
    "include-xids": "include_xids",
    "include-timestamp": "include_timestamp",
    "include-pk": "include_pk",
    "include-origin": "include_origin",
    "include-schemas": "include_schemas",
    "include-types": "include_types",
    "include-type-oids": "include_type_oids",
    "include-typmod": "include_typmod",
    "include-domain-data-type": "include_domain_data_type",
    "include-column-positions": "include_column_positions",
    "include-not-null": "include_not_null",
    "include-default": "include_default",
    "pretty-print": "pretty_print",
    "write-in-chunks": "write_in_chunks",
    "include-lsn": "include_lsn",
}


# -- option parsing ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SelectTable:
    """One ``schema.table`` of filter-tables/add-tables; ``*`` for either part means any."""

    schema: str
    table: str
    all_schemas: bool = False
    all_tables: bool = False

    def matches(self, schema: str, table: str) -> bool:
        return (self.all_schemas or self.schema == schema) and (
            self.all_tables or self.table == table
        )


def split_list(raw: str) -> list[str] | None:
    """wal2json's list syntax: names separated by commas and optional whitespace; a backslash
    keeps the next character in the name (and stays in it). None when the syntax is wrong."""
    return _split(raw, allow_empty=False)


def _split(raw: str, *, allow_empty: bool) -> list[str] | None:
    """`split_list`; with `allow_empty`, an empty item is one too (wal2json's origin list:
    ``1,,2`` is 1, 0 and 2)."""
    items: list[str] = []
    i, n = 0, len(raw)
    while i < n and raw[i] in _SPACE:
        i += 1
    if i == n:
        return items  # an empty string is an empty list
    while True:
        start = i
        while i < n and raw[i] != "," and raw[i] not in _SPACE:
            if raw[i] == "\\":
                i += 1
            i += 1
        i = min(i, n)
        end = i
        if start == end and not allow_empty:
            return None  # empty name
        while i < n and raw[i] in _SPACE:
            i += 1
        items.append(raw[start:end])
        if i == n:
            return items
        if raw[i] != ",":
            return None
        i += 1
        while i < n and raw[i] in _SPACE:
            i += 1


def _unescape(text: str) -> str:
    """Drop each backslash, keeping the character after it."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "\\":
            i += 1
            if i == len(text):
                break
        out.append(text[i])
        i += 1
    return "".join(out)


def parse_select_tables(raw: str) -> list[SelectTable] | None:
    """filter-tables/add-tables: ``schema.table`` items, ``*`` as either part for any, ``\\``
    escaping ``.``, ``,``, spaces and ``*``. None when the syntax is wrong (no schema)."""
    names = split_list(raw)
    if names is None:
        return None
    tables: list[SelectTable] = []
    for name in names:
        all_schemas = name.startswith("*.")
        i = 0
        while i < len(name) and name[i] != ".":
            i += 2 if name[i] == "\\" else 1
        if i >= len(name):
            return None  # no separator: the schema is required
        table_raw = name[i + 1 :]
        tables.append(
            SelectTable(_unescape(name[:i]), _unescape(table_raw), all_schemas, table_raw == "*")
        )
    return tables


def _parse_int(name: str, value: str) -> int:
    """The server's ``parse_int`` for a setting without units: ``strtol`` (base 0: ``0x``
    hex, a leading ``0`` octal), or ``strtod`` when that stops at ``.``, ``e``, ``E`` or
    overflows; then only whitespace; the double rounded half to even into the int range."""
    number: float
    number, end, overflow = _strtol(value)
    if value[end : end + 1] in (".", "e", "E") or overflow:
        number, end, overflow = _strtod(value)
    if end == 0 or overflow:
        raise _unparsable(name, value)
    if value[end:].strip(_SPACE):
        raise _unparsable(name, value)  # trailing text: this setting takes no unit
    number = round(number)  # rint(): half to even, as round() does
    if not _INT_MIN <= number <= _INT_MAX:
        raise _unparsable(name, value)
    return int(number)


_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_DIGITS = {8: "01234567", 10: "0123456789", 16: "0123456789abcdefABCDEF"}
_DECIMAL_FLOAT = re.compile(r"([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_HEX_FLOAT = re.compile(r"0[xX]([0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)([pP][+-]?[0-9]+)?")
_SMALLEST_NORMAL = 2.2250738585072014e-308


def _sign(text: str, i: int) -> tuple[int, int]:
    """Skip C whitespace and an optional sign at `i`: (-1 or 1, where the number starts)."""
    while i < len(text) and text[i] in _SPACE:
        i += 1
    if text[i : i + 1] in ("+", "-"):
        return (-1 if text[i] == "-" else 1), i + 1
    return 1, i


def _strtol(text: str, base: int = 0) -> tuple[int, int, bool]:
    """C's ``strtol`` for a 64-bit long: (value, index after the number or 0 when there is
    none, overflowed)."""
    sign, i = _sign(text, 0)
    if base == 0:
        after_prefix = text[i + 2 : i + 3]
        if text[i : i + 2] in ("0x", "0X") and after_prefix and after_prefix in _DIGITS[16]:
            base, i = 16, i + 2
        else:
            base = 8 if text[i : i + 1] == "0" else 10
    digits = _DIGITS[base]
    end = i
    while end < len(text) and text[end] in digits:
        end += 1
    if end == i:
        return 0, 0, False
    value = sign * int(text[i:end], base)
    if not _LONG_MIN <= value <= _LONG_MAX:
        return (_LONG_MAX if value > 0 else _LONG_MIN), end, True
    return value, end, False


def _strtod(text: str) -> tuple[float, int, bool]:
    """C's ``strtod`` for decimal and hexadecimal numbers: (value, index after it or 0 when
    there is none, ERANGE: overflow, or an inexact result below the smallest normal double).
    C's also reads ``inf`` and ``nan``, which `_parse_int` refuses either way; this does not."""
    sign, i = _sign(text, 0)
    match = _HEX_FLOAT.match(text, i)
    hexadecimal = match is not None
    if match is None:
        match = _DECIMAL_FLOAT.match(text, i)
        if match is None:
            return 0.0, 0, False
    number = match.group(0)
    try:
        value = float.fromhex(number) if hexadecimal else float(number)
    except OverflowError:
        value = math.inf
    if math.isinf(value):
        return sign * value, match.end(), True
    tiny = False
    if value == 0.0:  # underflow to zero, unless every digit is zero
        tiny = any(c not in "0." for c in match.group(1))
    elif value < _SMALLEST_NORMAL:  # subnormal: the exponent is small, so exact is cheap
        tiny = Fraction(value) != _exact(match, hexadecimal)
    return sign * value, match.end(), tiny


def _exact(match: re.Match[str], hexadecimal: bool) -> Fraction:
    """The exact value of a number `_strtod` matched."""
    if not hexadecimal:
        return Fraction(match.group(0))
    whole, _, fraction = match.group(1).partition(".")
    exponent = int(match.group(2)[1:]) if match.group(2) else 0
    return Fraction(int(whole + fraction, 16)) * Fraction(2) ** (exponent - 4 * len(fraction))


@dataclass(slots=True)
class _Settings:
    format_version: int = 1
    include_transaction: bool = True
    include_xids: bool = False
    include_timestamp: bool = False
    include_origin: bool = False
    include_schemas: bool = True
    include_types: bool = True
    include_type_oids: bool = False
    include_typmod: bool = True
    include_domain_data_type: bool = False
    include_column_positions: bool = False
    include_not_null: bool = False
    include_default: bool = False
    include_pk: bool = False
    pretty_print: bool = False
    write_in_chunks: bool = False
    include_lsn: bool = False
    actions: frozenset[str] = frozenset(_ACTIONS)
    filter_origins: frozenset[int] = frozenset()
    filter_tables: tuple[SelectTable, ...] = ()
    add_tables: tuple[SelectTable, ...] = (SelectTable("", "", True, True),)
    filter_msg_prefixes: tuple[str, ...] = ()
    add_msg_prefixes: tuple[str, ...] = ()

    @classmethod
    def parse(cls, ctx: DecodingContext) -> _Settings:
        s = cls()
        for name, value in ctx.options.items():
            if name in _BOOL_OPTIONS:
                setattr(s, _BOOL_OPTIONS[name], ctx.bool_option(name, True))
            elif name == "include-unchanged-toast":
                raise PluginOptionError(f'parameter "{name}" was deprecated')
            elif name == "format-version":
                s.format_version = 2 if value is None else _parse_int(name, value)
                if s.format_version > 2:
                    raise PluginOptionError(
                        f"client sent format_version={s.format_version} "
                        "but we only support format 2 or lower"
                    )
                if s.format_version < 1:
                    raise PluginOptionError(
                        f"client sent format_version={s.format_version} "
                        "but we only support format 1 or higher"
                    )
            elif name == "actions":
                if value is not None:
                    s.actions = _parse_actions(name, value)
            elif name == "filter-origins":
                s.filter_origins = frozenset(_parse_oids(name, value)) if value else frozenset()
            elif name in _LIST_OPTIONS:
                parse = parse_select_tables if name.endswith("tables") else split_list
                items = parse(value) if value is not None else []
                if items is None:
                    raise _unparsable(name, value)
                setattr(s, _LIST_OPTIONS[name], tuple(items))
            else:
                shown = "(null)" if value is None else value
                raise PluginOptionError(f'option "{name}" = "{shown}" is unknown')
        return s


#: List-valued options and the settings they fill.
_LIST_OPTIONS = {
    "filter-tables": "filter_tables",
    "add-tables": "add_tables",
    "filter-msg-prefixes": "filter_msg_prefixes",
    "add-msg-prefixes": "add_msg_prefixes",
}


def _unparsable(name: str, value: str | None) -> PluginOptionError:
    return PluginOptionError(f'could not parse value "{value}" for parameter "{name}"')


def _parse_actions(name: str, value: str) -> frozenset[str]:
    items = split_list(value)
    if items is None:
        raise _unparsable(name, value)
    for item in items:
        if item not in _ACTIONS:
            raise _unparsable(name, item)
    return frozenset(items)


def _parse_oids(name: str, value: str) -> list[int]:
    """filter-origins: origin ids as ``(Oid) atoi()`` reads them: garbage counts as 0, and
    so does an empty item."""
    items = _split(value, allow_empty=True)
    if items is None:
        raise _unparsable(name, value)
    return [_strtol(item, 10)[0] & 0xFFFFFFFF for item in items]


# -- formatting helpers ------------------------------------------------------------------------


def _quote(text: str) -> str:
    """The server's escape_json: the same escapes as Python's JSON encoder without ASCII-only."""
    return json.dumps(text, ensure_ascii=False)


def _type_label(type_str: str, array_check: bool = True) -> str:
    """A type name as wal2json writes it: as-is when format_type quoted it (the quotes serve
    as the JSON string's), unless it is an array of a quoted name; escaped otherwise."""
    if type_str.startswith('"') and not (array_check and type_str.endswith("]")):
        return type_str
    return _quote(type_str)


def _value(type_oid: int, raw: bytes | None) -> str:
    """A column value typed as wal2json types it."""
    if raw is None:
        return "null"
    text = raw.decode("utf-8", "surrogateescape")
    if type_oid in _NUMBERS:
        if text[:9].lower().startswith(_SPECIAL_NUMBERS):
            return "null"  # NaN and Infinity are not JSON
        if all(ch in _NUMBER_CHARS for ch in text):
            return text
        raise PluginError(f"{text} is not a number")
    if type_oid == _BOOLOID:
        return "true" if text == "t" else "false"
    if type_oid == _BYTEAOID:
        return _quote(text[2:])  # "\x0102" -> "0102"
    return _quote(text)


# -- catalog lookups ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Attr:
    attnum: int
    notnull: bool
    #: ``"expr"`` as wal2json writes a default (unescaped), or ``null``.
    default: str
    in_pk: bool


@dataclass(frozen=True, slots=True)
class _TypeInfo:
    typname: str
    is_domain: bool
    basetype: int
    basetypmod: int


_ATTRS_SQL = """
SELECT a.attname, a.attnum, a.attnotnull,
       CASE WHEN a.atthasdef AND a.attgenerated = '' THEN
            coalesce('"' || pg_catalog.pg_get_expr(d.adbin, d.adrelid) || '"', 'null')
       ELSE 'null' END,
       EXISTS (SELECT 1 FROM pg_catalog.pg_index i
                WHERE i.indrelid = a.attrelid AND i.indisprimary AND i.indisvalid
                  AND i.indimmediate
                  AND a.attnum IN (SELECT i.indkey[k]
                                     FROM generate_series(0, i.indnkeyatts - 1) AS k))
  FROM pg_catalog.pg_attribute a
  LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
 WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
"""


class _Lookups:
    """Cached catalog answers; per relation they are redone when a new Relation message comes."""

    def __init__(self, ctx: DecodingContext) -> None:
        self.ctx = ctx
        self.types: dict[int, _TypeInfo] = {}
        self.attrs: dict[int, tuple[Relation, dict[str, _Attr]]] = {}
        self.origins: dict[str, int] = {}
        self.relations: dict[int, _RelInfo] = {}

    def rel_info(self, relation: Relation) -> _RelInfo:
        info = self.relations.get(relation.relid)
        if info is None or info.relation is not relation:
            info = self.relations[relation.relid] = _RelInfo(relation, self)
        return info

    def _query(self, sql: str, params: tuple[object, ...]) -> list[tuple[Any, ...]]:
        if self.ctx.catalog is None:
            raise PluginError("wal2json needs catalog access for these options (no catalog)")
        return self.ctx.catalog.query(sql, params)

    def format_type(self, type_oid: int, typmod: int) -> str:
        """``format_type_with_typemod``: the typmod always counts as given, so a bare
        ``bpchar`` stays ``bpchar``."""
        if self.ctx.catalog is None:
            raise PluginError("wal2json needs catalog access for these options (no catalog)")
        return self.ctx.catalog.type_name(type_oid, typmod)

    def type_info(self, type_oid: int) -> _TypeInfo:
        info = self.types.get(type_oid)
        if info is None:
            rows = self._query(
                "SELECT typname::text, typtype::text, typbasetype::int8, typtypmod "
                "FROM pg_catalog.pg_type WHERE oid = %s::oid",
                (type_oid,),
            )
            if not rows:
                raise PluginError(f"cache lookup failed for type {type_oid}")
            name, typtype, base, typmod = rows[0]
            info = _TypeInfo(name, typtype == "d", base, typmod)
            self.types[type_oid] = info
        return info

    def attributes(self, relation: Relation) -> dict[str, _Attr]:
        cached = self.attrs.get(relation.relid)
        if cached is not None and cached[0] is relation:
            return cached[1]
        rows = self._query(_ATTRS_SQL, (relation.relid,))
        attrs = {
            name: _Attr(num, notnull, default, in_pk) for name, num, notnull, default, in_pk in rows
        }
        self.attrs[relation.relid] = (relation, attrs)
        return attrs

    def origin_id(self, origin: str | None) -> int:
        if origin is None:
            return 0
        ident = self.origins.get(origin)
        if ident is None:
            rows = self._query(
                "SELECT roident::int8 FROM pg_catalog.pg_replication_origin WHERE roname = %s",
                (origin,),
            )
            ident = self.origins[origin] = rows[0][0] if rows else 0
        return ident


# -- the plugin --------------------------------------------------------------------------------


@dataclass(slots=True)
class _Txn:
    """Per-transaction state: v1's document, and held writes."""

    #: v1 without write-in-chunks: the body of the transaction's single write.
    doc: list[str] = field(default_factory=list)
    #: Writes held until commit (location, text); None stands for the header, which needs
    #: the end LSN that only Commit brings.
    held: list[tuple[Lsn | None, str | None]] | None = None


@dataclass(slots=True)
class _State:
    settings: _Settings
    lookups: _Lookups
    ht: str
    nl: str
    sp: str
    #: v1's change counter, as wal2json keeps it: for the session, reset only by a begin
    #: (a non-transactional message after a transaction of two changes gets a comma).
    nr_changes: int = 0


def _state(ctx: DecodingContext) -> _State:
    state = ctx.output_plugin_private
    assert isinstance(state, _State), "Wal2Json.startup was not run"
    return state


def _txn_state(txn: Transaction) -> _Txn:
    if not isinstance(txn.output_plugin_private, _Txn):
        txn.output_plugin_private = _Txn()
    return txn.output_plugin_private


class Wal2Json(OutputPlugin):
    """wal2json's JSON: one document per transaction (v1) or one object per change (v2)."""

    # -- startup -------------------------------------------------------------------------------

    def startup(self, ctx: DecodingContext, options: OutputPluginOptions, is_init: bool) -> None:
        settings = _Settings.parse(ctx)
        pretty = settings.pretty_print
        ctx.output_plugin_private = _State(
            settings,
            _Lookups(ctx),
            "\t" if pretty else "",
            "\n" if pretty else "",
            " " if pretty else "",
        )
        options.output_type = OutputType.TEXTUAL
        options.binary = False

    def shutdown(self, ctx: DecodingContext) -> None:
        ctx.output_plugin_private = None

    def filter_by_origin(self, ctx: DecodingContext, origin: str) -> bool:
        state = _state(ctx)
        if not state.settings.filter_origins:
            return False
        ident = state.lookups.origin_id(origin)  # 0: not in the catalog now
        return ident != 0 and ident in state.settings.filter_origins

    # -- output --------------------------------------------------------------------------------

    @staticmethod
    def _write(ctx: DecodingContext, text: str) -> None:
        """One write; bytes the server sent that are not UTF-8 (kept as lone surrogates by
        ``surrogateescape``) are written back as they came."""
        ctx.prepare_write()
        ctx.append(text.encode("utf-8", "surrogateescape"))
        ctx.write()

    def _emit(self, ctx: DecodingContext, txn: Transaction | None, text: str) -> None:
        """One write, or held until commit when the transaction's header is still to come."""
        held = _txn_state(txn).held if txn is not None else None
        if held is not None:
            held.append((ctx.write_location, text))
        else:
            self._write(ctx, text)

    def _holds(self, settings: _Settings) -> bool:
        """The header needs the end LSN, which pgoutput sends only with Commit."""
        if not settings.include_lsn:
            return False
        if settings.format_version == 2:
            return settings.include_transaction
        return settings.write_in_chunks

    # -- begin and commit ----------------------------------------------------------------------

    def begin(self, ctx: DecodingContext, txn: Transaction) -> None:
        state = _state(ctx)
        s = state.settings
        tx = _txn_state(txn)
        state.nr_changes = 0
        tx.doc.clear()
        if self._holds(s):
            tx.held = [(ctx.write_location, None)]
        elif s.format_version == 2:
            if s.include_transaction:
                self._write(ctx, self._v2_txn_object(state, txn, "B", txn.final_lsn))
        elif s.write_in_chunks:
            self._write(ctx, self._v1_header(state, txn))

    def commit(self, ctx: DecodingContext, txn: Transaction, commit_lsn: Lsn) -> None:
        state = _state(ctx)
        s = state.settings
        tx = _txn_state(txn)
        if tx.held is not None:
            location = ctx.write_location
            for where, text in tx.held:
                if text is None:
                    text = (
                        self._v2_txn_object(state, txn, "B", txn.final_lsn)
                        if s.format_version == 2
                        else self._v1_header(state, txn)
                    )
                ctx.write_location = where
                self._write(ctx, text)
            ctx.write_location = location
            tx.held = None
        if s.format_version == 2:
            if s.include_transaction:
                self._write(ctx, self._v2_txn_object(state, txn, "C", commit_lsn))
        elif s.write_in_chunks:
            self._write(ctx, f"{state.ht}]{state.nl}}}")
        else:
            body = "".join(tx.doc)
            footer = f"{state.nl}{state.ht}]{state.nl}}}"
            self._write(ctx, self._v1_header(state, txn) + body + footer)
        txn.output_plugin_private = None

    def _v1_header(self, state: _State, txn: Transaction) -> str:
        s, ht, nl, sp = state.settings, state.ht, state.nl, state.sp
        out = [f"{{{nl}"]
        if s.include_xids:
            out.append(f'{ht}"xid":{sp}{txn.xid},{nl}')
        if s.include_lsn:
            out.append(f'{ht}"nextlsn":{sp}"{_lsn(txn.end_lsn)}",{nl}')
        if s.include_timestamp:
            out.append(f'{ht}"timestamp":{sp}"{_timestamp(txn)}",{nl}')
        if s.include_origin:
            out.append(f'{ht}"origin":{sp}{state.lookups.origin_id(txn.origin)},{nl}')
        out.append(f'{ht}"change":{sp}[')
        return "".join(out)

    def _v2_txn_object(self, state: _State, txn: Transaction, action: str, lsn: Lsn | None) -> str:
        s = state.settings
        out = [f'{{"action":"{action}"']
        if s.include_xids:
            out.append(f',"xid":{txn.xid}')
        if s.include_timestamp:
            out.append(f',"timestamp":"{_timestamp(txn)}"')
        if s.include_origin:
            out.append(f',"origin":{state.lookups.origin_id(txn.origin)}')
        if s.include_lsn:
            out.append(f',"lsn":"{_lsn(lsn)}","nextlsn":"{_lsn(txn.end_lsn)}"')
        out.append("}")
        return "".join(out)

    def _v2_common(self, state: _State, txn: Transaction, lsn: Lsn | None) -> str:
        """xid, timestamp, origin and lsn of a v2 change or truncate object."""
        s = state.settings
        out = []
        if s.include_xids:
            out.append(f',"xid":{txn.xid}')
        if s.include_timestamp:
            out.append(f',"timestamp":"{_timestamp(txn)}"')
        if s.include_origin:
            out.append(f',"origin":{state.lookups.origin_id(txn.origin)}')
        if s.include_lsn:
            out.append(f',"lsn":"{_lsn(lsn)}"')
        return "".join(out)

    # -- changes -------------------------------------------------------------------------------

    def change(
        self, ctx: DecodingContext, txn: Transaction, relation: Relation, change: Change
    ) -> None:
        state = _state(ctx)
        s = state.settings
        if change.action.value not in s.actions:
            return
        schema, table = relation.schema, relation.relname
        if any(t.matches(schema, table) for t in s.filter_tables):
            return
        if not any(t.matches(schema, table) for t in s.add_tables):
            return
        for row in (change.new, change.old):
            if row is not None and 0x62 in row.kinds:  # 'b'
                raise PluginError("wal2json needs values in text format; do not ask for binary")
        info = state.lookups.rel_info(relation)
        if s.format_version == 2:
            text = self._v2_change(state, txn, info, change)
        else:
            text = self._v1_change(state, txn, info, change)
        if text is None:
            return
        if s.format_version == 1 and not s.write_in_chunks:
            _txn_state(txn).doc.append(text)
        else:
            self._emit(ctx, txn, text)

    def _skip_without_identity(self, info: _RelInfo, change: Change) -> bool:
        """UPDATE/DELETE of a table with neither a replica identity index nor FULL."""
        relation = info.relation
        if info.identity is not None or relation.replica_identity == "f":
            return False
        log.warning(
            'table "%s"."%s" without primary key or replica identity is nothing; '
            "its %s is left out",
            relation.schema,
            relation.relname,
            change.action.value.upper(),
        )
        return True

    # v1 ---------------------------------------------------------------------------------------

    def _v1_change(
        self, state: _State, txn: Transaction, info: _RelInfo, change: Change
    ) -> str | None:
        s, ht, nl, sp = state.settings, state.ht, state.nl, state.sp
        action = change.action
        if action is not ChangeAction.INSERT and self._skip_without_identity(info, change):
            return None
        if action is ChangeAction.DELETE and change.old is None:
            log.warning('no tuple data for DELETE in table "%s"', info.relation.relname)
            return None
        state.nr_changes += 1
        out = [] if s.write_in_chunks else [nl]
        out.append(ht * 2)
        if state.nr_changes > 1:
            out.append(",")
        out.append(f'{{{nl}{ht * 3}"kind":{sp}"{action.value}",{nl}')
        if s.include_schemas:
            out.append(f'{ht * 3}"schema":{sp}{_quote(info.relation.schema)},{nl}')
        out.append(f'{ht * 3}"table":{sp}{_quote(info.relation.relname)},{nl}')
        # wal2json 2.5's v1 prints the primary key only where it is the replica identity
        with_pk = s.include_pk and info.relation.replica_identity == "d" and info.pk is not None
        if action is ChangeAction.INSERT:
            assert change.new is not None
            out.append(self._v1_tuple(state, info, change.new, None, False, with_pk))
            if with_pk:
                out.append(self._v1_pk(state, info, False))
        elif action is ChangeAction.UPDATE:
            assert change.new is not None
            out.append(self._v1_tuple(state, info, change.new, None, False, True))
            if with_pk:
                out.append(self._v1_pk(state, info, True))
            if change.old is None:
                out.append(self._v1_tuple(state, info, change.new, info.identity, True, False))
            else:
                out.append(self._v1_tuple(state, info, change.old, None, True, False))
        else:
            assert change.old is not None
            if with_pk:
                out.append(self._v1_pk(state, info, True))
            out.append(self._v1_tuple(state, info, change.old, info.identity, True, False))
        out.append(f"{ht * 2}}}")
        return "".join(out)

    def _type_name(self, state: _State, relation: Relation, index: int) -> tuple[str, int]:
        """The type name wal2json prints for a column, and the type OID it then goes by."""
        s, lookups = state.settings, state.lookups
        column = relation.columns[index]
        type_oid = column.type_oid
        if s.include_domain_data_type:
            info = lookups.type_info(type_oid)
            if info.is_domain:
                if s.format_version == 2 or s.include_typmod:
                    return lookups.format_type(info.basetype, info.basetypmod), info.basetype
                return lookups.type_info(info.basetype).typname, info.basetype
        if s.format_version == 2 or s.include_typmod:
            return lookups.format_type(type_oid, column.type_modifier), type_oid
        return lookups.type_info(type_oid).typname, type_oid

    def _v1_tuple(
        self,
        state: _State,
        info: _RelInfo,
        row: TupleData,
        subset: frozenset[int] | None,
        identity: bool,
        addcomma: bool,
    ) -> str:
        """Column names, types, ... and values (``columnnames``...), or the ``oldkeys`` object."""
        s, ht, nl, sp = state.settings, state.ht, state.nl, state.sp
        relation = info.relation
        names: list[str] = []
        types: list[str] = []
        oids: list[str] = []
        positions: list[str] = []
        optionals: list[str] = []
        defaults: list[str] = []
        values: list[str] = []
        for i, column in enumerate(relation.columns):
            if subset is not None and i not in subset:
                continue
            kind = row.kinds[i]
            if (kind == _TAG_N and identity) or kind == _TAG_U:
                continue  # NULLs are no keys; unchanged TOAST is not printed
            names.append(_quote(column.name))
            type_oid = column.type_oid
            if s.include_types:
                type_str, type_oid = self._type_name(state, relation, i)
                types.append(_type_label(type_str))
                if not identity and s.include_not_null:
                    optionals.append("false" if info.attr(column.name).notnull else "true")
            if s.include_type_oids:
                oids.append(str(type_oid))
            if not identity and s.include_column_positions:
                positions.append(str(info.attr(column.name, i).attnum))
            if not identity and s.include_default:
                defaults.append(info.attr(column.name).default)
            values.append(_value(type_oid, row.values[i]))
        comma = f",{sp}"
        t3 = ht * 3
        out: list[str] = []
        if identity:
            t4 = ht * 4
            out.append(f'{t3}"oldkeys":{sp}{{{nl}{t4}"keynames":{sp}[{comma.join(names)}],{nl}')
            if s.include_types:
                out.append(f'{t4}"keytypes":{sp}[{comma.join(types)}],{nl}')
            if s.include_type_oids:
                out.append(f'{t4}"keytypeoids":{sp}[{comma.join(oids)}],{nl}')
            out.append(f'{t4}"keyvalues":{sp}[{comma.join(values)}]{nl}{t3}}}{nl}')
            return "".join(out)
        out.append(f'{t3}"columnnames":{sp}[{comma.join(names)}],{nl}')
        if s.include_types:
            out.append(f'{t3}"columntypes":{sp}[{comma.join(types)}],{nl}')
        if s.include_type_oids:
            out.append(f'{t3}"columntypeoids":{sp}[{comma.join(oids)}],{nl}')
        if s.include_column_positions:
            out.append(f'{t3}"columnpositions":{sp}[{comma.join(positions)}],{nl}')
        if s.include_not_null:
            out.append(f'{t3}"columnoptionals":{sp}[{comma.join(optionals)}],{nl}')
        if s.include_default:
            out.append(f'{t3}"columndefaults":{sp}[{comma.join(defaults)}],{nl}')
        end = "]," if addcomma else "]"
        out.append(f'{t3}"columnvalues":{sp}[{comma.join(values)}{end}{nl}')
        return "".join(out)

    def _v1_pk(self, state: _State, info: _RelInfo, addcomma: bool) -> str:
        s, ht, nl, sp = state.settings, state.ht, state.nl, state.sp
        names: list[str] = []
        types: list[str] = []
        pk = info.pk or frozenset()
        for i, column in enumerate(info.relation.columns):
            if i not in pk:
                continue
            names.append(_quote(column.name))
            if s.include_types:
                types.append(_type_label(self._type_name(state, info.relation, i)[0], False))
        comma = f",{sp}"
        t3, t4 = ht * 3, ht * 4
        end = "}," if addcomma else "}"
        return (
            f'{t3}"pk":{sp}{{{nl}{t4}"pknames":{sp}[{comma.join(names)}],{nl}'
            f'{t4}"pktypes":{sp}[{comma.join(types)}]{nl}{t3}{end}{nl}'
        )

    # v2 ---------------------------------------------------------------------------------------

    def _v2_change(
        self, state: _State, txn: Transaction, info: _RelInfo, change: Change
    ) -> str | None:
        s = state.settings
        action = change.action
        relation = info.relation
        if (
            action is not ChangeAction.INSERT
            and change.old is None
            and self._skip_without_identity(info, change)
        ):
            return None
        code = {"insert": "I", "update": "U", "delete": "D"}[action.value]
        out = [f'{{"action":"{code}"', self._v2_common(state, txn, change.lsn)]
        if s.include_schemas:
            out.append(f',"schema":{_quote(relation.schema)}')
        out.append(f',"table":{_quote(relation.relname)}')
        if change.new is not None:
            out.append(f',"columns":[{self._v2_tuple(state, info, change.new, "change")}]')
        if change.old is not None:
            out.append(f',"identity":[{self._v2_tuple(state, info, change.old, "identity")}]')
        elif action is ChangeAction.UPDATE:
            assert change.new is not None
            if info.identity is not None or info.pk is not None:
                identity = self._v2_tuple(state, info, change.new, "identity")
                out.append(f',"identity":[{identity}]')
            else:
                log.warning(
                    'no old tuple data for UPDATE in table "%s"."%s"',
                    relation.schema,
                    relation.relname,
                )
        elif action is ChangeAction.DELETE:
            log.warning(
                'no old tuple data for DELETE in table "%s"."%s"', relation.schema, relation.relname
            )
        if s.include_pk:
            pk = ""
            if info.pk is not None:
                row = change.old if change.old is not None else change.new
                assert row is not None
                pk = self._v2_tuple(state, info, row, "pk")
            out.append(f',"pk":[{pk}]')
        out.append("}")
        return "".join(out)

    def _v2_tuple(self, state: _State, info: _RelInfo, row: TupleData, kind: str) -> str:
        """The column objects of the new row (``change``), the identity or the primary key."""
        s = state.settings
        relation = info.relation
        subset = info.identity if kind == "identity" else info.pk if kind == "pk" else None
        items: list[str] = []
        for i, column in enumerate(relation.columns):
            if subset is not None and i not in subset:
                continue
            if row.kinds[i] == _TAG_U:
                continue  # unchanged TOAST is not printed
            out = [f'{{"name":{_quote(column.name)}']
            if s.include_types:
                out.append(f',"type":{_type_label(self._type_name(state, relation, i)[0])}')
            if s.include_type_oids:
                oid = column.type_oid
                out.append(f',"typeoid":{oid - (1 << 32) if oid >= 1 << 31 else oid}')
            if kind != "pk":
                out.append(f',"value":{_value(column.type_oid, row.values[i])}')
            if kind == "change":
                if s.include_not_null:
                    notnull = info.attr(column.name).notnull
                    out.append(',"optional":false' if notnull else ',"optional":true')
                if s.include_column_positions:
                    out.append(f',"position":{info.attr(column.name, i).attnum}')
                if s.include_default:
                    out.append(f',"default":{info.attr(column.name).default}')
            out.append("}")
            items.append("".join(out))
        return ",".join(items)

    # -- truncate and messages -----------------------------------------------------------------

    def truncate(
        self,
        ctx: DecodingContext,
        txn: Transaction,
        relations: list[Relation],
        change: Truncation,
    ) -> None:
        state = _state(ctx)
        s = state.settings
        if s.format_version == 1 or "truncate" not in s.actions:
            return  # wal2json's v1 has no truncate output
        for relation in relations:
            schema, table = relation.schema, relation.relname
            if any(t.matches(schema, table) for t in s.filter_tables):
                continue
            if not any(t.matches(schema, table) for t in s.add_tables):
                continue
            out = ['{"action":"T"', self._v2_common(state, txn, change.lsn)]
            if s.include_schemas:
                out.append(f',"schema":{_quote(schema)}')
            out.append(f',"table":{_quote(table)}}}')
            self._emit(ctx, txn, "".join(out))

    def message(
        self,
        ctx: DecodingContext,
        txn: Transaction | None,
        lsn: Lsn,
        transactional: bool,
        prefix: str,
        content: bytes,
    ) -> None:
        state = _state(ctx)
        s = state.settings
        if prefix in s.filter_msg_prefixes:
            return
        if s.add_msg_prefixes and prefix not in s.add_msg_prefixes:
            return
        # wal2json copies the content as a C string: it ends at the first NUL; its bytes are
        # escaped as JSON text, and written as they are where they are not UTF-8
        text = _quote(content.split(b"\0", 1)[0].decode("utf-8", "surrogateescape"))
        in_txn = transactional and txn is not None
        if s.format_version == 2:
            out = ['{"action":"M"']
            if s.include_xids:
                out.append(f',"xid":{txn.xid}' if in_txn and txn else ',"xid":null')
            if s.include_timestamp:
                out.append(
                    f',"timestamp":"{_timestamp(txn)}"' if in_txn and txn else ',"timestamp":null'
                )
            if s.include_origin:
                origin = state.lookups.origin_id(txn.origin) if in_txn and txn else None
                out.append(f',"origin":{"null" if origin is None else origin}')
            if s.include_lsn:
                out.append(f',"lsn":"{_lsn(lsn)}"')
            out.append(f',"transactional":{"true" if transactional else "false"}')
            out.append(f',"prefix":{_quote(prefix)},"content":{text}}}')
            self._emit(ctx, txn if in_txn else None, "".join(out))
            return
        ht, nl, sp = state.ht, state.nl, state.sp
        t3 = ht * 3
        if in_txn:
            state.nr_changes += 1
        # The counter is the session's: outside a transaction it is the last transaction's
        # (wal2json's quirk: ``{"change":[,{...}]}`` after one of two or more changes).
        comma = "," if state.nr_changes > 1 else ""
        body = (
            f'{ht * 2}{comma}{{{nl}{t3}"kind":{sp}"message",{nl}'
            f'{t3}"transactional":{sp}{"true" if transactional else "false"},{nl}'
            f'{t3}"prefix":{sp}{_quote(prefix)},{nl}{t3}"content":{sp}{text}{nl}{ht * 2}}}'
        )
        if not in_txn or txn is None:
            self._write(ctx, f'{{{nl}{ht}"change":{sp}[{nl}{body}{nl}{ht}]{nl}}}')
        elif s.write_in_chunks:
            self._emit(ctx, txn, body)
        else:
            _txn_state(txn).doc.append(nl + body)


class _RelInfo:
    """What wal2json asks the relcache about a relation: replica identity index columns,
    primary key columns, per-column attributes."""

    __slots__ = ("_attrs", "_pk", "identity", "lookups", "relation")

    def __init__(self, relation: Relation, lookups: _Lookups) -> None:
        self.relation = relation
        self.lookups = lookups
        keys = frozenset(i for i, c in enumerate(relation.columns) if c.is_key)
        #: Columns of ``rd_replidindex``; None when there is none (FULL, NOTHING, no key).
        self.identity: frozenset[int] | None = (
            keys if keys and relation.replica_identity in ("d", "i") else None
        )
        self._pk: frozenset[int] | bool | None = False  # False: not looked up yet
        self._attrs: dict[str, _Attr] | None = None

    @property
    def pk(self) -> frozenset[int] | None:
        """Columns of the primary key (``rd_pkindex``); None without one."""
        if self._pk is False:
            if self.relation.replica_identity == "d":
                self._pk = self.identity
            else:
                attrs = self.lookups.attributes(self.relation)
                pk = frozenset(
                    i
                    for i, c in enumerate(self.relation.columns)
                    if c.name in attrs and attrs[c.name].in_pk
                )
                self._pk = pk or None
        assert self._pk is not True
        return self._pk

    def attr(self, name: str, index: int = 0) -> _Attr:
        if self._attrs is None:
            self._attrs = self.lookups.attributes(self.relation)
        found = self._attrs.get(name)
        if found is None:  # dropped since: what pgoutput still sends for it
            return _Attr(index + 1, False, "null", False)
        return found


def _lsn(lsn: Lsn | int | None) -> str:
    return str(Lsn(lsn or 0))


def _timestamp(txn: Transaction) -> str:
    return timestamptz_to_str(txn.commit_ts or 0)
