"""
Tell a person that a write is held: `--set receipts_approval_webhook=URL`.

When a write is held for approval (mitm/approval.py), this addon POSTs a signed JSON notice to the
URL (gate/approval_notice.py: the receipt, the intent's named fields, approve and deny links,
and a Slack-compatible `text`), on a task of its own: the held write, and every other flow, go
on without waiting for it. A webhook that fails (no connection, a timeout, an answer that is not
2xx) is logged and counted (receipt_proxy_approval_webhooks_total{result="failed"}); the write
stays held until it is decided or its timeout denies it. The notice is sent once: never retried.

The body is signed with HMAC-SHA256 under the webhook secret: the file receipts_approval_webhook_secret
names, or the value of $RECEIPT_PROXY_WEBHOOK_SECRET. A webhook without a secret is refused at startup.
The links point at receipts_approval_url, else at this proxy's receipts_approval_listen
(mitm/approval_server.py); with neither, `links` is null and the text says how to decide from the CLI.
The webhook is sent directly (not through HTTP(S)_PROXY), and its URL, which may be a secret
itself (Slack's are), is logged by its scheme and host only.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import urllib.parse
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import httpx
from mitmproxy import ctx, exceptions

from proxy_addon.gate.approval_links import Link, link_key, link_url, sign
from proxy_addon.gate.approval_notice import notice_body, signed_headers
from proxy_addon.mitm.receipts_addon import Receipts
from proxy_addon.store import Receipt

logger = logging.getLogger(__name__)

SECRET_ENV = "RECEIPT_PROXY_WEBHOOK_SECRET"
TIMEOUT = 10.0  # seconds a webhook POST may take
NAMES = ("receipts_approval_webhook", "receipts_approval_webhook_secret")


def _secret(path: str) -> bytes:
    """The webhook secret: the file's content (trimmed), else the environment's; OptionsError when none."""
    if path:
        try:
            value = Path(path).expanduser().read_bytes().strip()
        except OSError as e:
            raise exceptions.OptionsError(f"receipts_approval_webhook_secret: cannot read {path}: {e}") from None
        if not value:
            raise exceptions.OptionsError(f"receipts_approval_webhook_secret: {path} is empty")
        return value
    value = os.environ.get(SECRET_ENV, "").strip().encode()
    if not value:
        raise exceptions.OptionsError(
            f"receipts_approval_webhook needs a secret to sign its notices: a file named by "
            f"receipts_approval_webhook_secret, or ${SECRET_ENV}"
        )
    return value


def shown(url: str) -> str:
    """A URL as logs show it: scheme and host (its path and query may be a secret, as Slack's are)."""
    u = urllib.parse.urlsplit(url)
    return f"{u.scheme}://{u.hostname or ''}{f':{u.port}' if u.port else ''}/…"


class ApprovalWebhook:
    def __init__(self, receipts: Receipts, base_url: Callable[[], str | None]):
        self.receipts = receipts
        self._base_url = base_url
        self._url: str | None = None
        self._secret = b""
        self._client: httpx.AsyncClient | None = None
        self._sending: set[asyncio.Task] = set()

    def configure(self, updated: set[str]) -> None:
        if not updated & set(NAMES):
            return
        url = ctx.options.receipts_approval_webhook.strip()
        if url:
            u = urllib.parse.urlsplit(url)
            if u.scheme not in ("http", "https") or not u.hostname:
                raise exceptions.OptionsError(f"receipts_approval_webhook: {shown(url)} is not an http(s) URL")
            self._secret = _secret(ctx.options.receipts_approval_webhook_secret)
            if self._client is None:
                self._client = httpx.AsyncClient(timeout=TIMEOUT, trust_env=False, follow_redirects=False)
        self._url = url or None
        self.receipts.approvals.notify = self.notify if url else None

    def notify(self, receipt: Receipt, expires_at: datetime, version: str) -> None:
        """A write is held: send its notice on a task of its own (kept until it ends)."""
        if self._url is None or self._client is None:
            return
        links = self._links(receipt, expires_at, version)
        body = notice_body(receipt, expires_at=expires_at, rules_version=version, links=links)
        task = asyncio.get_running_loop().create_task(self._post(self._client, self._url, body, receipt))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    def _links(self, receipt: Receipt, expires_at: datetime, version: str) -> dict[str, str] | None:
        base, inst = self._base_url(), self.receipts.installation
        if base is None or inst is None:
            return None
        key, expires = link_key(inst.key), int(expires_at.timestamp())
        fp = receipt.intent_fingerprint
        return {
            action: link_url(base, sign(Link(receipt.operation_id, action, fp, version, expires), key))
            for action in ("approve", "deny")
        }

    async def _post(self, client: httpx.AsyncClient, url: str, body: bytes, receipt: Receipt) -> None:
        headers = signed_headers(body, self._secret, int(time.time()))
        try:
            answer = await client.post(url, content=body, headers=headers)
            failed = None if answer.is_success else f"it answered {answer.status_code}"
        except httpx.HTTPError as e:
            failed = (f"{type(e).__name__}: {e}" if str(e) else type(e).__name__).replace(url, shown(url))
        metrics = self.receipts.metrics
        metrics.notified(receipt.api, receipt.operation, ok=failed is None)
        if failed is not None:
            logger.warning(
                f"receipt {receipt.operation_id}: the approval webhook {shown(url)} failed ({failed}); "
                "the write stays held until it is decided or its timeout denies it"
            )
        else:
            logger.info(f"receipt {receipt.operation_id}: approval webhook sent to {shown(url)}")

    async def done(self) -> None:
        for task in list(self._sending):
            task.cancel()
        if self._client is not None:
            await self._client.aclose()
            self._client = None
