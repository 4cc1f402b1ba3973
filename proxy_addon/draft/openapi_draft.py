"""
A rules file drafted from an OpenAPI document (`receipts rules draft --openapi FILE`).

    draft = draft_openapi(read_document(Path("resend.yaml")), host=None, writes=None)
    print(write_draft(draft))

Each POST, PUT, PATCH and DELETE becomes an operation, named from its operationId (or its
method and path), with its path template; a POST whose name reads as a read (a search) goes to
`post_reads`. An RPC-style API (Slack's `/chat.postMessage`: most paths are `family.method`, or
`writes` is given) is drafted by method names instead: a method is a write when `writes` (a
regular expression) finds its name, or, without it, when its name does not read as a read
(draft/read_names.py); every write matches POST, every read goes to `post_reads`.

What an operation gets (each only where the document says enough; else a TODO naming where
in the document the drafter looked):
- `fingerprint.body`: the request schema's required properties and identifying ones
  (schema_fields.IDENTIFYING), never one that looks like a secret or a blob;
- `idempotency_key`: the operation declares an Idempotency-Key-like header;
- `external_id`: the success answer's `id`-like property, or an `id`-like answer header;
- `record: false`: the success answer holds a property named like a secret (an API key created);
- `reconcile`: a list GET on the same collection (its `limit` and cursor parameters), or a GET on
  the resource a PUT or PATCH changes; never `absence_provable: true`;
- `classify`: only for APIs that answer 200 with `ok: false`; there an error is `outcome_unknown`
  until the user sorts the documented ones. No 409 is ever a refusal: the defaults make it
  `already_exists`, and the comment names each documented 4xx for the user to sort.
The file's `credentials` come from the security schemes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from proxy_addon.draft.draft_model import DraftFile, DraftOperation
from proxy_addon.draft.openapi_document import MUTATING, ApiDocument, ApiOperation, Param, pointer
from proxy_addon.draft.read_names import family, is_rpc_style, reading_word
from proxy_addon.draft.schema_fields import (
    body_fields,
    boolean_field,
    id_field,
    list_items,
    object_view,
    scalar_fields,
)
from proxy_addon.errors import DraftError
from proxy_addon.rules.model import parse_path_template
from proxy_addon.wire.redaction import is_credential_param, is_secret_name

IDEMPOTENCY_HEADER = re.compile(r"idempot", re.I)
LIMIT_PARAMS = ("limit", "per_page", "page_size", "pageSize", "count", "max_results")
NO_HOST = "api.example.invalid"
_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


def draft_openapi(
    doc: ApiDocument, *, host: str | None = None, writes: re.Pattern[str] | None = None, api: str | None = None
) -> DraftFile:
    """The rules file drafted from `doc`: `host` in place of the document's servers, `writes` for an RPC API."""
    hosts = [host] if host else list(doc.hosts)
    draft = DraftFile(api=api or api_name(hosts, doc.title), hosts=hosts or [NO_HOST], source=doc.source)
    draft.notes += [
        f"Drafted by `receipts rules draft` from {doc.source}: {doc.title or 'an API'} "
        f"({'Swagger' if doc.version == '2.0' else 'OpenAPI'} {doc.version}).",
        "A draft is a start, not a pack: read every TODO (`receipts rules check` lists them as warnings) and "
        "`receipts rules explain` a request of each operation before the proxy enforces it (docs/rules.md, "
        '"Start from a draft").',
        "Errors: no `classify:` rule means the defaults: 2xx succeeded; 409 already_exists (it may mean executed: "
        "a read decides, or a person; never a refusal); 408 and 5xx outcome_unknown; every other 4xx rejected "
        "(refused before executing: the next attempt goes out with a fresh key). Keep a 4xx rejected only where "
        'the API refuses before it acts (docs/rules.md, "Defaults: refused before executing, or maybe executed").',
        "Reads: a drafted reconcile read never proves absence (absence_provable: false: not found goes to manual "
        "review). Set it true only where the read sees every item the write could have made (every page, no lag; "
        "`settle:` for a list that lags), and check that `find` compares values as the API stores them.",
    ]
    if not hosts:
        draft.todos.append(
            f"the document names no host (#/servers, #/host): give --host, or write the API's host in `hosts`; "
            f"{NO_HOST} is a placeholder that matches nothing"
        )
    draft.todos += [f"the document's {note}" for note in doc.notes]
    _credentials(doc, draft)
    rpc = writes is not None or is_rpc_style(op.path for op in doc.operations)
    if rpc:
        _rpc_operations(doc, draft, writes)
    else:
        _rest_operations(doc, draft)
    if not draft.operations:
        raise_no_writes(doc)
    draft.operations.sort(key=lambda op: _precedence(op.path))  # a literal segment before a {param} in its place
    return draft


