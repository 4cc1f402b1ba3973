"""
What a request's body adds to its intent: the fields a rule names, read from JSON, a form,
multipart parts or GraphQL arguments, NFC-normalised; a named object stored as a keyed hash;
and, when the named fields cannot be found, the fallback used (recorded as notes that never
enter the fingerprint). intent/fingerprint.py puts this together with the path, query, headers and
principal.

From fingerprint scheme 3 (`BY_VALUE`), a body is read as its sender wrote it:
- numbers by their exact value (`canonical_number`): `1`, `1.0` and `1e0` are one value, so
  are `100` and `1E+2`; `1e400` and `2e400` are two (both the float inf), as are `0.1` and
  `0.1000000000000000000001` (both the double 0.1);
- JSON and forms decoded by the charset their Content-Type declares (`charset=latin-1`): the
  same text in Latin-1 or in UTF-8 is one intent. A charset Python does not know, or a body
  that does not decode with it, is hashed whole (fallback `bad_charset`); a form's
  %-escapes that are not text in its charset are no longer read as U+FFFD (fallback `bad_form`).
Scheme 2 read numbers as doubles and bodies as UTF-8, whatever they declared: `scheme=2` still does.
"""

from __future__ import annotations

import codecs
import functools
import hashlib
import hmac
import json
import math
import unicodedata
from collections.abc import Callable, Mapping
from decimal import Decimal
from email.message import Message
from typing import Any
from urllib.parse import parse_qsl

from proxy_addon.wire.json_body import NOT_JSON, UNDECODABLE, JsonNumber, read_json

_MISSING = object()

BY_VALUE = 3  # the first fingerprint scheme that reads numbers by value and bodies by their declared charset
_INT_DIGITS = 40  # an integral number of more digits enters as a keyed hash (canonical_number)
_BIG_INT = 10**_INT_DIGITS
# Python codecs that are no charset an HTTP peer declares: read as one, they would read what no server does.
_NOT_CHARSETS = frozenset({"unicode_escape", "raw_unicode_escape", "idna", "punycode", "undefined", "charmap", "mbcs"})


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def keyed_hash(key: bytes, *parts: str) -> str:
    """An HMAC of `parts`, for identities that must not be stored in the clear (an agent's Idempotency-Key)."""
    return "hmac:" + hmac.new(key, "\0".join(parts).encode(), hashlib.sha256).hexdigest()[:32]


def multipart_parts(content_type: str, body: bytes) -> dict[str, Any] | None:
    """
    The parts of a multipart/form-data body by name: a text part as its text, a file part
    (one with a filename, or not UTF-8) as {filename, content_type, size, sha256}. The
    content of a file is hashed, never kept. None when the body is not well-formed.
    """
    params = Message()
    params["content-type"] = content_type
    boundary = params.get_param("boundary")
    if not isinstance(boundary, str) or not boundary:
        return None
    delimiter = b"--" + boundary.encode("latin-1")
    chunks = body.split(delimiter)
    if len(chunks) < 3 or not chunks[-1].startswith(b"--"):
        return None  # no closing delimiter: truncated or not multipart
    parts: dict[str, Any] = {}
    for chunk in chunks[1:-1]:
        chunk = chunk.removeprefix(b"\r\n").removesuffix(b"\r\n")
        head, sep, content = chunk.partition(b"\r\n\r\n")
        if not sep:
            return None
        headers = Message()
        for line in head.decode("latin-1").split("\r\n"):
            header, colon, header_value = line.partition(":")
            if not colon:
                return None
            headers[header.strip()] = header_value.strip()
        disposition = headers.get("content-disposition", "")
        if not disposition.lower().startswith("form-data"):
            return None
        name = headers.get_param("name", header="content-disposition")
        filename = headers.get_param("filename", header="content-disposition")
        if not isinstance(name, str):
            return None
        value: Any
        try:
            text = content.decode("utf-8") if filename is None else None
        except UnicodeDecodeError:
            text = None
        if text is not None:
            value = text
        else:
            value = {
                "filename": filename if isinstance(filename, str) else None,
                "content_type": headers.get("content-type"),
                "size": len(content),
                "sha256": hashlib.sha256(content).hexdigest(),
            }
        if name in parts:
            value = (parts[name] if isinstance(parts[name], list) else [parts[name]]) + [value]
        parts[name] = value
    return parts


