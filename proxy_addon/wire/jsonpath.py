"""
JSON documents and dotted paths into them, with one rule for what "not JSON" means.

    doc = parse_json(body)              # NOT_JSON for invalid UTF-8, invalid JSON or JSON nested too deep
    dig(doc, "article.title")           # one value, or None
    dig_all(doc, "errors.*.code")       # every value, `*` being any item of a list
    id_in(doc, ("channel", "ts"))       # "C1:1712.5": an id from one field or several joined with ':'
"""

from __future__ import annotations

import json
from typing import Any, Final

NOT_JSON: Final = object()  # what parse_json returns for a body that is not a JSON document


# The first byte of a JSON text as json.loads reads bytes: a value's first character or whitespace,
# or the start of a byte order mark or of UTF-16/32 (a zero byte). Any other first byte is not JSON.
_FIRST_BYTES: Final = frozenset(b' \t\n\r{["-0123456789tfnNI\x00\xef\xfe\xff')


def parse_json(body: bytes | str) -> Any:
    """The parsed document, or NOT_JSON. Deeply nested JSON (RecursionError) counts as not JSON."""
    if not body:
        return NOT_JSON
    if isinstance(body, bytes) and body[0] not in _FIRST_BYTES:
        return NOT_JSON  # known before json.loads decodes all of it into a str the size of the body
    try:
        return json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return NOT_JSON


def dig(value: Any, dotted: str) -> Any:
    """The value at a dotted path (`article.title`, `items.0.sku`) in parsed JSON, or None."""
    for part in dotted.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdecimal() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def dig_all(value: Any, dotted: str) -> list[Any]:
    """Every value at a dotted path where `*` is any item of a list; [None] when there is none."""
    values = [value]
    for part in dotted.split("."):
        nxt = []
        for v in values:
            if part == "*" and isinstance(v, list):
                nxt += v
            elif isinstance(v, dict) and part in v:
                nxt.append(v[part])
            elif isinstance(v, list) and part.isdecimal() and int(part) < len(v):
                nxt.append(v[int(part)])
        values = nxt
    return values or [None]


def id_in(doc: Any, dotted: str | tuple[str, ...]) -> str | None:
    """The id at a dotted field (or the fields joined with ':') of parsed JSON, or None if any is missing."""
    parts = []
    for path in (dotted,) if isinstance(dotted, str) else dotted:
        value = dig(doc, path)
        if value is None or isinstance(value, (dict, list)):
            return None
        parts.append(value if isinstance(value, str) else json.dumps(value))
    return ":".join(parts)


def text_of(value: Any) -> str | None:
    """A value as text for comparisons: strings as they are, anything else as JSON; None stays None."""
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value)