def raise_no_writes(doc: ApiDocument) -> None:
    raise DraftError(
        "no operation of the document is a write (POST, PUT, PATCH, DELETE, or an RPC method that --writes matches)",
        source=doc.source,
        where="#/paths",
    )


def api_name(hosts: list[str], title: str) -> str:
    """`api.resend.com` → `resend`, `slack.com` → `slack`; else the title's first word, lower case."""
    if hosts:
        labels = hosts[0].split(":")[0].split(".")
        if len(labels) >= 2 and not labels[-1].isdecimal():
            return labels[-2]
    words = re.findall(r"[a-z0-9]+", title.lower())
    return words[0] if words else "api"


def _precedence(path: str) -> list[int]:
    return [1 if "{" in seg else 0 for seg in path.split("/")]


# --- the file's credentials --------------------------------------------------------------------


def _credentials(doc: ApiDocument, draft: DraftFile) -> None:
    """`credentials:` from the security schemes the operations use (all of them when none says)."""
    used = {name for op in doc.operations for name in op.security} or set(doc.schemes)
    headers: list[str] = []
    query: list[str] = []
    scheme = None
    for name in sorted(used):
        s = doc.schemes.get(name)
        where = pointer("components" if doc.version != "2.0" else "securityDefinitions", name)
        if s is None:
            continue
        kind = str(s.get("type", ""))
        if kind in ("oauth2", "openIdConnect") or (kind == "http" and str(s.get("scheme", "")).lower() == "bearer"):
            headers.append("Authorization")
            scheme = scheme or "Bearer"
        elif kind in ("http", "basic"):
            headers.append("Authorization")
            draft.todos.append(
                f"{where}: HTTP {s.get('scheme', 'basic')} authentication: the Authorization header is the "
                "credential; reads from the CLI need the whole header value (no `scheme:`)"
            )
        elif kind == "apiKey" and s.get("in") == "header" and isinstance(s.get("name"), str):
            headers.append(s["name"])
        elif kind == "apiKey" and s.get("in") == "query" and isinstance(s.get("name"), str):
            query.append(s["name"])
        else:
            draft.todos.append(
                f"the security scheme {where} ({kind} in {s.get('in', '?')}) is not drafted: "
                'a Cookie counts by itself when nothing else carries a credential (docs/rules.md, "Credentials")'
            )
    if not headers and not query:
        draft.todos.append(
            "the document declares no security scheme the drafter knows (#/components/securitySchemes): name the "
            "header, query parameter or body field that carries the API key in `credentials:`"
        )
        return
    cred: dict[str, Any] = {}
    headers = list(dict.fromkeys(headers))
    if headers:
        cred["header"] = headers[0] if len(headers) == 1 else headers
    if query:
        cred["query"] = query
    env = re.sub(r"[^A-Z0-9]+", "_", draft.api.upper()).strip("_") + "_API_KEY"
    cred["env"] = env if re.match(r"^[A-Z_]", env) else "API_KEY"
    if scheme:
        cred["scheme"] = scheme
    draft.credentials = cred
    draft.credentials_notes.append(
        f"From the security schemes ({', '.join(sorted(used))}): the proxy keeps a keyed hash of them, never "
        f"the value; {cred['env']} holds the key for reads run from the CLI (`receipts reconcile`)."
    )


