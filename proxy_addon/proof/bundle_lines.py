"""
`receipts export --signed` bundles (docs/proof.md, "Bundles"): JSON Lines, written in the order
verification reads them (the header, the checkpoints, the chain's records by position, the
receipts), so that `receipts verify BUNDLE` reads a bundle once, holding one state per receipt.

    for line in bundle_lines(verifier, exported_at, checkpoints, records, receipts): out.write(line)
    verdict = verify_bundle(open("bundle.jsonl"), public_key=None)
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator
from typing import Any

from proxy_addon.proof.chain_audit import Verdict
from proxy_addon.proof.chain_verdict import verdict_of

FORMAT = "receipt-proxy-proof/1"


class BundleError(ValueError):
    """A bundle that is not one (its line number and what is wrong)."""


def bundle_lines(
    verifier: str | None,
    exported_at: str,
    checkpoints: Iterable[dict[str, Any]],
    records: Iterable[tuple[str, dict[str, Any]]],
    receipts: Iterable[tuple[dict[str, Any], list[dict[str, Any]] | None]],
) -> Iterator[str]:
    """
    The bundle, a line at a time (each ending in a newline). `receipts`: each receipt's fields and the
    decisions applied to it (store/applied_decisions.py; None: they could not be read), which verification
    does not read: they are a reading of the receipt's events, each naming its event's id.
    """
    yield _line({"type": "bundle", "format": FORMAT, "verifier_key": verifier, "exported_at": exported_at})
    for c in checkpoints:
        yield _line({"type": "checkpoint", **{k: c[k] for k in ("size", "head", "at", "note")}})
    for kind, row in records:
        yield _line({"type": "mark" if kind == "mark" else "event", "record": row})
    for r, decisions in receipts:
        yield _line({"type": "receipt", "receipt": r, "decisions": decisions})


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"


def verify_bundle(lines: Iterable[str], public_key: str | None = None) -> Verdict:
    """The verdict on a bundle, with `public_key` (a verifier key) or else the one the bundle names."""
    parsed = _objects(lines)
    header = next(parsed, None)
    if header is None or header[1].get("type") != "bundle" or header[1].get("format") != FORMAT:
        raise BundleError(f"line 1: not a {FORMAT} bundle (receipts export --signed)")
    checkpoints: list[dict[str, Any]] = []
    pending: tuple[int, dict[str, Any]] | None = None
    for n, obj in parsed:
        if obj.get("type") != "checkpoint":
            pending = (n, obj)
            break
        checkpoints.append(obj)
    receipts: list[tuple[int, dict[str, Any]]] = []  # the first receipt line, read by `records`
    records = _records(pending, parsed, receipts)
    return verdict_of(records, _receipts(receipts, parsed), checkpoints, public_key or header[1].get("verifier_key"))


def _objects(lines: Iterable[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    for n, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise BundleError(f"line {n}: not JSON: {e}") from None
        if not isinstance(obj, dict):
            raise BundleError(f"line {n}: not a JSON object")
        yield n, obj


def _records(
    first: tuple[int, dict[str, Any]] | None,
    rest: Iterator[tuple[int, dict[str, Any]]],
    receipts: list[tuple[int, dict[str, Any]]],
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The chain's records, up to the first receipt line (kept in `receipts` for `_receipts`)."""
    item = first
    while item is not None:
        n, obj = item
        kind = obj.get("type")
        if kind == "receipt":
            receipts.append(item)
            return
        if kind not in ("event", "mark") or not isinstance(obj.get("record"), dict):
            raise BundleError(f"line {n}: expected an event, a mark or a receipt, not {kind!r}")
        yield kind, obj["record"]
        item = next(rest, None)


def _receipts(
    first: list[tuple[int, dict[str, Any]]], rest: Iterator[tuple[int, dict[str, Any]]]
) -> Iterator[tuple[str, str]]:
    for n, obj in itertools.chain(first, rest):
        r = obj.get("receipt")
        if obj.get("type") != "receipt" or not isinstance(r, dict):
            raise BundleError(f"line {n}: expected a receipt after the chain's records")
        yield str(r.get("operation_id")), str(r.get("state"))
