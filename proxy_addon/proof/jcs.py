"""
RFC 8785 (JSON Canonicalization Scheme) for the values a receipt's event holds: `canonical(value)`.

    canonical({"b": 1, "a": "é\n", "c": None})   # b'{"a":"\xc3\xa9\\n","b":1,"c":null}'

Exactly RFC 8785 for these types, and a ValueError for anything else (never a guess):
- null, true, false;
- integers with |n| <= 2**53 - 1: RFC 8785 writes numbers as ECMAScript does, and every such
  integer is exactly a double printed without exponent or fraction (`-0` cannot occur);
  a larger one would not be the same number in every reader, so it is refused; floats are
  refused too (events hold none);
- strings (§3.2.2.2): `"` and `\\` escaped, U+0008, U+0009, U+000A, U+000C, U+000D as \\b \\t \\n
  \\f \\r, every other code point below U+0020 as \\u00xx (lower-case hex), everything else
  as itself in UTF-8 (U+007F, U+2028 and non-ASCII included); a lone surrogate is refused;
- arrays, in their order; objects with string keys, members sorted by their keys' UTF-16 code
  units (§3.2.3), no whitespace anywhere.

Why our own: the few types events hold make it thirty lines, checked against RFC 8785's
examples (tests/proof/test_jcs.py), where a dependency would bring floats we never write.
"""

from __future__ import annotations

from typing import Any

MAX_INT = 2**53 - 1
_SHORT = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
_ESCAPES = {chr(c): _SHORT.get(chr(c), f"\\u{c:04x}") for c in range(0x20)} | {'"': '\\"', "\\": "\\\\"}
_TRANSLATION = str.maketrans(_ESCAPES)


def canonical(value: Any) -> bytes:
    """The RFC 8785 form of `value` (None, bool, int, str, list, dict with str keys), as UTF-8 bytes."""
    return _text(value).encode("utf-8")


def _text(value: Any) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        if abs(value) > MAX_INT:
            raise ValueError(f"JCS: the integer {value} is beyond 2**53 - 1 (not one number in every reader)")
        return str(int(value))
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(_text(v) for v in value) + "]"
    if isinstance(value, dict):
        members = [(_string(k), k) for k in value]  # checks every key first: a string, no lone surrogate
        members.sort(key=lambda m: m[1].encode("utf-16-be"))
        return "{" + ",".join(f"{text}:{_text(value[k])}" for text, k in members) + "}"
    raise ValueError(f"JCS: no canonical form here for a {type(value).__name__}")


def _string(s: Any) -> str:
    if not isinstance(s, str):
        raise ValueError(f"JCS: an object's key must be a string, not a {type(s).__name__}")
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("JCS: a string holds a lone surrogate (not Unicode text)") from None
    return '"' + s.translate(_TRANSLATION) + '"'