# --- REST --------------------------------------------------------------------------------------


def _rest_operations(doc: ApiDocument, draft: DraftFile) -> None:
    gets = {op.path: op for op in doc.operations if op.method == "GET"}
    names: set[str] = set()
    seen: dict[tuple[str, str], str] = {}
    for op in doc.operations:
        if op.method not in MUTATING:
            continue
        path = _template(doc, op, draft)
        if path is None:
            continue
        word = reading_word(op.operation_id or "") or (
            reading_word(op.path.rstrip("/").rsplit("/", 1)[-1]) if "{" not in op.path.rsplit("/", 1)[-1] else None
        )
        if op.method == "POST" and word:
            draft.post_reads.append(
                (
                    path,
                    f"{op.pointer} ({op.operation_id or 'no operationId'}): reads as a read ({word!r}): "
                    "not drafted as a write",
                )
            )
            continue
        name = _unique(_op_name(op), names)
        key = (op.method, _shape(path))
        if key in seen:
            draft.left_out.append(
                f"left out: {op.method} {path} ({op.pointer}): {seen[key]} has the same method and path"
            )
            continue
        seen[key] = name
        d = DraftOperation(name=name, method=op.method, path=path, description=op.summary)
        _fingerprint(doc, op, d)
        _idempotency(op, d)
        _answers(doc, op, d)
        _rest_reconcile(doc, op, d, gets)
        draft.operations.append(d)


def _template(doc: ApiDocument, op: ApiOperation, draft: DraftFile) -> str | None:
    """The operation's path template with the base path, its parameters named as rules name them (None: none fits)."""
    path = re.sub(r"\{([^{}]*)\}", lambda m: "{" + _param_name(m.group(1)) + "}", doc.base_path + op.path)
    try:
        parse_path_template(path)
    except ValueError as e:
        draft.left_out.append(f"left out: {op.method} {op.path} ({op.pointer}): {e}")
        return None
    return path


def _param_name(name: str) -> str:
    clean = re.sub(r"\W", "_", name)
    return clean if re.match(r"^[A-Za-z_]", clean) else f"p_{clean}"


def _shape(path: str) -> str:
    return re.sub(r"\{[^{}]*\}", "{}", path)


def _unique(name: str, names: set[str]) -> str:
    candidate, n = name, 2
    while candidate in names:
        candidate, n = f"{name}-{n}", n + 1
    names.add(candidate)
    return candidate


def _op_name(op: ApiOperation) -> str:
    """From the operationId (`emails/send` → `emails.send`), else the method and path (`post.emails.id.cancel`)."""
    if op.operation_id:
        name = _NAME_BAD.sub("_", op.operation_id.replace("/", ".").replace(" ", "_")).strip("._-")
        if name and re.match(r"^[A-Za-z0-9_]", name):
            return name
    parts = [p.strip("{}") for p in op.path.split("/") if p]
    name = _NAME_BAD.sub("_", ".".join([op.method.lower(), *parts]))
    return name.strip("._-") or op.method.lower()


# --- what each operation gets ------------------------------------------------------------------