# Notes stored with the intent when the body could not be read as the rule says, or the method
# was named by an override header, or a value was too large to store (`bounded`). They are shown
# (Receipt view, rules explain, one warning line) but never enter the fingerprint. `mcp_revision`:
# the MCP protocol revision a tool call was sent in (a reconcile read speaks it: reconcile/tool_reads.py); a
# retry sent in another revision is the same write.
NOTES = ("fallback", "missing", "hashed", "method_override", "bounded", "mcp_revision")
FALLBACKS = {
    "json_sent_as_form": "the body is a JSON object sent as application/x-www-form-urlencoded (as curl -d sends "
    "it), and the form has none of the named fields: the fields were read from the JSON",
    "not_json": "the body is not JSON (or nested too deeply to parse): the fingerprint uses the SHA-256 of the "
    "whole body",
    "not_a_json_object": "the body is JSON but not an object, so it has no fields: the fingerprint uses the "
    "SHA-256 of the whole body",
    "bad_form": "the body is neither valid application/x-www-form-urlencoded nor a JSON object: the fingerprint "
    "uses the SHA-256 of the whole body",
    "bad_multipart": "the body is not well-formed multipart/form-data: the fingerprint uses the SHA-256 of the "
    "whole body",
    "no_named_field": "the body has none of the named fields: the fingerprint uses the SHA-256 of the whole body",
    "empty": "the body is empty: the fingerprint uses the SHA-256 of the empty body",
    "bad_charset": "the body declares a charset Python does not know, or does not decode with the one it declares: "
    "the fingerprint uses the SHA-256 of the whole body",
}


def intent_notes(intent: Mapping[str, Any]) -> list[str]:
    """How the stored intent says its body (and method) was read, as sentences (empty when as the rule says)."""
    notes = []
    if isinstance(override := intent.get("method_override"), dict):
        sent, named, matched = override.get("sent"), override.get("override"), override.get("matched")
        notes.append(f"sent as {sent} with {named}: matched and fingerprinted as {matched}; forwarded as sent")
    if intent.get("fallback"):
        notes.append(f"fallback {intent['fallback']}: {FALLBACKS.get(intent['fallback'], 'see docs/rules.md')}")
    if intent.get("missing"):
        notes.append(f"named fields not in the body, counted as null: {', '.join(intent['missing'])}")
    if intent.get("bounded"):
        notes.append(
            f"values larger than {VALUE_BOUND // 1024} KiB ({READ_VALUE_BOUND // 1024 // 1024} MiB for one the "
            "reconcile read names), names longer than "
            f"{NAME_BOUND} characters and fields past the first {ENTRIES_BOUND} (as '…'), stored as a keyed hash, "
            f"never whole; the fingerprint is taken on the whole values: {', '.join(intent['bounded'][:20])}"
            + (" …" if len(intent["bounded"]) > 20 else "")
        )
    if intent.get("hashed"):
        notes.append(
            f"named fields that hold an object (or a list of objects), or a number no double holds exactly, stored "
            f"as a keyed hash of it, never its values: {', '.join(intent['hashed'])} (name an object's leaves one "
            f"by one, e.g. {intent['hashed'][0]}.id, to store them)"
        )
    return notes


def nfc(value: Any, *, numbers: bytes | None = None) -> Any:
    """`value` with every string in it, object keys too, in Unicode NFC: `café` is one text however it is
    composed. With `numbers` (scheme 3: the installation's key), every number in its canonical form too
    (canonical_number). Iterative, as parsed JSON may nest deeper than Python's recursion limit."""
    if not isinstance(value, (dict, list)):
        return _leaf(value, numbers)
    top: Any = {} if isinstance(value, dict) else []
    stack = [(value, top)]
    while stack:
        src, dst = stack.pop()
        into_dict = isinstance(dst, dict)
        for k, v in src.items() if isinstance(src, dict) else enumerate(src):
            if type(v) is str:  # the common leaf first: one check
                new: Any = _nfc_text(v)
            elif isinstance(v, (dict, list)):
                new = {} if isinstance(v, dict) else []
                stack.append((v, new))
            else:
                new = _leaf(v, numbers)
            if into_dict:
                dst[_nfc_text(k) if isinstance(k, str) else k] = new
            else:
                dst.append(new)
    return top


