"""
Paths seen → path templates, per host and method: `/v1/orders/ord_8f3k2m/refunds` and
`/v1/orders/ord_q9x1z7/refunds` are one template, `/v1/orders/{order_id}/refunds`.

A segment is a parameter when it looks like an id by itself (a number, a UUID, a long hex
string, a word with digits in it such as `ord_8f3k2m` or `re_123abc`), or when it varies between
paths that agree everywhere else and a literal segment follows it (a slug: `/repos/alice/tools/issues`
and `/repos/bob/site/issues` → `/repos/{repo}/{repo_2}/issues`). A last segment that varies
without looking like an id stays literal (`/v1/emails` and `/v1/contacts` are two operations).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

ID_LIKE = re.compile(
    r"^(?:[0-9]+"  # a number
    r"|[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}"  # a UUID
    r"|[0-9a-f]{12,}"  # a long hex string (an ObjectId, a hash)
    r"|(?=[A-Za-z0-9_-]*[0-9])(?=[A-Za-z0-9_-]*[A-Za-z])[A-Za-z0-9_-]{6,}"  # a word with digits: ord_8f3k2m
    r")$",
    re.I,
)
WILD = "{}"
_VERSION = re.compile(r"^v[0-9]+(?:\.[0-9]+)?$|^[0-9]{4}-[0-9]{2}-[0-9]{2}$")  # /v1, /v2.1, /2024-01-01: literal


def id_like(segment: str) -> bool:
    """A segment that names an object: a number, a UUID, ... (or `{id}`, as a receipts_learn file writes one)."""
    if segment.startswith("{") and segment.endswith("}"):
        return True
    return bool(segment) and not _VERSION.match(segment) and ID_LIKE.match(segment) is not None


@dataclass
class Cluster:
    method: str
    host: str
    shape: tuple[str, ...]  # literal segments, WILD for a parameter
    paths: list[str] = field(default_factory=list)

    @property
    def template(self) -> str:
        names: list[str] = []
        out = []
        for i, seg in enumerate(self.shape):
            if seg != WILD:
                out.append(seg)
                continue
            prev = next((s for s in reversed(self.shape[:i]) if s != WILD), "")
            base = re.sub(r"[^A-Za-z0-9_]", "_", _singular(prev)).strip("_").lower()
            name = f"{base}_id" if base and base[0].isalpha() else "id"
            n, candidate = 2, name
            while candidate in names:
                candidate, n = f"{name}_{n}", n + 1
            names.append(candidate)
            out.append("{" + candidate + "}")
        return "/" + "/".join(out) if out else "/"


def _singular(word: str) -> str:
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith("s") and not word.endswith("ss") and len(word) > 3:
        return word[:-1]
    return word


def segments(path: str) -> tuple[str, ...]:
    return tuple(s for s in path.split("/") if s != "") if path.strip("/") else ()


def cluster_paths(requests: Iterable[tuple[str, str, str]]) -> dict[tuple[str, str, str], Cluster]:
    """(method, host, path) → its cluster, for every request given."""
    first: dict[tuple[str, str, tuple[str, ...]], list[str]] = {}
    for method, host, path in requests:
        segs = segments(path)
        shape = tuple(WILD if id_like(s) else s for s in segs)
        first.setdefault((method, host, shape), []).append(path)
    # Slugs: shapes of one method and host and length that differ in positions followed by a common literal.
    merged: dict[tuple[str, str, tuple[str, ...]], tuple[str, str, tuple[str, ...]]] = {k: k for k in first}
    keys = sorted(first)
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            ra, rb = merged[a], merged[b]
            if ra == rb or ra[:2] != rb[:2] or len(ra[2]) != len(rb[2]):
                continue
            joined = _join(ra[2], rb[2])
            if joined is None:
                continue
            new = (ra[0], ra[1], joined)
            for k, root in merged.items():
                if root in (ra, rb):
                    merged[k] = new
    clusters: dict[tuple[str, str, tuple[str, ...]], Cluster] = {}
    out: dict[tuple[str, str, str], Cluster] = {}
    for key, paths in first.items():
        root = merged[key]
        cluster = clusters.setdefault(root, Cluster(method=root[0], host=root[1], shape=root[2]))
        for path in paths:
            cluster.paths.append(path)
            out[(key[0], key[1], path)] = cluster
    return out


def _join(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...] | None:
    """One shape for both when each position they differ in has a literal they share after it; else None."""
    out = []
    differ = False
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x == y:
            out.append(x)
            continue
        if i == 0 or not any(a[j] == b[j] != WILD for j in range(i + 1, len(a))):
            return None
        out.append(WILD)
        differ = True
    return tuple(out) if differ else None
