"""Text search types: ``tsvector`` and ``tsquery``, each to its canonical text (a `str`).

The text form is already canonical (sorted, de-duplicated lexemes; a normalised query), so it is
the value. The binary parsers rebuild exactly that text from the send functions' structures,
following ``tsvectorout`` and ``tsqueryout`` (quoting, weights, operator priorities and
parentheses), so a column decodes to the same string in either mode.
"""

from __future__ import annotations

import struct

from pgcdc.errors import ValueDecodeError
from pgcdc.types.registry import register

__all__: list[str] = []

_INT32 = struct.Struct(">i")
_UINT16 = struct.Struct(">H")
_INT16 = struct.Struct(">h")
#: A position's weight (its top two bits) as ``tsvectorout`` prints it: D is not printed.
_WEIGHT_LETTERS = ("", "C", "B", "A")
#: Precompiled position-list layouts for the common short lists.
_POSITION_STRUCTS = tuple(struct.Struct(f">{n}H") for n in range(17))


def _utf8(data: bytes, what: str) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise ValueDecodeError(f"{what} is not valid UTF-8 at byte {exc.start}") from None


def _quote(lexeme: str) -> str:
    """A lexeme or query operand as the output functions quote it: in single quotes, with
    quotes and backslashes doubled."""
    if "'" in lexeme or "\\" in lexeme:
        lexeme = lexeme.replace("\\", "\\\\").replace("'", "''")
    return f"'{lexeme}'"


def tsvector_text(data: bytes) -> str:
    """``tsvectorout``'s text, e.g. ``'cat':3A 'fat':2,4B``."""
    return _utf8(data, "tsvector")


def tsvector_binary(data: bytes) -> str:
    """``tsvectorsend``: int32 lexeme count; per lexeme its text and a NUL, a uint16 position
    count and the positions (uint16: weight in the top 2 bits, position in the low 14)."""
    try:
        (count,) = _INT32.unpack_from(data)
        if count < 0:
            raise ValueDecodeError(f"tsvector binary has a negative lexeme count {count}")
        offset = 4
        parts: list[str] = []
        for _ in range(count):
            end = data.index(b"\0", offset)
            lexeme = _quote(_utf8(data[offset:end], "tsvector lexeme"))
            (npos,) = _UINT16.unpack_from(data, end + 1)
            offset = end + 3
            if npos:
                if npos < len(_POSITION_STRUCTS):
                    positions = _POSITION_STRUCTS[npos].unpack_from(data, offset)
                else:
                    positions = struct.unpack_from(f">{npos}H", data, offset)
                offset += 2 * npos
                lexeme += ":" + ",".join(
                    f"{p & 0x3FFF}{_WEIGHT_LETTERS[p >> 14]}" for p in positions
                )
            parts.append(lexeme)
    except (struct.error, ValueError):  # unpack_from or index past the end
        raise ValueDecodeError(f"tsvector binary is truncated ({len(data)} bytes)") from None
    if offset != len(data):
        raise ValueDecodeError(f"tsvector binary has {len(data) - offset} bytes after its end")
    return " ".join(parts)


def tsquery_text(data: bytes) -> str:
    """``tsqueryout``'s text, e.g. ``'fat' & ( 'rat' | 'cat':*A )``."""
    return _utf8(data, "tsquery")


# tsquery items (ts_type.h): QI_VAL operands and QI_OPR operators; operator codes, their
# priorities (tsearch_op_priority) and how tsqueryout prints the binary ones.
_QI_VAL, _QI_OPR = 1, 2
_OP_NOT, _OP_AND, _OP_OR, _OP_PHRASE = 1, 2, 3, 4
_PRIORITY = {_OP_NOT: 4, _OP_AND: 2, _OP_OR: 1, _OP_PHRASE: 3}
_INFIX = {_OP_AND: " & ", _OP_OR: " | "}
#: An operand's weight bitmap (bit 3 = A ... bit 0 = D) as letters, in tsqueryout's order.
_QUERY_WEIGHTS = tuple(
    "".join(letter for bit, letter in ((8, "A"), (4, "B"), (2, "C"), (1, "D")) if w & bit)
    for w in range(16)
)
#: A rendered subtree: its text and its top operator (0 for an operand).
_Node = tuple[str, int]


