"""
A rules file drafted from traffic (`receipts rules draft --flows FILE`): the writes of a HAR file,
a mitmproxy flow file (read by mitm/flow_file.py) or a receipts_learn file, as request shapes
(draft/request_shapes.py).

    draft = draft_flows(shapes, source="session.har", host="api.shop.test")

Per host, each method's paths are clustered into templates (draft/path_clusters.py), one
operation a template. Its `fingerprint.body` is proposed from the attempts seen:

- a retry is an attempt to the same path within RETRY_WINDOW seconds of an earlier one that got no
  2xx (a failure status, or no answer), which agrees with it on more than half of their fields;
- a field that changed between an attempt and its retry (a timestamp, a request id, a nonce) is
  left out: in the fingerprint it would make every retry a new write;
- a field whose value differs between distinct writes (one per chain of retries) goes in: it
  tells writes apart. A field that was the same in every write is listed in a TODO;
- a field named like a secret never goes in, and its value is never shown.

Comments say what was seen: counts of requests, distinct writes and retries, the statuses, example
paths and values (redacted; none from a learn file, which holds none). What traffic cannot say (a
read that settles an unknown outcome, the `external_id`, which errors refuse) is a TODO.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from proxy_addon.draft.draft_model import DraftFile, DraftOperation
from proxy_addon.draft.openapi_draft import api_name
from proxy_addon.draft.path_clusters import Cluster, cluster_paths
from proxy_addon.draft.request_shapes import MUTATING, RequestShape
from proxy_addon.errors import DraftError
from proxy_addon.wire.redaction import REDACTED, redact_path

RETRY_WINDOW = 300.0  # seconds between an attempt that got no 2xx and its retry
EXAMPLE_CHARS = 40
_PORT = re.compile(r":[0-9]+$")


@dataclass
class FieldFindings:
    """What the attempts of one operation say of its body fields."""

    attempts: int = 0
    writes: int = 0  # distinct writes: chains of retries
    retries: int = 0
    varying: list[str] = field(default_factory=list)  # differ between distinct writes, never within a retry
    volatile: list[str] = field(default_factory=list)  # changed between an attempt and its retry
    constant: list[str] = field(default_factory=list)  # the same in every distinct write
    secret: list[str] = field(default_factory=list)


def hostname(host: str) -> str:
    return host if host.endswith("]") else _PORT.sub("", host)


def draft_flows(
    shapes: Sequence[RequestShape], *, source: str, host: str | None = None, api: str | None = None
) -> DraftFile:
    """The rules file for one host's writes among `shapes` (`host`: which one, when they reach several)."""
    writes = [s for s in shapes if s.method in MUTATING]
    hosts = Counter(hostname(s.host) for s in writes)
    if host is None:
        if not hosts:
            raise DraftError("no write (POST, PUT, PATCH, DELETE) in it", source=source)
        if len(hosts) > 1:
            seen = ", ".join(f"{h} ({n})" for h, n in hosts.most_common())
            raise DraftError(f"writes to several hosts ({seen}): give --host HOST to draft one", source=source)
        host = next(iter(hosts))
    writes = [s for s in writes if hostname(s.host) == host]
    if not writes:
        seen = ", ".join(sorted(hosts)) or "none"
        raise DraftError(f"no write to {host} in it (hosts with writes: {seen})", source=source)
    hashed = all(s.hashed for s in writes)
    draft = DraftFile(api=api or api_name([host], ""), hosts=[host], source=source)
    draft.notes += [
        f"Drafted by `receipts rules draft` from the traffic in {source}: {len(writes)} writes to {host}"
        + (" (a receipts_learn file: field names and keyed hashes only, so no example values)." if hashed else "."),
        "A draft is a start, not a pack: read every TODO (`receipts rules check` lists them as warnings) and "
        "`receipts rules explain` a request of each operation before the proxy enforces it (docs/rules.md, "
        '"Start from a draft").',
        "Errors: no `classify:` rule means the defaults: 2xx succeeded; 409 already_exists (it may mean executed: "
        "a read decides, or a person; never a refusal); 408 and 5xx outcome_unknown; every other 4xx rejected.",
    ]
    draft.todos.append(
        "traffic shows only the operations it holds: an operation of the API that was not called is not here, "
        "and its writes pass with no receipt. Check the list against the API's reference"
    )
    _credentials(writes, draft)
    clusters = cluster_paths((s.method, hostname(s.host), s.path) for s in writes)
    by_cluster: dict[int, tuple[Cluster, list[RequestShape]]] = {}
    for s in writes:
        c = clusters[(s.method, hostname(s.host), s.path)]
        by_cluster.setdefault(id(c), (c, []))[1].append(s)
    names: set[str] = set()
    for cluster, attempts in by_cluster.values():
        draft.operations.append(_operation(cluster, attempts, names))
    draft.operations.sort(key=lambda op: ([1 if "{" in seg else 0 for seg in op.path.split("/")], op.path))
    return draft


