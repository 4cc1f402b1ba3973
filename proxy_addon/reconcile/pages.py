"""
Pagination of a reconcile read: where its list continues, and whether an answer says it does.

    nxt = next_page(spec, read, doc, headers)   # a ReadRequest, None (the list ended) or why nothing is proven

A read that declares `pages:` follows them: the answer's `Link: <url>; rel="next"` (on the same
origin only), or a field of the answer (`has_more` true, the last item's id or a cursor) put in a
query parameter (GET) or at a dotted path of the JSON body (POST). A read that declares none reads
one page; when that page says there is more (`has_more: true`, a next cursor, a next Link), its
"not found" proves nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote_plus, urljoin

import httpx

from proxy_addon.reconcile.http_reads import ReadRequest
from proxy_addon.rules import ReconcileSpec
from proxy_addon.wire.jsonpath import dig

_LINK = re.compile(r"<([^>]*)>((?:\s*;\s*[^;,]*)*)")
_REL_NEXT = re.compile(r"""rel\s*=\s*"?[^"]*\bnext\b""", re.IGNORECASE)
# Fields by which common APIs say a list goes on: Stripe/OpenAI/Notion has_more, cursors, GraphQL pageInfo.
_MORE_FLAGS = ("has_more", "hasMore", "pageInfo.hasNextPage", "page_info.has_next_page")
_MORE_CURSORS = ("next_cursor", "nextCursor", "next_page_token", "nextPageToken")


def link_next(headers: Mapping[str, str]) -> str | None:
    """The `rel="next"` URL of a Link header (RFC 8288), or None."""
    for url, params in _LINK.findall(headers.get("link", "")):
        if _REL_NEXT.search(params):
            return url
    return None


def dig_page(doc: Any, dotted: str) -> Any:
    """`dig`, where a negative index counts from a list's end (`data.-1.id`: the last item's id)."""
    value = doc
    for part in dotted.split("."):
        if isinstance(value, list) and re.fullmatch(r"-[0-9]+", part) and -int(part) <= len(value):
            value = value[int(part)]
        else:
            value = dig(value, part)
            if value is None:
                return None
    return value


def says_more(doc: Any, headers: Mapping[str, str], items: str | None) -> str | None:
    """How an answer says its list goes on (for a read that declares no pages), or None."""
    if link_next(headers) is not None:
        return 'a Link rel="next" header'
    parts = items.split(".") if items else []
    containers = [dig(doc, ".".join(parts[:n])) if n else doc for n in range(len(parts), -1, -1)]
    for where, c in zip(range(len(parts), -1, -1), containers, strict=True):
        if not isinstance(c, dict):
            continue
        prefix = ".".join(parts[:where])
        for name in _MORE_FLAGS:
            if dig(c, name) is True:
                return f"{prefix + '.' if prefix else ''}{name}: true"
        for name in _MORE_CURSORS:
            if dig(c, name) not in (None, ""):
                return f"a {prefix + '.' if prefix else ''}{name}"
    return None


def _same_origin(a: str, b: str) -> bool:
    ua, ub = httpx.URL(a), httpx.URL(b)
    return (ua.scheme, ua.host, ua.port) == (ub.scheme, ub.host, ub.port)


def _with_param(url: str, name: str, value: str) -> str:
    """The URL with query parameter `name` set to `value` (any earlier one removed), the rest as written."""
    base, _, query = url.partition("?")
    kept = [p for p in re.split("[&;]", query) if p and unquote_plus(p.partition("=")[0]) != name]
    return f"{base}?{'&'.join([*kept, f'{quote(name, safe="[]")}={quote(value, safe="")}'])}"


def _with_body(body: bytes, dotted: str, value: Any) -> bytes | None:
    """The POST read's JSON body with `value` at the dotted path; None when the body is no JSON object."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    node = doc
    *path, last = dotted.split(".")
    for part in path:
        nxt = node.get(part) if isinstance(node, dict) else None
        if not isinstance(nxt, dict):
            nxt = {}
            node[part] = nxt
        node = nxt
    node[last] = value
    return json.dumps(doc).encode()


def next_page(spec: ReconcileSpec, read: ReadRequest, doc: Any, headers: Mapping[str, str]) -> ReadRequest | str | None:
    """
    The read of the next page; None when the list ended here; a reason (str) when the answer says
    there is more but the read cannot follow it (no pages declared, a Link to another origin, a
    `more` flag without the field that names the next page): then "not found" proves nothing.
    """
    pages = spec.pages
    if pages is None:
        more = says_more(doc, headers, spec.items)
        return None if more is None else f"the answer says the list goes on ({more}) and the rule declares no pages"
    if pages.link:
        link = link_next(headers)
        if link is None:
            return None
        url = urljoin(read.url, link)
        if not _same_origin(url, read.url):
            return f'the Link rel="next" points to another origin ({httpx.URL(url).host}); pages are read on one origin'
        return ReadRequest(read.method, url, read.body, read.headers, keep=read.keep)
    if pages.more is not None:
        flag = dig_page(doc, pages.more)
        if flag is False:
            return None
        if flag is not True:
            return f"the answer has no true or false at {pages.more}, so whether the list goes on is unknown"
    assert pages.from_ is not None and pages.param is not None
    value = dig_page(doc, pages.from_)
    if value is None or value == "" or isinstance(value, (dict, list, bool)):
        if pages.more is None:
            return None  # no cursor: the list ended
        return f"the answer says the list goes on but has no value at {pages.from_} to ask for the next page"
    if read.body is not None:
        body = _with_body(read.body, pages.param, value)
        if body is None:
            return f"the read's body is not a JSON object: {pages.param} cannot be set in it"
        return ReadRequest(read.method, read.url, body, read.headers, keep=read.keep)
    text = value if isinstance(value, str) else json.dumps(value)
    return ReadRequest(read.method, _with_param(read.url, pages.param, text), None, read.headers, keep=read.keep)