def _fingerprint(doc: ApiDocument, op: ApiOperation, d: DraftOperation, body_schema: Any = None) -> None:
    """`fingerprint.body` (and `query`): required and identifying fields, never secrets or blobs."""
    schema = body_schema if body_schema is not None else op.body_schema
    fp: dict[str, list[str]] = {}
    required_query = [p.name for p in op.params if p.where == "query" and p.required and not is_secret_name(p.name)]
    other_query = [p.name for p in op.params if p.where == "query" and not p.required and not is_secret_name(p.name)]
    if required_query:
        fp["query"] = required_query
    if other_query:
        d.todos.append(
            f"query parameters not in the fingerprint ({', '.join(other_query)}; {op.pointer}/parameters): "
            "add to fingerprint.query those that make two writes different"
        )
    if schema is None:
        if op.method != "DELETE":
            d.notes.append(f"{op.pointer}: no request body documented: the whole body (if any) is hashed")
        d.fingerprint = fp or None
        return
    fields = body_fields(doc.refs, schema, op.body_pointer)
    chosen = [f for f in fields.chosen if not IDEMPOTENCY_HEADER.search(f)]
    left = []
    if fields.secrets:
        left.append(f"looks like a secret, never fingerprinted: {', '.join(fields.secrets)}")
    if fields.blobs:
        left.append(f"a blob (bytes, base64 or a free-form object): {', '.join(fields.blobs)}")
    if fields.others:
        left.append(f"neither required nor identifying: {', '.join(fields.others)}")
    if chosen:
        fp["body"] = chosen
        why = "the schema's required properties" if fields.required else "identifying properties (none is required)"
        d.notes.append(f"fingerprint.body: {why} of {op.body_pointer} ({op.body_type}).")
        if left:
            d.todos.append(
                "a write that differs from an earlier one only outside fingerprint.body is taken for its retry "
                f"(blocked or replayed): add the fields that tell writes apart. Left out of {op.body_pointer}: "
                + "; ".join(left)
            )
    elif fields.others or fields.blobs or fields.secrets:
        d.todos.append(
            f"no required or identifying property in {op.body_pointer}: the whole body is hashed (any difference "
            "makes a new write, a retry must be byte for byte the same); name the fields that make a write in "
            "fingerprint.body. " + "; ".join(left)
        )
    else:
        d.todos.append(f"{op.body_pointer} describes no object properties: the whole body is hashed")
    d.fingerprint = fp or None


def _idempotency(op: ApiOperation, d: DraftOperation) -> None:
    header = next((p.name for p in op.params if p.where == "header" and IDEMPOTENCY_HEADER.search(p.name)), None)
    if header is None:
        return
    d.idempotency_key = {"header": header}
    d.todos.append(
        f"{op.pointer}/parameters declares the header {header}: the proxy sends its own key there, the same one "
        "with a retry. How long does the API keep a key? The document does not say: add `ttl:` (Stripe and "
        "Resend keep one 24h), or an unknown outcome is never resent without a read"
    )


def _success(op: ApiOperation) -> tuple[Any, str, tuple[str, ...]] | None:
    """The first 2xx answer: its schema, where it is, its header names."""
    ok = sorted((a for a in op.answers if a.status.upper().startswith("2")), key=lambda a: a.status)
    return (ok[0].schema, ok[0].pointer, ok[0].headers) if ok else None


def _answers(doc: ApiDocument, op: ApiOperation, d: DraftOperation) -> None:
    """`external_id`, `record: false` and `classify` (an `ok: false` API), and the TODO on documented errors."""
    success = _success(op)
    errors = sorted(a.status for a in op.answers if a.status.upper().startswith("4"))
    if success is None:
        d.todos.append(
            f"{op.pointer}/responses documents no 2xx answer: set external_id if the answer names the object"
        )
    else:
        schema, where, headers = success
        ident = id_field(doc.refs, schema, where) if schema is not None else None
        header = next((h for h in headers if re.search(r"(^|-)id$", h, re.I) and not is_secret_name(h)), None)
        if ident:
            d.external_id = ident
        elif header:
            d.external_id = {"header": header}
        else:
            d.todos.append(
                f"the success answer ({where}) has no id-like property or header: set external_id if it names "
                "the object"
            )
        secrets = _secret_answer_fields(doc, schema, where) if schema is not None else []
        if secrets:
            d.record = False
            d.notes.append(
                f"record: false: the success answer ({where}) holds {', '.join(secrets)}: kept nowhere, so a "
                "duplicate is answered 409 duplicate_succeeded, never replayed"
            )
        if schema is not None and boolean_field(doc.refs, schema, where, "ok"):
            _ok_envelope(doc, op, d)
            return
    d.classify_notes.append(
        f"TODO: sort the documented errors ({op.pointer}/responses: {', '.join(errors)}): the defaults apply "
        "(the file's head); write `classify:` rules for those that may come after the API acted"
        if errors
        else f"TODO: the document lists no 4xx answer ({op.pointer}/responses): the defaults apply (the file's head); "
        "check the API's own pages for errors that may come after it acted"
    )