def _leaf(value: Any, numbers: bytes | None) -> Any:
    if isinstance(value, str):
        return _nfc_text(value)
    if numbers is None or value is None or isinstance(value, bool):
        return value  # None, a bool, and every number under scheme 2
    if type(value) is int and -_BIG_INT < value < _BIG_INT:
        return value  # the common number: its own canonical form
    if isinstance(value, (int, float)):
        return canonical_number(value, numbers)
    return value


def canonical_number(value: int | float, key: bytes) -> int | float | str:
    """
    A JSON number (scheme 3) as one value, however it is written: an integral value as an int
    (`1.0`, `1e2`, `-0.0`: 1, 100, 0); another as the double whose shortest text is exactly its
    value (`0.10` and `1e-1`: 0.1). A value no double holds exactly (`1e-400`,
    `0.1000000000000000000001`), or an integral one of more than 40 digits (`1e400`, which a
    double holds as inf), as a keyed hash of its exact decimal text: two of them are never one
    intent, no string can pass for one, and no short text grows into a long one. `value` is an
    int, a JsonNumber (its text as written), or a float the JSON held as `NaN` or `Infinity`,
    which is hashed by its name.
    """
    if isinstance(value, int):
        if -_BIG_INT < value < _BIG_INT:
            return value
        exact = Decimal(value)
    else:
        text = value.text if isinstance(value, JsonNumber) else repr(value)
        if not math.isfinite(value) and not isinstance(value, JsonNumber):
            return keyed_hash(key, "intent-number", text)  # NaN, Infinity, -Infinity: no number of JSON's
        if math.isfinite(value) and text == repr(value):  # the common case: the shortest text of its double
            if not value.is_integer():
                return float(value)
            if -_BIG_INT < value < _BIG_INT:
                return int(value)
        exact = Decimal(text)
        if exact == exact.to_integral_value():
            if -_BIG_INT < exact < _BIG_INT:  # `0e99` too
                return int(exact)
        elif math.isfinite(value) and Decimal(repr(float(value))) == exact:
            return float(value)
    sign, digits, exponent = exact.as_tuple()
    coefficient = "".join(map(str, digits)).rstrip("0")  # not zero: zero is an int
    assert isinstance(exponent, int)  # a finite number
    exponent += len(digits) - len(coefficient)
    return keyed_hash(key, "intent-number", f"{'-' if sign else ''}{coefficient}e{exponent}")


def _nfc_text(text: str) -> str:
    return text if text.isascii() or unicodedata.is_normalized("NFC", text) else unicodedata.normalize("NFC", text)


def _find(value: Any, dotted: str) -> Any:
    """The value at a dotted path in parsed JSON (as jsonpath.dig), `_MISSING` when there is none.
    A key written in another Unicode normal form than the rule's name is the same key."""
    for part in _nfc_text(dotted).split("."):
        if isinstance(value, dict):
            if part in value:
                value = value[part]
                continue
            value = next((v for k, v in value.items() if not k.isascii() and _nfc_text(k) == part), _MISSING)
            if value is _MISSING:
                return _MISSING
        elif isinstance(value, list) and part.isdecimal() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
    return value


def _literal(doc: dict[str, Any], name: str) -> Any:
    """A form field or multipart part by its whole name (`metadata[order_id]`, `order.title`), `_MISSING` if none."""
    return doc.get(_nfc_text(name), _MISSING)


def _part(doc: dict[str, Any], name: str) -> Any:
    """A multipart part by its whole name, else a dotted path into it (`file.filename`)."""
    value = _literal(doc, name)
    return _find(doc, name) if value is _MISSING else value


