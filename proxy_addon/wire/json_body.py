"""
A matched write's body read as JSON one way, by every reader of it (the fingerprint, the
body's key, GraphQL and MCP matching): never a body two parsers could read as two requests.

    doc = read_json(body)                       # the document or NOT_JSON; BadJson: a key twice
    doc = read_json(body, "iso8859-1")          # decoded by its declared charset first (or UNDECODABLE)
    doc = read_strict(body, "the JSON-RPC body", fold=True)   # MCP, GraphQL: the document or NotStrict(why)
    misspelled(doc, ENVELOPE, "the JSON-RPC body")            # "Method" for "method": why, or None
    case_twice(doc, "the GraphQL request body")               # "query" and "QUERY" in one object: why, or None

- **Numbers.** A literal with a fraction or an exponent (`1.0`, `1e2`, `1e400`) is a
  `JsonNumber`: the float every reader always saw, that keeps the text it was written as, so
  that the fingerprint compares numbers by their exact value (intent_body.canonical_number)
  and `1e400` is not `2e400` although both are the float inf. Integer literals are ints.
- **A key twice in one object** is refused wherever the proxy reads a body: Python's parser
  and Node's take the last one, others (and APIs that stream the body) the first, so the
  fingerprint would describe one request and the server run another. So are two keys that are
  one text in NFC (`é` composed and decomposed): the fingerprint reads keys in NFC, servers do
  not. The error names the keys and the object they are in (`items.0`), never a value.
- **Strict** (`read_strict`, on the endpoints of MCP and GraphQL rules, where the body says
  which call or mutation runs): the body must be UTF-8 (no invalid byte, no encoded surrogate,
  no byte order mark), RFC 8259 JSON (no `NaN` or `Infinity`), with no lone surrogate escape
  (`"\\ud800"`): Node and Go replace such bytes with U+FFFD and run the call, where the proxy
  would see no JSON at all. With `fold`, no object may hold two keys that differ only by case
  (Unicode case folding: `method` and `METHOD`; `params`, and `params` spelled with a long s,
  U+017F), since Go's encoding/json matches keys regardless of case and keeps the last one;
  and `misspelled` refuses a key that folds to one the proxy reads (`"Method"` alone) but is not it.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from proxy_addon.errors import BadJson
from proxy_addon.wire.jsonpath import NOT_JSON

__all__ = [
    "NOT_JSON",
    "UNDECODABLE",
    "JsonNumber",
    "NotStrict",
    "case_twice",
    "misspelled",
    "read_json",
    "read_strict",
]

UNDECODABLE: Final = object()  # read_json with a charset: the body does not decode with it

# The first byte of a JSON text as json.loads reads bytes (jsonpath.parse_json's rule).
_FIRST_BYTES: Final = frozenset(b' \t\n\r{["-0123456789tfnNI\x00\xef\xfe\xff')
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


class JsonNumber(float):
    """A JSON number written with a fraction or an exponent: its float value, and `text` as written."""

    __slots__ = ("text",)
    text: str

    def __new__(cls, text: str) -> JsonNumber:
        number = super().__new__(cls, text)
        number.text = text
        return number

    def __reduce__(self) -> tuple[Any, ...]:  # copied (dataclasses.asdict, deepcopy) with its text
        return (JsonNumber, (self.text,))


@dataclass(frozen=True)
class NotStrict:
    """Why a body sent to an MCP or GraphQL endpoint is refused (read_strict)."""

    why: str


class _Twice(Exception):
    """An object with a key twice, or two keys a reader takes as one (folding case, or in NFC)."""

    def __init__(self, keys: tuple[str, ...]):
        self.keys = keys


class _Constant(Exception):
    def __init__(self, name: str):
        self.name = name


def _nfc_key(key: str) -> str:
    return key if key.isascii() else unicodedata.normalize("NFC", key)


def _folded_key(key: str) -> str:
    return key.casefold() if key.isascii() else unicodedata.normalize("NFC", key.casefold())


def _same(obj: dict[str, Any], norm: Callable[[str], str]) -> tuple[str, str] | None:
    """Two keys of `obj` that `norm` makes one, in their order, or None."""
    seen: dict[str, str] = {}
    for k in obj:
        if (first := seen.setdefault(norm(k), k)) != k:
            return (first, k)
    return None


def _hook(*, fold: bool, nfc: bool) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    """
    An object_pairs_hook refusing (_Twice) a key twice; with `nfc` (a body that is not ASCII)
    also two keys that are one text in NFC, as the fingerprint reads keys (`é` composed and
    decomposed); with `fold`, two keys that differ only by case, as Go's encoding/json reads them.
    """

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) != len(pairs):
            raise _Twice((_repeated(pairs),))
        if len(obj) > 1:
            if fold and len({k.casefold() for k in obj}) != len(obj):
                raise _Twice(_same(obj, str.casefold) or ())
            if nfc and (pair := _same(obj, _folded_key if fold else _nfc_key)) is not None:
                raise _Twice(pair)
        return obj

    return unique


def _repeated(pairs: list[tuple[str, Any]]) -> str:
    seen: set[str] = set()
    for k, _ in pairs:
        if k in seen:
            return k
        seen.add(k)
    raise AssertionError("no key is repeated")


def _no_constant(name: str) -> Any:
    raise _Constant(name)


# Built once: json.loads with hooks builds a decoder (and its scanner) on every call, 1.5 µs a request.
# Decoders are used by many threads at once, as json.loads's own default decoder is. Keyed by
# (strict, fold, nfc): the keys of an ASCII body without \u escapes need no NFC check.
_DECODERS = {
    (strict, fold, nfc): json.JSONDecoder(
        object_pairs_hook=_hook(fold=fold, nfc=nfc),
        parse_float=JsonNumber,
        parse_constant=_no_constant if strict else None,  # None: NaN, Infinity and -Infinity read as floats
    )
    for strict in (False, True)
    for fold in (False, True)
    for nfc in (False, True)
}


def _loads(source: bytes | str, *, strict: bool = False, fold: bool = False) -> Any:
    """json.loads(source) with the proxy's decoder: bytes decoded as json.loads decodes them (UTF-8, -16 or -32)."""
    if isinstance(source, bytes):
        source = source.decode(json.detect_encoding(source), "surrogatepass")
    elif source.startswith("\ufeff"):
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", source, 0)
    nfc = not source.isascii() or "\\u" in source  # a key that is not ASCII (or \u-escaped): compare them in NFC
    return _DECODERS[(strict, fold, nfc)].decode(source)