def _secret_answer_fields(doc: ApiDocument, schema: Any, where: str) -> list[str]:
    view = object_view(doc.refs, schema, where)
    found = [n for n in view.properties if is_secret_name(n)]
    for wrapper in ("data", "result"):
        if wrapper in view.properties:
            inner = object_view(doc.refs, view.properties[wrapper], f"{where}/properties/{wrapper}")
            found += [f"{wrapper}.{n}" for n in inner.properties if is_secret_name(n)]
    return found


def _ok_envelope(doc: ApiDocument, op: ApiOperation, d: DraftOperation) -> None:
    """An API that answers 200 with `{"ok": false, "error": ...}`: every error is unknown until sorted."""
    codes: list[str] = []
    for a in op.answers:
        if a.schema is not None and not a.status.startswith("2"):
            error = object_view(doc.refs, a.schema, a.pointer).properties.get("error") or {}
            codes += [str(c) for c in error.get("enum") or () if str(c) not in codes]
    d.classify = [
        {"status": 200, "body": {"ok": True}, "state": "succeeded"},
        {
            "status": 200,
            "body": {"ok": False},
            "state": "outcome_unknown",
            "reason": "an error this draft has not sorted: it may come after the API acted",
        },
        {"status": 200, "state": "outcome_unknown", "reason": "a 200 answer without ok true or false"},
    ]
    d.classify_notes.append(
        f"TODO: the API answers 200 with ok: false on errors ({op.pointer}/responses). Sort its documented "
        f"errors ({', '.join(codes) or 'none listed'}): add a rule `{{status: 200, body: {{ok: false, error: "
        "[...]}, state: rejected}` before the second one for those that refuse the call before it runs "
        "(invalid_auth, missing_scope, ratelimited, ...), and keep those that may come after it acted "
        "(internal_error, fatal_error) outcome_unknown."
    )


# --- reconcile reads ---------------------------------------------------------------------------


def _rest_reconcile(doc: ApiDocument, op: ApiOperation, d: DraftOperation, gets: Mapping[str, ApiOperation]) -> None:
    last = op.path.rstrip("/").rsplit("/", 1)[-1]
    body = (d.fingerprint or {}).get("body", [])
    if op.method == "POST" and "{" not in last and op.path in gets:
        _list_read(doc, op, d, gets[op.path], body)
    elif op.method in ("PUT", "PATCH") and op.path in gets:
        _object_read(doc, op, d, gets[op.path], body)
    elif op.method == "DELETE":
        d.reconcile_notes.append(
            f"TODO: no reconcile read ({op.pointer}): a read that finds the object would say the delete did not "
            "happen, and `reconcile` counts found as succeeded. An unknown outcome goes to manual review "
            "(`receipts resolve`)"
        )
    else:
        d.reconcile_notes.append(
            f"TODO: no reconcile read: the document has no GET on {op.path} ({pointer('paths', op.path)}) that "
            "shows what this write makes. "
            "Without one, an unknown outcome goes to manual review (`receipts resolve`)"
        )


def _read_url(doc: ApiDocument, path: str) -> str | None:
    """The read's URL template: the path with `{path.x}` for each parameter; None if one carries a credential."""
    params = re.findall(r"\{([^{}]*)\}", path)
    if any(is_credential_param(_param_name(p)) for p in params):
        return None
    return re.sub(r"\{([^{}]*)\}", lambda m: "{path." + _param_name(m.group(1)) + "}", doc.base_path + path)


