"""
Recorded answers, encrypted at rest. An answer recorded for replay may carry a secret the write
minted (an API key created, an OAuth token issued), in its body or a header: the database
keeps it sealed, and it is opened only to replay it to a duplicate.

    seal = AnswerSeal(secret_key)                        # from the installation's secret.key
    columns = seal.columns(operation_id, response)       # the receipt row's response columns
    response = seal.open(operation_id, receipt.response) # only to replay (attempts.py)

Scheme "v1" (the row's `response_encryption`): AES-256-GCM, under a key derived from
secret.key with HKDF-SHA256 and a purpose label of its own (PURPOSE; principals are HMACs
under the key itself, never this one). Each answer gets a random 96-bit nonce, stored before
its ciphertext in `response_body`; the plaintext is the headers as JSON, a newline, then the
body. The associated data binds the ciphertext to its receipt: its operation id, and the
status (`http_status`) and truncation that stay in clear beside it (metadata that `receipts
show` and `export` print). An answer moved into another receipt, or whose status was changed,
does not open.

A task's id (an MCP tool call answered with a task handle: store/rounds.py) is sealed the same
way, under the same key, bound to its receipt and to its purpose (`seal_task`, `open_task`): a
server that cannot bind its tasks to a caller lets whoever knows a task id read its result, so
the id is kept like the answer it leads to. It is found again by a keyed reference
(`task_ref`: HMAC-SHA256 under a key derived for that alone), never by the id in clear.

A sealed row leaves `response_status` and `response_headers` NULL: an earlier version, which
takes `response_status` for "an answer was recorded" and would replay `response_body` as it
is, finds none on a sealed row, and blocks the duplicate instead (a downgrade never replays
ciphertext). A row with `response_status` and no `response_encryption` was recorded in clear
by an earlier version: it is read as it is (`StoredAnswer.clear`) and still replays.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from proxy_addon.errors import StoreError
from proxy_addon.store.records import RecordedResponse, StoredAnswer

SCHEME = "v1"
PURPOSE = b"receipt-proxy recorded answers v1"  # HKDF's info: this key is for nothing else
TASK_REF_PURPOSE = b"receipt-proxy task references v1"  # the key of task ids' lookup references
_NONCE = 12


class AnswerSeal:
    """Seals and opens recorded answers with a key derived from the installation's secret.key."""

    def __init__(self, secret_key: bytes):
        derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=PURPOSE).derive(secret_key)
        self._aead = AESGCM(derived)
        self._ref_key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=TASK_REF_PURPOSE).derive(secret_key)

    def __repr__(self) -> str:
        return "AnswerSeal(...)"  # never the key

    def columns(self, operation_id: str, response: RecordedResponse) -> dict[str, Any]:
        """The receipt columns that keep `response`, sealed (what `Receipt.from_row` reads back)."""
        plain = json.dumps(response.headers).encode() + b"\n" + response.body
        nonce = os.urandom(_NONCE)
        sealed = nonce + self._aead.encrypt(nonce, plain, _bound(operation_id, response.status, response.truncated))
        return {
            "http_status": response.status,  # the status, kept in clear and bound to the ciphertext
            "response_status": None,  # what earlier versions read as "an answer to replay": none (see above)
            "response_headers": None,
            "response_body": sealed,
            "response_truncated": int(response.truncated),
            "response_encryption": SCHEME,
        }

    def open(self, operation_id: str, stored: StoredAnswer) -> RecordedResponse:
        """The answer recorded for receipt `operation_id`, in clear; StoreError when it does not open."""
        if stored.clear is not None:  # recorded in clear, before answers were sealed
            return stored.clear
        if stored.encryption != SCHEME:
            raise StoreError(
                f"the answer recorded for receipt {operation_id} is encrypted with {stored.encryption!r}, "
                f"which this version does not know"
            )
        nonce, sealed = stored.sealed[:_NONCE], stored.sealed[_NONCE:]
        try:
            plain = self._aead.decrypt(nonce, sealed, _bound(operation_id, stored.status, stored.truncated))
        except (InvalidTag, ValueError):
            raise StoreError(
                f"the answer recorded for receipt {operation_id} does not open with this secret.key: "
                "it was changed, or moved from another receipt"
            ) from None
        head, _, body = plain.partition(b"\n")
        headers = [(str(k), str(v)) for k, v in json.loads(head)]
        return RecordedResponse(stored.status, headers, body, stored.truncated)

    def seal_task(self, operation_id: str, task_id: str) -> bytes:
        """A task id, sealed for receipt `operation_id` (the nonce, then the ciphertext)."""
        nonce = os.urandom(_NONCE)
        return nonce + self._aead.encrypt(nonce, task_id.encode(), _task_bound(operation_id))

    def open_task(self, operation_id: str, sealed: bytes) -> str:
        """The task id sealed for receipt `operation_id`; StoreError when it does not open."""
        try:
            return self._aead.decrypt(sealed[:_NONCE], sealed[_NONCE:], _task_bound(operation_id)).decode()
        except (InvalidTag, ValueError, UnicodeDecodeError):
            raise StoreError(
                f"the task id recorded for receipt {operation_id} does not open with this secret.key"
            ) from None

    def task_ref(self, api: str, task_id: str) -> str:
        """The keyed reference a receipt finds its task by: the task's API and id, never the id in clear."""
        return hmac.new(self._ref_key, f"{api}\n{task_id}".encode(), hashlib.sha256).hexdigest()


def _task_bound(operation_id: str) -> bytes:
    return f"task\n{operation_id}".encode()


def _bound(operation_id: str, status: int, truncated: bool) -> bytes:
    """The associated data: what the ciphertext is bound to."""
    return f"{operation_id}\n{status}\n{int(truncated)}".encode()
