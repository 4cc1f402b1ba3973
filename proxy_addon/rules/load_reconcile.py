"""
Loading `reconcile:`: the read that looks for an operation's effect, never another write.

    reconcile:
      read: {url: "/api/articles/me?per_page=100"}        # GET or HEAD; POST only to a path in post_reads
      find: {title: "{intent.article.title}"}              # templates name what the fingerprint records
      absence_provable: true
      pages: {next: {more: has_more, from: data.-1.id, param: starting_after}, max: 5}
      # or: pages: {next: link}   (the answer's Link: <...>; rel="next", GitHub)
      # or, with a comment giving the reason:  complete_in_one_page: true
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from proxy_addon.rules.load_classify import load_classify_rule
from proxy_addon.rules.model import (
    KEYS,
    MAX_PAGES,
    PAGES_LIMIT,
    TEMPLATE_VAR,
    FingerprintSpec,
    PagesSpec,
    ReconcileSpec,
    template_variables,
)
from proxy_addon.rules.nodes import DOTTED, HEADER, Ctx, Entry, node_kind, scalar_value
from proxy_addon.wire.redaction import is_secret_header


def load_reconcile(
    ctx: Ctx,
    f: str,
    node: yaml.Node,
    fp: FingerprintSpec | None,
    external_id: str | tuple[str, ...] | None,
    idempotent: bool = False,
) -> ReconcileSpec | None:
    """
    An operation's `reconcile:` (`f` names the operation); `external_id` is the operation's, the
    default. Each key is checked even when another has a problem (reported to `ctx`); None if
    there was any. `fp` None: the fingerprint has a problem of its own, and the names templates
    use are not checked against it.
    """
    f = f"{f}.reconcile"
    before = len(ctx.problems)
    rec = ctx.mapping(node, f, KEYS["reconcile"], ("read",))
    allowed = template_variables(fp) if fp is not None else None
    if allowed is not None and not idempotent:
        allowed.discard("idempotency_key")
    tool, method, url, headers, body = _read_of(ctx, rec, f, allowed)
    find, bounds = _find(ctx, rec, f, method, allowed)
    items = ctx.attempt(ctx.string, rec["items"][1], f"{f}.items") if "items" in rec else None
    absent_when = (
        ctx.attempt(load_classify_rule, ctx, rec["absent_when"][1], f"{f}.absent_when", verdict=False)
        if "absent_when" in rec
        else None
    )
    provable, settle, retry = _absence(ctx, rec, f)
    rec_external_id = (
        ctx.attempt(ctx.fields, rec["external_id"][1], f"{f}.external_id", allowed, in_read=True)
        if "external_id" in rec
        else external_id
    )
    pages, one_page = _paging(ctx, rec, f, method, tool is not None, bool((find or bounds) and provable))
    if len(ctx.problems) > before:
        return None
    assert method is not None and url is not None and one_page is not None
    return ReconcileSpec(
        pages=pages,
        complete_in_one_page=one_page,
        method=method,
        url=url,
        find=tuple(find),
        items=items,
        absence_provable=provable,
        retry_when_absent=retry,
        external_id=rec_external_id,
        body=body,
        settle=settle,
        absent_when=absent_when,
        headers=tuple(headers),
        bounds=tuple(bounds),
        tool=tool[0] if tool else None,
        tool_read_only=tool[1] if tool else False,
    )


def _read_of(
    ctx: Ctx, rec: dict[str, Entry], f: str, allowed: set[str] | None
) -> tuple[tuple[str, bool, Any] | None, str | None, str | None, list[tuple[str, str]], Any]:
    """
    `read:`: an MCP tool (its name, read_only and arguments), or an HTTP read; then its method, URL,
    headers and body (the tool's arguments for an MCP read). A part with a problem is None (reported).
    """
    read = ctx.attempt(ctx.mapping, rec["read"][1], f"{f}.read", KEYS["read"])
    tool: tuple[str, bool, Any] | None = None
    if read is not None and "tool" in read:  # an MCP read: a read-only tool of the same endpoint
        tool = ctx.attempt(_tool_read, ctx, read, f, allowed)
        method, url, headers, body = ("MCP", "", [], tool[2]) if tool else (None, None, [], None)
    else:
        if read is not None and "url" not in read:
            ctx.report(ctx.error(rec["read"][1], f"{f}.read.url", "is required (or tool: for an MCP read)"))
            read = None
        method = ctx.attempt(_read_method, ctx, read, f) if read is not None else None
        url = ctx.attempt(_read_url, ctx, read, f, allowed) if read is not None else None
        headers = _read_headers(ctx, read, f, allowed) if read is not None else []
        body = (
            ctx.attempt(_post_body, ctx, rec, read, f, method, url, allowed)
            if read is not None and method is not None and url is not None
            else None
        )
    return tool, method, url, headers, body


def _paging(
    ctx: Ctx, rec: dict[str, Entry], f: str, method: str | None, tool: bool, proves_absence: bool
) -> tuple[PagesSpec | None, bool | None]:
    """
    `pages:` (never on an MCP read: one tool call) and `complete_in_one_page:`. `proves_absence`: the
    read finds items and says absence_provable, which `rules check` (ctx.strict) refuses on a read
    that declares neither.
    """
    if tool and "pages" in rec:
        problem = "an MCP read is one tool call: it has no pages (absence_provable needs complete_in_one_page)"
        ctx.report(ctx.error(rec["pages"][1], f"{f}.pages", problem))
    pages = ctx.attempt(_pages, ctx, rec, f, method, "find" in rec) if not tool else None
    one_page = ctx.attempt(_complete_in_one_page, ctx, rec, f)
    if ctx.strict and proves_absence and "pages" not in rec and one_page is False:
        # only `rules check` refuses it: files written before pages: existed still load
        ctx.report(
            ctx.error(
                rec["absence_provable"][0],
                f"{f}.absence_provable",
                "absence_provable: true on a read that declares no pages: a list cut after its "
                "first page proves nothing; declare pages (next: link, or next: {more, from, param}), "
                "or complete_in_one_page: true with a comment giving the reason",
            )
        )
    return pages, one_page


def _tool_read(ctx: Ctx, read: dict[str, Entry], f: str, allowed: set[str] | None) -> tuple[str, bool, Any]:
    """`read: {tool, arguments, read_only}`: an MCP tool of the receipt's own endpoint; arguments are templates."""
    for key in ("method", "url", "headers", "body"):
        if key in read:
            raise ctx.error(read[key][1], f"{f}.read.{key}", "an MCP read names a tool and its arguments, not " + key)
    name = ctx.string(read["tool"][1], f"{f}.read.tool")
    if not name or any(c.isspace() or not c.isprintable() for c in name):
        raise ctx.error(read["tool"][1], f"{f}.read.tool", f"{name!r} is not an MCP tool name")
    declared = ctx.boolean(read["read_only"][1], f"{f}.read.read_only") if "read_only" in read else False
    arguments: Any = {}
    if "arguments" in read:
        anode = read["arguments"][1]
        if not isinstance(anode, yaml.MappingNode):
            raise ctx.error(anode, f"{f}.read.arguments", f"expected a mapping, got {node_kind(anode)}")
        arguments = _json_body(ctx, anode, f"{f}.read.arguments", allowed)
    return name, declared, arguments


def _read_method(ctx: Ctx, read: dict[str, Entry], f: str) -> str:
    method = "GET"
    if "method" in read:
        method = ctx.string(read["method"][1], f"{f}.read.method").upper()
        if method not in ("GET", "HEAD", "POST"):
            raise ctx.error(
                read["method"][1],
                f"{f}.read.method",
                f"{method!r}: a reconcile read is GET or HEAD "
                "(or a POST to a path listed in post_reads), never a write",
            )
    return method


def _read_url(ctx: Ctx, read: dict[str, Entry], f: str, allowed: set[str] | None) -> str:
    url = ctx.template(read["url"][1], f"{f}.read.url", allowed)
    if not (url.startswith("/") or re.match(r"^https?://[^/{}]+", url)):
        raise ctx.error(
            read["url"][1], f"{f}.read.url", f"{url!r} must be a path ('/api/...') or an http(s) URL with a fixed host"
        )
    return url


def _read_headers(ctx: Ctx, read: dict[str, Entry], f: str, allowed: set[str] | None) -> list[tuple[str, str]]:
    """The read's own headers (lower-case name, value template); never ones that carry credentials.
    Each bad one is reported and the next one read."""
    headers = []
    entries = ctx.attempt(ctx.entries, read["headers"][1], f"{f}.read.headers") if "headers" in read else None
    for name, (knode, vnode) in (entries or {}).items():
        where = f"{f}.read.headers.{name}"
        if not HEADER.match(name):
            ctx.report(ctx.error(knode, where, f"{name!r} is not a valid header name"))
        elif is_secret_header(name.lower(), ctx.credential_headers):
            ctx.report(
                ctx.error(
                    knode,
                    where,
                    f"{name!r} carries credentials: a read sends the request's own "
                    "(credentials.header), never a value written in a rules file",
                )
            )
        elif (value := ctx.attempt(ctx.template, vnode, where, allowed)) is not None:
            headers.append((name.lower(), value))
    return headers


def _post_body(
    ctx: Ctx, rec: dict[str, Entry], read: dict[str, Entry], f: str, method: str, url: str, allowed: set[str] | None
) -> dict[str, Any] | None:
    """A POST read's JSON body (only to a path the file lists in post_reads); other reads have none."""
    if method != "POST":
        if "body" in read:
            raise ctx.error(read["body"][1], f"{f}.read.body", f"a {method} read has no body; only a POST read does")
        return None
    path = re.sub(r"^https?://[^/]+", "", TEMPLATE_VAR.sub("x", url)).split("?", 1)[0] or "/"
    if not any(t.match(path) is not None for t in ctx.post_reads):
        listed = ", ".join(t.template for t in ctx.post_reads) or "none"
        raise ctx.error(
            read["method"][1],
            f"{f}.read.method",
            "a reconcile read is GET or HEAD, never a write; "
            f"a POST read is allowed only to a path listed in post_reads (listed: {listed}); "
            f"{url!r} is not one of them",
        )
    if "body" not in read:
        raise ctx.error(rec["read"][1], f"{f}.read.body", "a POST read needs a body (a mapping, sent as JSON)")
    bnode = read["body"][1]
    if not isinstance(bnode, yaml.MappingNode):
        raise ctx.error(bnode, f"{f}.read.body", f"expected a mapping, got {node_kind(bnode)}")
    body = {}
    for key, value in bnode.value:
        name = ctx.string(key, f"{f}.read.body")
        if name == "query":  # a GraphQL document is sent as written; values go in variables
            from proxy_addon.wire.gql import read_is_query

            body[name] = ctx.string(value, f"{f}.read.body.query")
            if (why := read_is_query(body[name])) is not None:
                raise ctx.error(value, f"{f}.read.body.query", why)
        else:
            body[name] = _json_body(ctx, value, f"{f}.read.body.{name}", allowed)
    return body


def _json_body(ctx: Ctx, node: yaml.Node, field_: str, allowed: set[str] | None) -> Any:
    """A POST read's JSON body: its strings may be templates."""
    if isinstance(node, yaml.MappingNode):
        out = {}
        for key, value in node.value:
            name = ctx.string(key, field_)
            out[name] = _json_body(ctx, value, f"{field_}.{name}", allowed)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_json_body(ctx, item, f"{field_}[{i}]", allowed) for i, item in enumerate(node.value)]
    if node.tag == "tag:yaml.org,2002:str":
        return ctx.template(node, field_, allowed)
    return scalar_value(node)


