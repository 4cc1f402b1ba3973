"""
Approve and deny links for a write held for approval: signed, bound, expiring.

    key = link_key(installation.key)                        # derived from secret.key: a fleet shares it
    token = sign(Link(operation_id, "approve", fingerprint, version, expires), key)
    link = verify(token, key, now=time.time())              # BadLink: not ours, changed, or expired

A link names the receipt, the action (approve or deny), the intent fingerprint and the rules'
version (rules/policy_version.py) it was made for, and when it expires (the approval's
timeout): all of it signed with HMAC-SHA256 under a key derived from the installation's
secret.key, so any proxy of a fleet can check a link another made, and nobody without the
key can make or change one. It is single-use because a held write is decided once: the store
records the decision with the link's id (`link_id`), and a link used already is told so.
The token is `<payload>.<signature>`: the payload base64url JSON, the signature 64 hex digits.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from typing import Literal

CONTEXT = b"receipt-proxy approval links v1"  # what the link key is derived for: no other key equals it
ACTIONS = ("approve", "deny")
MAX_TOKEN = 2048  # characters: a longer one is not a link of ours
_TOKEN = re.compile(r"([A-Za-z0-9_-]{1,2000})\.([0-9a-f]{64})")


class BadLink(ValueError):
    """A link that decides nothing: `expired` (signed by us, too late) or not one of ours (`invalid`)."""

    def __init__(self, kind: Literal["invalid", "expired"], message: str):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Link:
    operation_id: str
    action: str  # approve or deny
    fingerprint: str  # the intent fingerprint of the held write
    rules_version: str  # policy_version of its operation when it was held
    expires: int  # Unix seconds: the approval's timeout

    @property
    def approve(self) -> bool:
        return self.action == "approve"


def link_key(secret_key: bytes) -> bytes:
    """The links' HMAC key, derived from the installation's key (which it never reveals)."""
    return hmac.new(secret_key, CONTEXT, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign(link: Link, key: bytes) -> str:
    """The link's token: its fields and their signature."""
    if link.action not in ACTIONS:
        raise ValueError(f"a link approves or denies, not {link.action!r}")
    fields = {"r": link.operation_id, "a": link.action, "f": link.fingerprint, "v": link.rules_version}
    payload = _b64(json.dumps({**fields, "e": link.expires}, separators=(",", ":"), sort_keys=True).encode())
    return f"{payload}.{hmac.new(key, payload.encode('ascii'), hashlib.sha256).hexdigest()}"


def link_id(token: str) -> str:
    """What the store records of a link that decided: part of its signature (unique to the link)."""
    return token.rpartition(".")[2][:32]


def verify(token: str, key: bytes, *, now: float) -> Link:
    """The link a token signed by `key` carries; BadLink if it is not one, was changed, or has expired."""
    m = _TOKEN.fullmatch(token) if len(token) <= MAX_TOKEN else None
    if m is None:
        raise BadLink("invalid", "this is not an approval link of this proxy")
    payload, signature = m.groups()
    good = hmac.new(key, payload.encode("ascii"), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(good, signature):
        raise BadLink("invalid", "this link's signature does not match: it was changed, or made with another key")
    try:
        fields = json.loads(_unb64(payload))
        link = Link(fields["r"], fields["a"], fields["f"], fields["v"], fields["e"])
    except (ValueError, KeyError, TypeError, binascii.Error) as e:
        raise BadLink("invalid", f"this link's fields cannot be read: {e}") from None
    texts = (link.operation_id, link.action, link.fingerprint, link.rules_version)
    if not all(isinstance(t, str) for t in texts) or type(link.expires) is not int or link.action not in ACTIONS:
        raise BadLink("invalid", "this link's fields are not those of an approval link")
    if now >= link.expires:
        raise BadLink("expired", f"this link expired at {link.expires} (the approval's timeout)")
    return link


def link_url(base: str, token: str) -> str:
    """Where a link is followed: BASE/approvals/TOKEN."""
    return f"{base.rstrip('/')}/approvals/{token}"
