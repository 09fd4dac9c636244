"""Read-only catalog access for output plugins, over a separate ordinary connection.

The server gives plugins the catalog as of the change being decoded (a historic snapshot);
over pgoutput we only have the current catalog. What plugins need from it (type names,
which words need quoting) rarely changes, so answers are cached for the session. The
connection is opened on first use and is read-only; it has the settings pgcdc's walsender
session pins (`DEFAULT_SESSION_SETTINGS`), so the values it prints (a column default's
``pg_get_expr``, say) read as the server's plugins print them in that session.
"""

from __future__ import annotations

from typing import Any

from pgcdc.replication.sql_session import SqlSession

__all__ = ["Catalog", "quote_identifier"]


class Catalog:
    """Cached catalog lookups through `conninfo` (an ordinary, not a replication, connection)."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self.session = SqlSession(conninfo, pinned_settings=True)
        self._type_names: dict[tuple[int, int | None], str] = {}
        self._keywords: frozenset[str] | None = None

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run a read-only query; the rows."""
        return self.session.query(sql, params)

    def type_name(self, type_oid: int, type_modifier: int | None = None) -> str:
        """``format_type(oid, typmod)``: e.g. ``integer``, ``character varying(20)``.

        Without `type_modifier` it is the server's ``format_type_be`` (``character`` for
        bpchar); with one, even -1, ``format_type_with_typemod`` (``bpchar``).
        """
        key = (type_oid, type_modifier)
        name = self._type_names.get(key)
        if name is None:
            rows = self.query("SELECT pg_catalog.format_type(%s::oid, %s::int4)", key)
            name = self._type_names[key] = rows[0][0]
        return name

    def keywords(self) -> frozenset[str]:
        """SQL keywords an identifier must be quoted for (all but the unreserved ones)."""
        if self._keywords is None:
            rows = self.query("SELECT word FROM pg_catalog.pg_get_keywords() WHERE catcode <> 'U'")
            self._keywords = frozenset(row[0] for row in rows)
        return self._keywords

    def quote_identifier(self, name: str) -> str:
        """The server's ``quote_identifier``, with its keyword list."""
        return quote_identifier(name, self.keywords())

    def close(self) -> None:
        self.session.close()


def quote_identifier(name: str, keywords: frozenset[str]) -> str:
    """Quote `name` unless it is lower-case letters, digits and underscores, not starting
    with a digit, and not a keyword (the rules of the server's ``quote_identifier``)."""
    safe = bool(name) and (name[0].islower() or name[0] == "_") and name.isascii()
    if safe:
        safe = all(c.islower() or c.isdigit() or c == "_" for c in name)
    if safe and name not in keywords:
        return name
    return '"' + name.replace('"', '""') + '"'