def _find(
    ctx: Ctx, rec: dict[str, Entry], f: str, method: str | None, allowed: set[str] | None
) -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
    """`find:`: field → value template, or field → {gte, lte} bounds (like created_at). Each bad
    entry is reported and the next one read; `method` None (it has a problem): not checked against it."""
    find: list[tuple[str, str]] = []
    bounds: list[tuple[str, str, str]] = []
    if "find" not in rec:
        return find, bounds
    fnode = rec["find"][1]
    entries = ctx.attempt(ctx.entries, fnode, f"{f}.find")
    if entries is None:
        return find, bounds
    for name, (knode, vnode) in entries.items():
        where = f"{f}.find.{name}"
        if not DOTTED.match(name):
            ctx.report(ctx.error(knode, where, f"{name!r} is not a dotted field path"))
        elif isinstance(vnode, yaml.MappingNode):  # {gte: "{submitted_at_unix}"}: a bound, not a value
            test = ctx.mapping(vnode, where, ("gte", "lte"))
            if not vnode.value:
                ctx.report(ctx.error(vnode, where, "expected gte or lte"))
            for kind, (_, bnode) in test.items():
                if (value := ctx.attempt(ctx.template, bnode, f"{where}.{kind}", allowed)) is not None:
                    bounds.append((name, kind, value))
        elif (value := ctx.attempt(ctx.template, vnode, where, allowed)) is not None:
            find.append((name, value))
    if not entries:
        ctx.report(
            ctx.error(
                fnode, f"{f}.find", "must name at least one field; leave find out to let the read's status decide"
            )
        )
    elif method == "HEAD":
        ctx.report(ctx.error(fnode, f"{f}.find", "a HEAD read has no body to search; use GET or leave find out"))
    return find, bounds