def _fields(
    kind: str,
    doc: Any,
    fields: tuple[str, ...],
    key: bytes,
    *,
    lookup: Callable[[Any, str], Any] = _find,
    objects: bool = True,
    scheme: int,
) -> dict[str, Any]:
    """
    The named fields of a parsed body, NFC-normalised (and from scheme 3 with numbers by value),
    with notes: a missing field counts as null (`missing`); a field that holds an object or a
    list of objects is stored as a keyed hash of it (`hashed`), so that two different objects
    still differ but none of their leaves (a token under an unnamed key) is stored.
    `objects=False` keeps objects (multipart's own summary of a file part). `{}` when none of
    the fields is there.
    """
    view: dict[str, Any] = {}
    missing, hashed = [], []
    numbers = key if scheme >= BY_VALUE else None
    for f in fields:
        value = lookup(doc, f)
        if value is _MISSING:
            missing.append(f)
            value = None
        raw, value = value, nfc(value, numbers=numbers)
        if objects and (
            isinstance(value, dict) or (isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value))
        ):
            value = keyed_hash(key, "intent-object", canonical_json(value))
            hashed.append(f)
        elif numbers is not None and hashed_number(raw, value):
            hashed.append(
                f
            )  # a read template cannot use it (reconcile/http_reads.py): its hash is no value to look for
        view[f] = value
    if len(missing) == len(fields):
        return {}
    out: dict[str, Any] = {kind: view}
    if missing:
        out["missing"] = missing
    if hashed:
        out["hashed"] = hashed
    return out


def hashed_number(raw: Any, value: Any) -> bool:
    """Whether `value` (a field's canonical form) holds a number of `raw` as a keyed hash (canonical_number)."""
    if isinstance(raw, list) and isinstance(value, list):
        return any(hashed_number(r, v) for r, v in zip(raw, value, strict=False))
    return isinstance(raw, (int, float)) and not isinstance(raw, bool) and isinstance(value, str)


def _form(body: bytes, codec: str | None = None) -> dict[str, Any] | None:
    """
    An application/x-www-form-urlencoded body as {name: value or [values]} (NFC), or None if it
    is not one. Without `codec` (scheme 2), UTF-8 with %-escapes that are not UTF-8 read as
    U+FFFD; with one (scheme 3, the declared charset or UTF-8), the body and its %-escapes are
    text in that charset, or it is no form.
    """
    try:
        form: dict[str, list[str]] = {}
        if codec is None:
            pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=True)
        else:
            text = body.decode(codec)
            pairs = parse_qsl(text, keep_blank_values=True, strict_parsing=True, encoding=codec, errors="strict")
        for k, v in pairs:
            form.setdefault(_nfc_text(k), []).append(_nfc_text(v))
    except (UnicodeDecodeError, ValueError):
        return None
    return {k: one_value(v) for k, v in form.items()}


def declared_charset(content_type: str) -> str | None:
    """The `charset` parameter of a Content-Type (`application/json; charset="latin-1"`), or None."""
    for param in content_type.split(";")[1:]:
        name, eq, value = param.partition("=")
        if eq and name.strip().lower() == "charset":
            return value.strip().strip('"').strip() or None
    return None


@functools.lru_cache(maxsize=64)
def text_codec(charset: str) -> str | None:
    """The Python codec of a declared charset (`latin1` → `iso8859-1`), or None when it names no text charset."""
    try:
        name = codecs.lookup(charset).name
        b"".decode(name)  # LookupError for a codec that is no text encoding (base64, rot13)
    except (LookupError, ValueError):
        return None
    return None if name.replace("-", "_") in _NOT_CHARSETS else name


@functools.lru_cache(maxsize=64)
def _ascii_superset(codec: str) -> bool:
    """Whether a codec reads every ASCII byte as itself (UTF-8, Latin-1, cp1252; not UTF-16 or UTF-7)."""
    ascii_bytes = bytes(range(128))
    try:
        return ascii_bytes.decode(codec) == ascii_bytes.decode("ascii")
    except UnicodeDecodeError:
        return False


