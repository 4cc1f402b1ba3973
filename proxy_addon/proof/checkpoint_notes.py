"""
Signed checkpoints (docs/proof.md, "Checkpoints"): the chain's length, its head hash and the
time, as a C2SP signed note (https://c2sp.org/signed-note), the body laid out as a C2SP
tlog-checkpoint's:

    receipt-proxy/events                                  the origin
    1234                                                  the chain's length (its last position)
    q3yX0lYYaG1tpD4ViObVd2CEinNv5UyUzCL9gYqJx6M=          the hash at that position, base64 of its 32 bytes
    time 2026-12-01T10:00:00.000000Z                      when it was signed (an extension line)

    — receipt-proxy AbCdEf...                             base64(key id || Ed25519 signature of the body)

The signature covers the body's bytes exactly (every line ending in "\\n"), not the blank line
after it. The head is the hash of a chain's last record, not a Merkle tree's root: verifying
needs the records, not a proof.
"""

from __future__ import annotations

import base64
import binascii

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from proxy_addon.proof.chain_audit import SignedHead
from proxy_addon.proof.signing_key import NAME, key_id, parse_verifier_key, raw_public

ORIGIN = "receipt-proxy/events"
DASH = "\u2014"  # the em dash that opens a signature line


class NoteError(ValueError):
    """A checkpoint note that is malformed, or not signed by the key given."""


def checkpoint_body(size: int, head: str, time: str) -> str:
    return f"{ORIGIN}\n{size}\n{base64.b64encode(bytes.fromhex(head)).decode()}\ntime {time}\n"


def sign_checkpoint(key: Ed25519PrivateKey, size: int, head: str, time: str, name: str = NAME) -> str:
    """The signed note of a checkpoint."""
    body = checkpoint_body(size, head, time)
    signature = key.sign(body.encode())
    ident = key_id(name, raw_public(key.public_key()))
    return f"{body}\n{DASH} {name} {base64.b64encode(ident + signature).decode()}\n"


def open_checkpoint(note: str, verifier: str) -> SignedHead:
    """What a note signed, once its signature by `verifier` (a verifier key) checks; NoteError why not."""
    name, ident, public = parse_verifier_key(verifier)
    body, sep, signatures = note.partition("\n\n")
    if not sep or not body:
        raise NoteError("not a signed note (no blank line between its text and its signatures)")
    body += "\n"
    lines = body.splitlines()
    if len(lines) < 4 or lines[0] != ORIGIN or not lines[1].isdigit() or not lines[3].startswith("time "):
        raise NoteError(f"not a receipt-proxy checkpoint (origin {ORIGIN}, size, head, time)")
    try:
        head = base64.b64decode(lines[2], validate=True)
    except binascii.Error:
        raise NoteError("its head hash is not base64") from None
    for line in signatures.splitlines():
        signer, _, b64 = line.removeprefix(f"{DASH} ").partition(" ")
        try:
            raw = base64.b64decode(b64, validate=True)
        except binascii.Error:
            continue
        if line.startswith(DASH) and signer == name and raw[:4] == ident:
            try:
                public.verify(raw[4:], body.encode())
            except InvalidSignature:
                raise NoteError(
                    f"its signature by {name} ({ident.hex()}) does not verify: the note was altered"
                ) from None
            return SignedHead(size=int(lines[1]), head=head.hex(), time=lines[3].removeprefix("time "))
    raise NoteError(f"it is not signed by the key {name}+{ident.hex()} (signed with another key?)")