def _list_read(doc: ApiDocument, op: ApiOperation, d: DraftOperation, get: ApiOperation, body: list[str]) -> None:
    success = _success(get)
    items_at, item_schema = list_items(doc.refs, success[0], success[1]) if success and success[0] else (None, None)
    if item_schema is None:
        d.reconcile_notes.append(
            f"TODO: no reconcile read: GET {get.path}'s answer ({get.pointer}/responses) is no list"
        )
        return
    item_where = f"{success[1] if success else get.pointer}/items"
    scalars = scalar_fields(doc.refs, item_schema, item_where)
    find = [f for f in body if f in scalars]
    url = _read_url(doc, get.path)
    if not find or url is None:
        d.reconcile_notes.append(
            f"TODO: no reconcile read: the items of GET {get.path} ({get.pointer}) "
            + (
                "have none of the fingerprint's body fields to find this write by"
                if url
                else "need a path parameter that carries a credential"
            )
        )
        return
    query = {p.name: p for p in get.params if p.where == "query"}
    limit = next((n for n in LIMIT_PARAMS if n in query), None)
    if limit:
        top = query[limit].schema.get("maximum")
        url += f"?{limit}={int(top) if isinstance(top, int | float) and 0 < top <= 1000 else 100}"
    rec: dict[str, Any] = {"read": {"method": "GET", "url": url}}
    if items_at:
        rec["items"] = items_at
    rec["find"] = {f: "{intent." + f + "}" for f in find}
    rec["absence_provable"] = False
    pages = _pages(doc, get, success, items_at, item_schema, item_where, query)
    if isinstance(pages, dict):
        rec["pages"] = pages
    item_id = "id" if "id" in object_view(doc.refs, item_schema, item_where).properties else None
    if item_id and d.external_id != item_id:
        rec["external_id"] = item_id
    d.reconcile = rec
    d.reconcile_notes.append(
        f"From GET {get.path} ({get.pointer}): an unknown outcome is looked for among the listed items with the "
        "fingerprint's fields."
    )
    if isinstance(pages, str):
        d.reconcile_notes.append("TODO: " + pages)
    d.reconcile_notes.append(
        "TODO: absence_provable: false (not found goes to manual review): set it true only if this read sees "
        "every item the write could have made (the file's head)"
    )


def _pages(
    doc: ApiDocument,
    get: ApiOperation,
    success: tuple[Any, str, tuple[str, ...]] | None,
    items_at: str | None,
    item_schema: Mapping[str, Any],
    item_where: str,
    query: Mapping[str, Param],
) -> dict[str, Any] | str | None:
    """`pages:` from the list's cursor parameters, or a TODO's text when it pages in a way `pages` cannot follow."""
    answer = object_view(doc.refs, success[0], success[1]) if success and success[0] else None
    props = answer.properties if answer else {}
    items = object_view(doc.refs, item_schema, item_where).properties
    for param in ("after", "starting_after"):
        if param in query and "has_more" in props and "id" in items and items_at:
            return {"next": {"more": "has_more", "from": f"{items_at}.-1.id", "param": param}, "max": 5}
    for param in ("cursor", "page_token", "pageToken", "next_cursor"):
        if param in query:
            for holder in ("", "response_metadata", "meta", "pagination", "paging"):
                inner = (
                    props
                    if not holder
                    else object_view(doc.refs, props.get(holder), success[1] if success else "").properties
                )
                for field_ in ("next_cursor", "nextCursor", "next_page_token", "nextPageToken", "cursor"):
                    if field_ in inner:
                        return {"next": {"from": f"{holder}.{field_}" if holder else field_, "param": param}, "max": 5}
            return (
                f"GET {get.path} takes `{param}` ({get.pointer}/parameters), but its answer names no next cursor "
                "the drafter found: add `pages:`"
            )
    for param in ("page", "offset", "page_number"):
        if param in query:
            return (
                f"GET {get.path} pages by `{param}` ({get.pointer}/parameters), which `pages:` cannot follow: the "
                "read sees its first page only"
            )
    return None