def _whole(body: bytes, fallback: str | None) -> dict[str, Any]:
    view: dict[str, Any] = {"body_sha256": hashlib.sha256(body).hexdigest()}
    if fallback:
        view["fallback"] = fallback
    return view


def body_view(
    fields: tuple[str, ...] | None,
    headers: Mapping[str, str],
    body: bytes,
    graphql: tuple[str, dict[str, Any]] | None = None,
    key: bytes = b"",
    *,
    parse: Callable[..., Any] = read_json,
    scheme: int,
) -> dict[str, Any]:
    """
    The body's part of the intent, under fingerprint scheme `scheme`. `body` is the decoded body
    (bodies.decode_body). When the named fields cannot be read as the rule says, the view says
    which fallback it used (`fallback`, see FALLBACKS), and which named fields were missing or
    hashed. `parse`: how the body is read as JSON, `parse(body)` or `parse(body, codec)` (a
    request's one parse, shared with the body's key: fingerprint.parse_once); it raises BadJson
    for a key twice in one object, which refuses the request.
    """
    if fields == ():
        return {}
    if fields is None:  # the rule names no fields: the whole body identifies the intent, by design
        return _whole(body, None)
    if graphql is not None:
        field_name, args = graphql
        view = _fields("body", args, fields, key, scheme=scheme)
        return {"graphql": field_name, **(view or _whole(body, "no_named_field"))}
    if not body:
        return _whole(body, "empty")
    content_type = headers.get("content-type", "")
    ctype = content_type.split(";")[0].strip().lower()
    if ctype == "multipart/form-data":
        parts = multipart_parts(content_type, body)
        if parts is None:
            return _whole(body, "bad_multipart")
        view = _fields("multipart", nfc(parts), fields, key, lookup=_part, objects=False, scheme=scheme)
        return view or _whole(body, "no_named_field")
    form_codec: str | None = None  # scheme 2: UTF-8, bad %-escapes as U+FFFD
    json_codec: str | None = None  # json.loads's own reading of bytes: UTF-8 (or UTF-16/32 by its zero bytes)
    if scheme >= BY_VALUE:  # the charset the body declares
        charset = declared_charset(content_type) if ";" in content_type else None
        form_codec = "utf-8" if charset is None else text_codec(charset)
        if form_codec is None:
            return _whole(body, "bad_charset")
        if form_codec != "utf-8" and not (body.isascii() and _ascii_superset(form_codec)):
            json_codec = form_codec  # ASCII in an ASCII superset reads as it does undeclared: one parse
    doc = parse(body) if json_codec is None else parse(body, json_codec)
    if ctype == "application/x-www-form-urlencoded":
        return _form_view(fields, body, doc, form_codec, key, scheme=scheme)
    if doc is UNDECODABLE:
        return _whole(body, "bad_charset")
    if not isinstance(doc, dict):  # not JSON, nested too deeply, or a bare number, string or list: no fields
        return _whole(body, "not_json" if doc is NOT_JSON else "not_a_json_object")
    return _fields("body", doc, fields, key, scheme=scheme) or _whole(body, "no_named_field")


def _form_view(
    fields: tuple[str, ...], body: bytes, doc: Any, form_codec: str | None, key: bytes, *, scheme: int
) -> dict[str, Any]:
    """A form-encoded body's view: its named fields; else, a JSON object sent as a form (curl -d), its fields."""
    form = _form(body, form_codec)
    if form is not None:
        view = _fields("form", form, fields, key, lookup=_literal, scheme=scheme)
        if view:
            return view
    # None of the named fields as a form: a JSON object sent with a form content type (curl -d)?
    view = _fields("body", doc, fields, key, scheme=scheme) if isinstance(doc, dict) else {}
    if view:
        return {**view, "fallback": "json_sent_as_form"}
    return _whole(body, "bad_form" if form is None and not isinstance(doc, dict) else "no_named_field")


def one_value(values: list[str] | None) -> Any:
    if not values:
        return None
    return values[0] if len(values) == 1 else values


