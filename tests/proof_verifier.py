"""
A verifier of `receipts export --signed` bundles written from docs/proof.md alone: it imports
nothing from proxy_addon (the standard library and `cryptography` for Ed25519 only).

    python tests/proof_verifier.py bundle.jsonl [VERIFIER_KEY]     # prints intact/broken, exit 0/1
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey


def canonical(row: dict) -> bytes:
    obj = {k: v for k, v in row.items() if k != "hash" and v is not None}
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def checkpoint(note: str, vkey: str) -> tuple[int, str]:
    name, key_id, key = vkey.split("+", 2)  # base64 may hold "+" too
    raw = base64.b64decode(key)
    assert raw[0] == 1 and hashlib.sha256(name.encode() + b"\n" + raw).digest()[:4].hex() == key_id, "bad verifier key"
    text, signatures = note.split("\n\n", 1)
    text += "\n"
    for line in signatures.splitlines():
        dash, signer, b64 = line.split(" ")
        sig = base64.b64decode(b64)
        if dash == "\u2014" and signer == name and sig[:4].hex() == key_id:
            Ed25519PublicKey.from_public_bytes(raw[1:]).verify(sig[4:], text.encode())  # raises if bad
            origin, size, head, time = text.splitlines()
            assert origin == "receipt-proxy/events" and time.startswith("time ")
            return int(size), base64.b64decode(head).hex()
    raise AssertionError("not signed by the verifier key")


def verify(lines: list[str], vkey: str | None = None) -> str:
    items = [json.loads(line) for line in lines if line.strip()]
    header = items[0]
    vkey = vkey or header["verifier_key"]
    try:
        heads = dict(checkpoint(c["note"], vkey) for c in items if c["type"] == "checkpoint")
    except Exception as e:
        return f"broken: a checkpoint does not verify ({e!r})"
    position, prev, events, last_state = 0, "0" * 64, 0, {}
    for item in items:
        if item["type"] not in ("event", "mark"):
            continue
        r = item["record"]
        if r.get("chain_seq") != position + 1 or r["prev_hash"] != prev:
            return f"broken: at position {position + 1}"
        pruned = item["type"] == "mark" and r["mark"] == "pruned"
        if not pruned and hashlib.sha256(canonical(r)).hexdigest() != r["hash"]:
            return f"broken: position {position + 1} edited"
        prev, position = r["hash"], (r["through"] if pruned else r["chain_seq"])
        if item["type"] == "event":
            events += 1
            if r["event"] == "transition":
                last_state[r["operation_id"]] = r["to_state"]
        if heads.get(position, prev) != prev:
            return f"broken: the checkpoint at {position} signed another hash"
    if heads and max(heads) > position:
        return "broken: truncated"
    for item in items:
        if item["type"] == "receipt" and last_state.get(item["receipt"]["operation_id"]) != item["receipt"]["state"]:
            return f"broken: receipt {item['receipt']['operation_id']}'s state"
    return f"intact: {events} events, {len(heads)} checkpoints"


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        line = verify(f.readlines(), sys.argv[2] if len(sys.argv) > 2 else None)
    print(line)
    sys.exit(0 if line.startswith("intact") else 1)