def _object_read(doc: ApiDocument, op: ApiOperation, d: DraftOperation, get: ApiOperation, body: list[str]) -> None:
    success = _success(get)
    scalars = scalar_fields(doc.refs, success[0], success[1]) if success and success[0] else set()
    find = [f for f in body if f in scalars]
    url = _read_url(doc, get.path)
    if not find or url is None:
        d.reconcile_notes.append(
            f"TODO: no reconcile read: GET {get.path} ({get.pointer}) "
            + (
                "shows none of the fingerprint's body fields"
                if url
                else "needs a path parameter that carries a credential"
            )
            + ": without a read, an unknown outcome goes to manual review"
        )
        return
    d.reconcile = {
        "read": {"method": "GET", "url": url},
        "find": {f: "{intent." + f + "}" for f in find},
        "absence_provable": False,
    }
    d.reconcile_notes += [
        f"From GET {get.path} ({get.pointer}): the object shows this write's values once it took effect.",
        f"TODO: the object ({get.pointer}) may hold these values from an earlier write too: check that finding "
        "them proves this one (absence_provable stays false: not found goes to manual review)",
    ]


# --- RPC ---------------------------------------------------------------------------------------


def _rpc_operations(doc: ApiDocument, draft: DraftFile, writes: re.Pattern[str] | None) -> None:
    by_path: dict[str, list[ApiOperation]] = {}
    for op in doc.operations:
        by_path.setdefault(op.path, []).append(op)
    reads: list[str] = []
    names: set[str] = set()
    for path, ops in by_path.items():
        method = path.strip("/")
        op = next((o for o in ops if o.method == "POST"), ops[0])
        full = _template(doc, op, draft)
        if full is None:
            continue
        write = writes.search(method) is not None if writes is not None else reading_word(method) is None
        if not write:
            draft.post_reads.append((full, ""))
            reads.append(method)
            continue
        d = DraftOperation(name=_unique(_NAME_BAD.sub("_", method) or "method", names), method="POST", path=full)
        d.description = op.summary
        declared = sorted({o.method for o in ops})
        if "POST" not in declared:
            d.todos.append(
                f"the document declares {method} as {', '.join(declared)} only ({op.pointer}), and "
                + ("--writes names it" if writes is not None else "its name does not read as a read")
                + ": drafted as a write sent by POST (RPC APIs take both). A GET of it passes with no receipt"
            )
        body = op.body_schema
        if body is None:  # a GET-declared method: its query parameters are the POST's form fields
            fields = [p for p in op.params if p.where in ("query", "form")]
            body = {
                "type": "object",
                "properties": {p.name: p.schema for p in fields},
                "required": [p.name for p in fields if p.required],
            }
        _fingerprint(doc, op, d, body)
        _idempotency(op, d)
        _answers(doc, op, d)
        related = [r for r in reads_of(by_path, family(method))]
        d.reconcile_notes.append(
            f"TODO: no reconcile read: RPC methods do not say which read shows a write's effect ({op.pointer})"
            + (f"; reads of the same family: {', '.join(related)}" if related else "")
            + ". Without one, an unknown outcome goes to manual review (`receipts resolve`)"
        )
        draft.operations.append(d)
    how = f"--writes {writes.pattern!r} matches" if writes is not None else "their names read as writes"
    draft.notes.append(
        f"RPC-style API: every method is a POST to its own path. Operations: the {len(draft.operations)} methods "
        f"{how}; post_reads: the {len(reads)} others (a reconcile read may POST to them; the proxy passes them "
        "untouched)."
    )
    draft.todos.append(
        "check the split of the methods of #/paths into writes and reads, made from their names "
        + (
            f"(--writes {writes.pattern!r})"
            if writes is not None
            else "(list, get, info, history, search, ... are reads)"
        )
        + ": a write left in post_reads goes out with no receipt. Give --writes REGEX to say which methods write"
    )


def reads_of(by_path: Mapping[str, list[ApiOperation]], fam: str) -> list[str]:
    """The methods of a family whose names read as reads (`chat` → chat.getPermalink, ...)."""
    return [p.strip("/") for p in by_path if family(p.strip("/")) == fam and reading_word(p.strip("/"))][:6]
