"""
One link of the events' hash chain (docs/proof.md, "The chain"): a record's canonical form and hash.

    record_hash({"id": 7, "chain_seq": 7, "prev_hash": "…", "operation_id": "…", ..., "hash": "…"})

A record is an event (a row of `receipt_events`) or a chain mark (a row of
`receipt_chain_marks`: where the chain starts, an event range pruned). Its canonical form is the
RFC 8785 JSON (jcs.py) of an object holding every stored field of the row except `hash`, under
its column name, with the fields that are null left out (so that a column added later, null in
every row written before it, changes no earlier hash). Its hash is the SHA-256 of that form, in
lower-case hex; `prev_hash` is the hash of the record at the position before, GENESIS for the first.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from proxy_addon.proof.jcs import MAX_INT, canonical

GENESIS = "0" * 64  # the prev_hash of the chain's first record
HASH = "hash"  # the one column a record's hash does not cover: itself


def canonical_form(row: Mapping[str, Any]) -> bytes:
    """
    The JCS of every field of `row` but `hash`, null ones left out. For ASCII names and values that
    are strings and integers within 2**53, the standard library's JSON (in C) writes the same bytes
    (tests/proof/test_chain_links.py): that path first, jcs.py for anything else (and its errors).
    """
    fields = {k: v for k, v in row.items() if k != HASH and v is not None}
    if all(k.isascii() for k in fields) and all(
        type(v) is str or (type(v) is int and -MAX_INT <= v <= MAX_INT) for v in fields.values()
    ):
        try:
            return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        except UnicodeEncodeError:  # a lone surrogate: jcs.py refuses it, saying so
            pass
    return canonical(fields)


def record_hash(row: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical form, lower-case hex."""
    return hashlib.sha256(canonical_form(row)).hexdigest()