def _twice(what: str, keys: tuple[str, ...], where: str) -> str:
    """Why a body with these keys in the object at `where` is refused."""
    if len(keys) == 1:
        return (
            f"{what} has the key {_short(keys[0])} twice in the object at {where}: servers disagree on which one "
            "counts (the first or the last), so the proxy does not guess; send each key once"
        )
    first, second = keys
    if _nfc_key(first) == _nfc_key(second):
        return (
            f"{what} has the keys {_short(first)} and {_short(second)}, one text in two Unicode forms, in the "
            f"object at {where}: the proxy reads keys in NFC (as one), servers as two, so it does not guess; "
            "send each key once"
        )
    return (
        f"{what} has the keys {_short(first)} and {_short(second)}, which differ only by case, in the object at "
        f"{where}: a server that matches keys regardless of case (Go's encoding/json) takes the last one, so the "
        "proxy does not guess; send each key once, spelled as the protocol spells it"
    )


def read_json(body: bytes, codec: str | None = None) -> Any:
    """
    A request body as JSON: the document, or NOT_JSON (invalid UTF-8 or JSON, nested too deep).
    Without `codec`, the bytes are read as json.loads reads them (UTF-8, or UTF-16/32 by their
    zero bytes); with one (a declared charset: intent_body), decoded by it first, UNDECODABLE
    when they do not decode. Raises BadJson when an object has a key twice.
    """
    source: bytes | str = body
    if codec is not None:
        try:
            source = body.decode(codec)
        except UnicodeDecodeError:
            return UNDECODABLE
    if not source:
        return NOT_JSON
    if isinstance(source, bytes) and source[0] not in _FIRST_BYTES:
        return NOT_JSON  # known before json.loads decodes all of it into a str the size of the body
    try:
        return _loads(source)
    except _Twice as e:
        where = _where_twice(source, e.keys)
        if where is None:
            return NOT_JSON  # not JSON after all (the key came before the error)
        raise BadJson(_twice("the JSON body", e.keys, where)) from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        return NOT_JSON