def _credentials(writes: Sequence[RequestShape], draft: DraftFile) -> None:
    headers = list(dict.fromkeys(h for s in writes for h in s.credential_headers))
    if not headers:
        draft.todos.append(
            "no request carried a header named like a credential (Authorization, X-Api-Key, ...): name where the "
            "API key travels in `credentials:` (a header, a query parameter or a body field)"
        )
        return
    env = re.sub(r"[^A-Z0-9]+", "_", draft.api.upper()).strip("_") + "_API_KEY"
    draft.credentials = {
        "header": headers[0] if len(headers) == 1 else headers,
        "env": env if re.match(r"^[A-Z_]", env) else "API_KEY",
    }
    draft.credentials_notes.append(
        f"The headers named like credentials in the requests seen ({', '.join(headers)}; their values were not "
        "read): the proxy keeps a keyed hash of them, never the value."
    )


def _op_name(cluster: Cluster, names: set[str]) -> str:
    parts = [p.strip("{}") for p in cluster.template.split("/") if p]
    base = re.sub(r"[^A-Za-z0-9_.-]+", "_", ".".join([cluster.method.lower(), *parts])).strip("._-")
    name, n = base or cluster.method.lower(), 2
    while name in names:
        name, n = f"{base}-{n}", n + 1
    names.add(name)
    return name


def _operation(cluster: Cluster, attempts: list[RequestShape], names: set[str]) -> DraftOperation:
    d = DraftOperation(name=_op_name(cluster, names), method=cluster.method, path=cluster.template)
    found = find_fields(attempts)
    statuses = Counter("no answer" if s.status is None else str(s.status) for s in attempts)
    examples = sorted(dict.fromkeys(redact_path(p) for p in cluster.paths))[:3]
    d.notes.append(
        f"seen: {found.attempts} requests: {found.writes} distinct writes and {found.retries} retries; statuses: "
        + ", ".join(f"{k} ×{v}" for k, v in sorted(statuses.items()))
        + f"; paths: {', '.join(examples)}"
        + (" ..." if len(set(cluster.paths)) > 3 else "")
    )
    if "{" in cluster.template:
        d.todos.append(
            "check the path template: its {parameters} are the segments that looked like ids or varied "
            f"({', '.join(examples)})"
        )
    if any(s.content_type and s.content_type not in _READ_BODIES for s in attempts):
        kinds = sorted({s.content_type for s in attempts if s.content_type and s.content_type not in _READ_BODIES})
        d.todos.append(
            f"bodies of type {', '.join(kinds)} were not read: the whole body is hashed unless you name "
            "`fingerprint.body` fields (multipart: the part names)"
        )
    queries = sorted({q for s in attempts for q in s.query})
    if queries:
        d.todos.append(
            f"query parameters seen ({', '.join(queries)}): add to fingerprint.query those that make two writes "
            "different (never one that carries a credential)"
        )
    _fingerprint(d, found, attempts)
    key = next((s.key_header for s in attempts if s.key_header), None)
    if key:
        d.idempotency_key = {"header": key}
        d.todos.append(
            f"the requests carried {key}: the proxy sends its own key there, the same one with a retry. How long "
            "does the API keep a key? Add `ttl:` (Stripe and Resend keep one 24h)"
        )
    d.todos.append(
        "external_id: traffic read for a draft keeps no answer bodies: set it to the success answer's id field "
        "(e.g. `external_id: id`) if the answer names the object"
    )
    errors = sorted(k for k in statuses if k[:1] in ("4", "5"))
    d.classify_notes.append(
        f"TODO: statuses seen that are not 2xx: {', '.join(errors)}. The defaults apply (the file's head): keep a "
        "4xx rejected only where the API refuses before it acts"
        if errors
        else "TODO: no error was seen: the defaults apply (the file's head); check the API's own pages for errors "
        "that may come after it acted"
    )
    d.reconcile_notes.append(
        "TODO: no reconcile read: traffic does not say which read shows this write's effect. Without one, an "
        "unknown outcome goes to manual review (`receipts resolve`)"
    )
    return d