def _absence(ctx: Ctx, rec: dict[str, Entry], f: str) -> tuple[bool, int, bool]:
    """absence_provable, settle and retry_when_absent (the last two need the first); each checked."""
    provable = (
        ctx.attempt(ctx.boolean, rec["absence_provable"][1], f"{f}.absence_provable")
        if "absence_provable" in rec
        else False
    )
    settle = ctx.attempt(ctx.duration, rec["settle"][1], f"{f}.settle") if "settle" in rec else 0
    if "settle" in rec and provable is False:
        ctx.report(
            ctx.error(rec["settle"][1], f"{f}.settle", "needs absence_provable: true; settle says when absence counts")
        )
    retry = (
        ctx.attempt(ctx.boolean, rec["retry_when_absent"][1], f"{f}.retry_when_absent")
        if "retry_when_absent" in rec
        else False
    )
    if retry and provable is False:
        ctx.report(
            ctx.error(
                rec["retry_when_absent"][1],
                f"{f}.retry_when_absent",
                "needs absence_provable: true; a retry is safe only when absence is proven",
            )
        )
    return bool(provable), settle or 0, bool(retry)


_PARAM = re.compile(r"^[A-Za-z0-9_\-\[\]]+\Z")


def _pages(ctx: Ctx, rec: dict[str, Entry], f: str, method: str | None, finds: bool) -> PagesSpec | None:
    """`pages:` how the read's list continues: `next: link`, or `next: {more, from, param}`; `max` pages.
    `method` None (it has a problem): not checked against it."""
    if "pages" not in rec:
        return None
    where = f"{f}.pages"
    pnode = rec["pages"][1]
    pages = ctx.mapping(pnode, where, KEYS["pages"], ("next",))
    if not finds:
        raise ctx.error(pnode, where, "only a read with find has pages to walk; leave pages out")
    top = MAX_PAGES
    if "max" in pages:
        mnode = pages["max"][1]
        if mnode.tag != "tag:yaml.org,2002:int" or not 1 <= int(mnode.value) <= PAGES_LIMIT:
            raise ctx.error(mnode, f"{where}.max", f"expected a whole number from 1 to {PAGES_LIMIT}")
        top = int(mnode.value)
    nnode = pages["next"][1]
    if isinstance(nnode, yaml.ScalarNode):
        if nnode.value != "link" or nnode.tag != "tag:yaml.org,2002:str":
            raise ctx.error(nnode, f"{where}.next", "expected link, or a mapping {more, from, param}")
        if method is not None and method != "GET":
            raise ctx.error(nnode, f"{where}.next", "a Link header's next page is a GET; this read is " + method)
        return PagesSpec(link=True, max=top)
    nxt = ctx.mapping(nnode, f"{where}.next", KEYS["pages_next"], ("from", "param"))
    more = ctx.string(nxt["more"][1], f"{where}.next.more") if "more" in nxt else None
    from_ = ctx.string(nxt["from"][1], f"{where}.next.from")
    param = ctx.string(nxt["param"][1], f"{where}.next.param")
    for name, value in (("more", more), ("from", from_)):
        if value is not None and not DOTTED.match(value):
            raise ctx.error(nxt[name][1], f"{where}.next.{name}", f"{value!r} is not a dotted field path")
    if method == "POST" and not DOTTED.match(param):
        raise ctx.error(nxt["param"][1], f"{where}.next.param", f"{param!r} is not a dotted path of the body")
    if method not in (None, "POST") and not _PARAM.match(param):  # None: the method has a problem of its own
        raise ctx.error(nxt["param"][1], f"{where}.next.param", f"{param!r} is not a query parameter name")
    return PagesSpec(more=more, from_=from_, param=param, max=top)


def _complete_in_one_page(ctx: Ctx, rec: dict[str, Entry], f: str) -> bool:
    """`complete_in_one_page: true`: the rule vouches that one page holds every match; a comment says why."""
    if "complete_in_one_page" not in rec:
        return False
    knode, vnode = rec["complete_in_one_page"]
    where = f"{f}.complete_in_one_page"
    value = ctx.boolean(vnode, where)
    if value and "pages" in rec:
        raise ctx.error(knode, where, "a read that declares pages is not one page; leave one of them out")
    if value and not _has_comment(knode):
        raise ctx.error(knode, where, "say why one page holds every match in a comment (on this line or the one above)")
    return value


def _has_comment(node: yaml.Node) -> bool:
    """Whether the key's line, or the line above it, carries a YAML comment."""
    buffer = getattr(node.start_mark, "buffer", None)
    if not isinstance(buffer, str):
        return False
    lines = buffer.split("\n")
    line = node.start_mark.line
    here = lines[line] if line < len(lines) else ""
    above = lines[line - 1].strip() if line > 0 else ""
    return " #" in here or above.startswith("#")
