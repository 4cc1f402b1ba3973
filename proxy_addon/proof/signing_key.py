"""
The installation's checkpoint key: an Ed25519 key in `checkpoint.key`, beside secret.key
(PKCS#8 PEM, mode 0600, made on first use), and its verifier key, the public half as text in
the form of C2SP signed notes (Go's golang.org/x/mod/sumdb/note):

    <name>+<key id, 8 hex digits>+<base64 of 0x01 || the 32-byte public key>

where the key id is the first 4 bytes of SHA-256(<name> || "\\n" || 0x01 || public key). A fleet
shares one key file (as it shares secret.key) and the database records the verifier key, checked
when a proxy starts (gate/installation.py).
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

KEY_FILE = "checkpoint.key"
NAME = "receipt-proxy"  # the key's name in notes and verifier keys
ED25519 = b"\x01"  # the signature algorithm byte of signed notes


def load_or_create_signing_key(path: Path) -> Ed25519PrivateKey:
    """The key in `path`, made there (mode 0600) when there is none; ValueError for a file holding no such key."""
    if not path.exists():
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another proxy made it meanwhile: use theirs
            return load_or_create_signing_key(path)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        return key
    try:
        loaded = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except ValueError as e:
        raise ValueError(f"{path} is not an Ed25519 private key in PEM: {e}") from None
    if not isinstance(loaded, Ed25519PrivateKey):
        raise ValueError(f"{path} holds a {type(loaded).__name__}, not an Ed25519 key")
    return loaded


def raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(name: str, public: bytes) -> bytes:
    """The 4-byte key id of signed notes."""
    return hashlib.sha256(name.encode() + b"\n" + ED25519 + public).digest()[:4]


def verifier_key(key: Ed25519PrivateKey, name: str = NAME) -> str:
    """`<name>+<key id hex>+<base64(0x01 || public key)>`."""
    public = raw_public(key.public_key())
    return f"{name}+{key_id(name, public).hex()}+{base64.b64encode(ED25519 + public).decode()}"


def parse_verifier_key(text: str) -> tuple[str, bytes, Ed25519PublicKey]:
    """(name, key id, public key) of a verifier key; ValueError saying what is wrong."""
    name, _, rest = text.strip().partition("+")
    hex_id, _, b64 = rest.partition("+")
    try:
        raw = base64.b64decode(b64, validate=True)
        ident = bytes.fromhex(hex_id)
    except ValueError:
        raise ValueError(f"not a verifier key (<name>+<hex id>+<base64 key>): {text.strip()[:80]!r}") from None
    if not name or len(raw) != 33 or raw[:1] != ED25519 or len(ident) != 4:
        raise ValueError(f"not an Ed25519 verifier key: {text.strip()[:80]!r}")
    if key_id(name, raw[1:]) != ident:
        raise ValueError(f"the verifier key's id {hex_id} is not its key's: {text.strip()[:80]!r}")
    return name, ident, Ed25519PublicKey.from_public_bytes(raw[1:])