def _wrap(node: _Node, parent_priority: int, right_of_phrase: bool) -> str:
    """A subtree's text as ``infix()`` prints it under an operator: in ``( ... )`` when it binds
    less tightly than the parent, or when it is a phrase on the right of a phrase (phrase
    operators are not associative)."""
    text, oper = node
    if oper and (_PRIORITY[oper] < parent_priority or (oper == _OP_PHRASE and right_of_phrase)):
        return f"( {text} )"
    return text


def tsquery_binary(data: bytes) -> str:
    """``tsquerysend``: int32 item count, then the items in the stored prefix order (an
    operator, then its right operand's items, then its left operand's). An operand is
    QI_VAL, weight bitmap, prefix flag and NUL-terminated text; an operator is QI_OPR and its
    code, plus an int16 distance for a phrase."""
    items = _tsquery_items(data)
    # Render bottom-up: walking the prefix list backwards, an operator finds its left operand's
    # rendering under its right operand's on the stack. No recursion, so deep queries are fine.
    stack: list[_Node] = []
    for item in reversed(items):
        if isinstance(item, str):
            stack.append((item, 0))
            continue
        oper, distance = item
        priority = _PRIORITY[oper]
        if oper == _OP_NOT:
            if not stack:
                raise ValueDecodeError("tsquery binary has a ! operator without an operand")
            stack.append(("!" + _wrap(stack.pop(), priority, False), oper))
            continue
        if len(stack) < 2:
            raise ValueDecodeError("tsquery binary has an operator without two operands")
        right = _wrap(stack.pop(), priority, oper == _OP_PHRASE)
        left = _wrap(stack.pop(), priority, False)
        if oper == _OP_PHRASE:
            infix = " <-> " if distance == 1 else f" <{distance}> "
        else:
            infix = _INFIX[oper]
        stack.append((left + infix + right, oper))
    if len(stack) > 1:
        raise ValueDecodeError(f"tsquery binary leaves {len(stack)} operands without operators")
    return stack[0][0] if stack else ""


def _tsquery_items(data: bytes) -> list[str | tuple[int, int]]:
    """The items: an operand as its printed text, an operator as (code, phrase distance)."""
    items: list[str | tuple[int, int]] = []
    try:
        (count,) = _INT32.unpack_from(data)
        if count < 0:
            raise ValueDecodeError(f"tsquery binary has a negative item count {count}")
        offset = 4
        for _ in range(count):
            kind = data[offset]
            if kind == _QI_VAL:
                weight, prefix = data[offset + 1], data[offset + 2]
                end = data.index(b"\0", offset + 3)
                text = _quote(_utf8(data[offset + 3 : end], "tsquery operand"))
                if weight or prefix:
                    if weight > 0xF:
                        raise ValueDecodeError(f"tsquery binary has weight bitmap {weight}")
                    text += ":" + ("*" if prefix else "") + _QUERY_WEIGHTS[weight]
                items.append(text)
                offset = end + 1
            elif kind == _QI_OPR:
                oper = data[offset + 1]
                if oper not in _PRIORITY:
                    raise ValueDecodeError(f"tsquery binary has unknown operator {oper}")
                distance = 0
                if oper == _OP_PHRASE:
                    (distance,) = _INT16.unpack_from(data, offset + 2)
                    offset += 2
                items.append((oper, distance))
                offset += 2
            else:
                raise ValueDecodeError(f"tsquery binary has unknown item type {kind}")
    except (struct.error, IndexError, ValueError):  # reading past the end
        raise ValueDecodeError(f"tsquery binary is truncated ({len(data)} bytes)") from None
    if offset != len(data):
        raise ValueDecodeError(f"tsquery binary has {len(data) - offset} bytes after its end")
    return items


register(3614, "tsvector", tsvector_text, tsvector_binary, array_oid=3643)
register(3615, "tsquery", tsquery_text, tsquery_binary, array_oid=3645)