# --- the stored intent's size --------------------------------------------------------------------

VALUE_BOUND = 4 * 1024  # bytes of a stored value's JSON past which it is stored as a keyed hash of it
READ_VALUE_BOUND = 1024 * 1024  # ...for a value the operation's reconcile read names: the read needs it
NAME_BOUND = 256  # characters of a stored field name (an MCP argument's, a form field's)
ENTRIES_BOUND = 256  # fields stored one by one per part (`from_server` stores every argument of a call)
MORE = "…"  # the part's entry holding a keyed hash of its fields past ENTRIES_BOUND
# The parts of an intent that hold fields, and the prefix a reconcile template names them with.
PARTS = {"path": "path.", "query": "query.", "headers": "header.", "body": "intent.", "form": "intent."}
PARTS["multipart"] = "intent."


def bound_intent(intent: dict[str, Any], key: bytes, reads: Callable[[], frozenset[str]] = frozenset) -> dict[str, Any]:
    """
    The intent as it is stored, in bounded size: a value whose JSON is larger than VALUE_BOUND
    bytes (READ_VALUE_BOUND for one a reconcile read names: `reads()`, template names, asked for
    only when a value is over VALUE_BOUND) is stored as
    a keyed hash of it, as an object is (a read cannot use it, and so fails to plan, rather than
    look for the hash); a name longer than NAME_BOUND as a keyed hash of the name; the fields of a
    part past the first ENTRIES_BOUND as one keyed hash of them all under MORE. The note `bounded`
    lists what was (template names: `intent.params.arguments.content`). Only what is stored is
    bounded: the fingerprint is taken on the whole intent (intent/fingerprint.py), so bounding changes none.
    `intent` itself is returned when nothing is over a bound (every request of nearly every API).
    """
    if not any(
        isinstance(f := intent.get(part), dict) and _over(f, frozenset(), prefix) for part, prefix in PARTS.items()
    ):
        return intent  # nothing over the tightest bounds: the reads' names are not needed
    named = reads()
    bounded: list[str] = []
    out: dict[str, Any] | None = None
    for part, prefix in PARTS.items():
        fields = intent.get(part)
        if not isinstance(fields, dict) or not _over(fields, named, prefix):
            continue
        kept: dict[str, Any] = {}
        items = list(fields.items())
        for name, value in items[:ENTRIES_BOUND]:
            shown = name if len(name) <= NAME_BOUND else keyed_hash(key, "intent-name", name)
            if _too_big(value, READ_VALUE_BOUND if prefix + name in named else VALUE_BOUND):
                value = keyed_hash(key, "intent-bounded", canonical_json(value))
                bounded.append(prefix + shown)
            elif shown != name:
                bounded.append(prefix + shown)
            kept[shown] = value
        if len(items) > ENTRIES_BOUND:
            kept[MORE] = keyed_hash(key, "intent-bounded", canonical_json(dict(items[ENTRIES_BOUND:])))
            bounded.append(prefix + MORE)
        out = out if out is not None else dict(intent)
        out[part] = kept
    if out is None:
        return intent
    out["bounded"] = bounded
    return out


def _over(fields: dict[str, Any], reads: frozenset[str], prefix: str) -> bool:
    """Whether any field of a part is over a bound (the cheap test, on every request)."""
    if len(fields) > ENTRIES_BOUND:
        return True
    return any(
        len(name) > NAME_BOUND or _too_big(value, READ_VALUE_BOUND if prefix + name in reads else VALUE_BOUND)
        for name, value in fields.items()
    )


def _too_big(value: Any, limit: int) -> bool:
    """Whether `value`'s canonical JSON is larger than `limit` bytes."""
    if value is None or isinstance(value, (bool, float)):
        return False
    if isinstance(value, int) and value.bit_length() < 3 * limit:  # fewer than `limit` digits
        return False
    if isinstance(value, str) and 6 * len(value) + 2 <= limit:  # at most 6 bytes a character (\u001f), and quotes
        return False
    return len(canonical_json(value).encode("utf-8", "surrogatepass")) > limit