_READ_BODIES = ("application/json", "application/x-www-form-urlencoded")


def _fingerprint(d: DraftOperation, found: FieldFindings, attempts: list[RequestShape]) -> None:
    if found.secret:
        d.notes.append(f"named like secrets, never fingerprinted nor shown: {', '.join(found.secret)}")
    if found.volatile:
        d.notes.append(
            f"changed between an attempt and its retry, so left out (in the fingerprint it would make every "
            f"retry a new write): {', '.join(found.volatile)}"
        )
    if not (found.varying or found.constant or found.volatile):
        if any(s.content_type in _READ_BODIES for s in attempts):
            d.todos.append("no body field was seen: the whole body (if any) is hashed")
        return
    body = [*found.varying, *found.constant]
    if found.writes < 2:
        d.todos.append(
            "only one distinct write was seen, so no field was seen to tell writes apart: fingerprint.body holds "
            "every field but the secrets and those that changed in a retry; keep those that make the write"
        )
    elif found.constant:
        d.notes.append(
            f"the same in every write seen, kept (a retry repeats them): {', '.join(found.constant)}; drop one "
            "only if it is no part of what the write does"
        )
    if found.retries == 0:
        d.todos.append(
            "no retry was seen: a field that changes between a request and its retry (a timestamp, a request id) "
            "would make every retry a new write: take any such field out of fingerprint.body"
        )
    if not body:
        d.todos.append("every field changed in a retry or is a secret: name the fields that make a write")
        return
    d.fingerprint = {"body": body}
    shown = _examples(body, attempts)
    d.notes.append(
        "fingerprint.body: every field but the secrets and those that changed in a retry"
        + (f"; these differed between distinct writes: {', '.join(found.varying)}" if found.varying else "")
        + (f"; e.g. {shown}" if shown else "")
    )


def _examples(body: list[str], attempts: list[RequestShape]) -> str:
    if any(s.hashed for s in attempts):
        return ""
    out = []
    for name in body:
        value = next((s.fields[name] for s in attempts if s.fields.get(name) is not None), None)
        if value is None:
            continue
        text = value if value == REDACTED else value[:EXAMPLE_CHARS] + ("..." if len(value) > EXAMPLE_CHARS else "")
        out.append(f"{name}={text}")
    return ", ".join(out)


# --- retries and fields ------------------------------------------------------------------------


def _ok(status: int | None) -> bool:
    return status is not None and 200 <= status < 300


def _alike(a: RequestShape, b: RequestShape) -> bool:
    """At least half of the fields either has are equal in both (a request and its retry)."""
    names = (set(a.fields) | set(b.fields)) - {n for n, v in {**a.fields, **b.fields}.items() if v is None}
    if not names:
        return a.fields.keys() == b.fields.keys()
    same = sum(1 for n in names if n in a.fields and n in b.fields and a.fields[n] == b.fields[n])
    return same * 2 >= len(names)


def retry_of(attempts: Sequence[RequestShape]) -> list[int | None]:
    """For each attempt (in the order sent), the index of the attempt it retries, or None."""
    out: list[int | None] = []
    for j, b in enumerate(attempts):
        found = None
        for i in range(j - 1, -1, -1):
            a = attempts[i]
            if a.time is not None and b.time is not None and b.time - a.time > RETRY_WINDOW:
                break
            if a.path == b.path and not _ok(a.status) and _alike(a, b) and i not in out:
                found = i
                break
        out.append(found)
    return out


def find_fields(attempts: Sequence[RequestShape]) -> FieldFindings:
    ordered = sorted(attempts, key=lambda s: s.time if s.time is not None else 0.0)
    parents = retry_of(ordered)
    found = FieldFindings(attempts=len(ordered), retries=sum(p is not None for p in parents))
    names = list(dict.fromkeys(n for s in ordered for n in s.fields))
    found.secret = [n for n in names if any(s.fields.get(n, "") is None for s in ordered)]
    volatile = {
        n
        for j, i in enumerate(parents)
        if i is not None
        for n in names
        if ordered[i].fields.get(n) != ordered[j].fields.get(n)
    }
    firsts = [s for s, p in zip(ordered, parents, strict=True) if p is None]
    found.writes = len(firsts)
    for n in names:
        if n in found.secret:
            continue
        if n in volatile:
            found.volatile.append(n)
        elif len({s.fields.get(n) for s in firsts}) > 1:
            found.varying.append(n)
        else:
            found.constant.append(n)
    return found
