"""Quoting for replication commands, which only the simple query protocol accepts (no
parameters), so names and values are spliced in as SQL text."""

from __future__ import annotations

__all__ = ["identifier", "literal", "option_identifier"]


def literal(text: str) -> str:
    """A SQL string constant."""
    return "'" + text.replace("'", "''") + "'"


def identifier(name: str) -> str:
    """A quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def option_identifier(name: str) -> str:
    """A name inside an identifier-list option (publication_names): bare when it is a plain
    lower-case identifier, quoted otherwise, as SplitIdentifierString parses it."""
    plain = name and name == name.lower() and name.replace("_", "a").isalnum()
    return name if plain and not name[0].isdigit() else identifier(name)