def read_strict(body: bytes, what: str, *, fold: bool) -> Any:
    """
    A body sent to an MCP or GraphQL endpoint: its document, or NotStrict(why) when it is not
    strict UTF-8 JSON, or an object in it has a key twice (with `fold`: two keys that differ
    only by case). `what` names the body in the reason (`the JSON-RPC body`).
    """
    try:
        text = body.decode("utf-8")  # strict: an invalid byte or an encoded surrogate is an error
    except UnicodeDecodeError as e:
        return NotStrict(
            f"{what} is not UTF-8 (byte 0x{body[e.start]:02x} at offset {e.start}): a server that replaces it "
            "with U+FFFD would run the request, which the proxy cannot read; send UTF-8"
        )
    try:
        doc = _loads(text, strict=True, fold=fold)
    except _Twice as e:
        where = _where_twice(text, e.keys)
        if where is None:
            return NotStrict(f"{what} is not JSON")
        return NotStrict(_twice(what, e.keys, where))
    except _Constant as e:
        return NotStrict(f"{what} holds {e.name}, which is not JSON (RFC 8259)")
    except json.JSONDecodeError as e:
        return NotStrict(f"{what} is not JSON ({e.msg} at offset {e.pos})")
    except (ValueError, RecursionError):
        return NotStrict(f"{what} is not JSON (nested too deeply, or a number too long)")
    if _SURROGATE_ESCAPE.search(text) and (where := _lone_surrogate(doc)) is not None:
        return NotStrict(
            f"{what} has a lone surrogate escape (\\ud800-\\udfff) in a string at {where}: servers read it "
            "differently (as itself, or as U+FFFD), so the proxy does not guess"
        )
    return doc


def misspelled(obj: Any, known: frozenset[str], what: str, where: str = "the top level") -> NotStrict | None:
    """
    NotStrict when a key of `obj` is one of `known` in another case (`"Method"` for `method`):
    a server that matches keys regardless of case reads it as that key, and the proxy does not.
    """
    if not isinstance(obj, dict):
        return None
    folded = {k.casefold(): k for k in known}
    for k in obj:
        meant = folded.get(k.casefold())
        if meant is not None and meant != k:
            return NotStrict(
                f"{what} has the key {_short(k)} at {where}, which a server that matches keys regardless of case "
                f"(Go's encoding/json) reads as {meant!r}, and the proxy does not; spell it {meant!r}"
            )
    return None


def case_twice(obj: Any, what: str, where: str = "the top level") -> NotStrict | None:
    """NotStrict when two keys of `obj` differ only by case (read_strict with `fold`, for one object)."""
    if not isinstance(obj, dict) or len(obj) < 2 or len({k.casefold() for k in obj}) == len(obj):
        return None
    first, second = _same(obj, str.casefold) or ("", "")
    return NotStrict(
        f"{what} has the keys {_short(first)} and {_short(second)}, which differ only by case, at {where}: a "
        "server that matches keys regardless of case (Go's encoding/json) takes the last one, so the proxy does "
        "not guess; send each key once, spelled as the protocol spells it"
    )


class _Marked(dict):
    """An object in which the marking parse found the repeated (or case-folded) keys."""


def _where_twice(source: bytes | str, keys: tuple[str, ...]) -> str | None:
    """Where the first object holding `keys` (found twice, or taken as one) is, as a dotted path; None: not JSON."""

    def mark(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        twice = len(obj) != len(pairs) or len(keys) == 2
        return _Marked(obj) if twice and all(k in obj for k in keys) else obj

    try:
        doc = json.loads(source, object_pairs_hook=mark)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return _path_to(doc, lambda v: isinstance(v, _Marked))


def _lone_surrogate(doc: Any) -> str | None:
    """Where a string (or a key) holding a lone surrogate is, or None."""

    def lone(text: str) -> bool:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False

    return _path_to(
        doc,
        lambda v: (isinstance(v, str) and lone(v)) or (isinstance(v, dict) and any(lone(k) for k in v)),
    )


def _path_to(doc: Any, found: Any) -> str | None:
    """The dotted path (`params.arguments`, `items.0`; "the top level") of the first value `found` says yes to."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(doc, ())]
    while stack:
        value, path = stack.pop()
        if found(value):
            return ".".join(_short(p, quote=False) for p in path) if path else "the top level"
        if isinstance(value, dict):
            stack.extend((v, (*path, k)) for k, v in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend((v, (*path, str(i))) for i, v in reversed(list(enumerate(value))))
    return None


def _short(text: str, *, quote: bool = True) -> str:
    """A key as the error shows it: repr'd (controls escaped), at most 60 characters."""
    shown = repr(text) if quote else repr(text)[1:-1]
    return shown if len(shown) <= 60 else shown[:57] + "..."
