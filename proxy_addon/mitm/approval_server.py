"""
The approval links' endpoint: `--set receipts_approval_listen=HOST:PORT` (empty: off).

    GET  /approvals/<token>    a page that shows the held write and a button (decides nothing)
    POST /approvals/<token>    decides: the approval or denial recorded in the store

A token is a signed link (gate/approval_links.py), made for one receipt, one action, its intent
fingerprint and the rules' version it was held under, valid until the approval's timeout. The
endpoint serves nothing else: without a link of ours it answers 404, so the link is its
token. A POST records the decision as `receipts approve` does (`decide_approval`, the actor
`link:<remote address>`, the link's id and rules' version with it); the proxy that holds the
write applies it within a second, whichever proxy of a fleet served the link, since they share
the store and secret.key. A link used already, one whose write was decided otherwise, an expired
one, and one whose proxy stopped each get a page that says so, and nothing is recorded.

Served like the metrics (mitm/metrics_server.py): a thread of its own, started when the option is
set, moved when it changes, stopped by `done`; each request on a thread, its store calls through
the proxy's store thread. Listen on a loopback address unless the links must be followed from
elsewhere; `receipts_approval_url` is the base the links carry (default: http://HOST:PORT).
"""

from __future__ import annotations

import datetime as dt
import logging
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from mitmproxy import ctx, exceptions

from proxy_addon.errors import IllegalTransition, LinkUsed, StoreError, UnknownReceipt
from proxy_addon.gate import instances
from proxy_addon.gate.approval_links import BadLink, Link, link_id, link_key, verify
from proxy_addon.mitm import options
from proxy_addon.mitm.metrics_server import stop_serving
from proxy_addon.mitm.receipts_addon import Receipts
from proxy_addon.outcome import approval_pages as pages
from proxy_addon.states import State
from proxy_addon.store import PostgresStore, Receipt, ReceiptStore, iso

logger = logging.getLogger(__name__)

PREFIX = "/approvals/"
SLOTS = 16  # requests served at once; a connection past them is closed (each may take `timeout` to send)
FORM_MAX = 4096  # bytes of a POST's form read (a note); a larger one is refused
APPLIED_WAIT = 5.0  # seconds a POST waits to say what the holding proxy made of the decision
APPLIED_POLL = 0.1
HEADERS = {
    "Content-Type": "text/html; charset=utf-8",
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",  # the link is a capability: never in a Referer
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'",
}


class _Refused(Exception):
    """A link that decides nothing: the status and page that say why."""

    def __init__(self, status: int, body: bytes):
        self.status, self.body = status, body


class ApprovalServer:
    """The addon: serves the links' endpoint, and knows the base URL the links carry."""

    def __init__(self, receipts: Receipts):
        self.receipts = receipts
        self._at: tuple[str, int] | None = None
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def base_url(self) -> str | None:
        """Where links point: receipts_approval_url, else this endpoint's address; None: no links."""
        given = ctx.options.receipts_approval_url.strip()
        if given:
            return given.rstrip("/")
        if self._server is None or self._at is None:
            return None
        host = f"[{self._at[0]}]" if ":" in self._at[0] else self._at[0]
        return f"http://{host}:{self._server.server_port}"

    def configure(self, updated: set[str]) -> None:
        if "receipts_approval_listen" not in updated:
            return
        text = ctx.options.receipts_approval_listen
        try:
            at = options.parse_listen(text)
        except ValueError as e:
            raise exceptions.OptionsError(f"receipts_approval_listen: {e}") from None
        if at == self._at:
            return
        server = None
        if at is not None:
            try:
                server = _Server(at, self.receipts)
            except OSError as e:
                raise exceptions.OptionsError(
                    f"receipts_approval_listen: cannot serve approval links at {text}: {e.strerror or e}"
                ) from None
        self._stop()
        self._at, self._server = at, server
        if server is not None:
            self._thread = threading.Thread(target=server.serve_forever, name="receipts-approvals", daemon=True)
            self._thread.start()
            logger.info(f"receipt-proxy: approval links served at {self.base_url()}{PREFIX}")

    def done(self) -> None:
        self._stop()

    def _stop(self) -> None:
        stop_serving(self._server, self._thread)
        self._server = self._thread = None
        self._at = None


class _Server(ThreadingHTTPServer):
    """One thread per request, at most SLOTS at once: a connection past them is closed unanswered."""

    daemon_threads = True

    def __init__(self, at: tuple[str, int], receipts: Receipts):
        self.address_family = socket.AF_INET6 if ":" in at[0] else socket.AF_INET
        self.receipts = receipts
        self.slots = threading.BoundedSemaphore(SLOTS)
        super().__init__(at, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _holder_alive(receipts: Receipts, store: ReceiptStore, instance: str | None) -> bool:
    """Whether the proxy that holds a write still runs (its flock; on PostgreSQL, its lease)."""
    inst = receipts.installation
    if not instance or inst is None:
        return False
    if isinstance(store, PostgresStore):
        return instance in store.live_instances()
    return instance == inst.instance or instances.alive(Path(inst.db), instance, tidy=False)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = 10  # seconds a client may take to send its request
    server_version = "receipt-proxy-approvals"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # the path holds the link: never logged
        pass

    def do_GET(self) -> None:
        self._serve(post=False)

    def do_POST(self) -> None:
        self._serve(post=True)

    def _serve(self, *, post: bool) -> None:
        try:
            status, body = self._answer(post)
        except _Refused as r:
            status, body = r.status, r.body
        except Exception as e:  # never a traceback to the browser; said in the proxy's log
            logger.exception("receipt-proxy: an approval link failed")
            status, body = (
                500,
                pages.outcome("Not decided", f"The proxy could not handle this link: {type(e).__name__}"),
            )
        self.send_response(status)
        for k, v in HEADERS.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _calls(self, fn: Any) -> Any:
        calls = self.server.receipts.calls
        if calls is None:
            raise _Refused(503, pages.outcome("Not decided", "The proxy has no receipts store open; try again."))
        try:
            return calls.wait(fn, timeout=ctx.options.receipts_lock_timeout + 5)
        except TimeoutError:
            raise _Refused(503, pages.outcome("Not decided", "The receipts store is busy; try again.")) from None

    def _link(self) -> tuple[Link, str]:
        path = urllib.parse.urlsplit(self.path).path
        inst = self.server.receipts.installation
        if not path.startswith(PREFIX) or inst is None:
            raise _Refused(404, pages.outcome("Not found", "This address is not an approval link."))
        token = path[len(PREFIX) :]
        try:
            return verify(token, link_key(inst.key), now=time.time()), link_id(token)
        except BadLink as e:
            status, title = (410, "This link has expired") if e.kind == "expired" else (404, "Not a valid link")
            raise _Refused(status, pages.outcome(title, f"{e}. Nothing was decided.")) from None

    def _answer(self, post: bool) -> tuple[int, bytes]:
        link, lid = self._link()
        try:
            receipt = self._calls(lambda s: s.get(link.operation_id))
        except UnknownReceipt:
            raise _Refused(404, pages.outcome("Not found", "No receipt has this link's id.")) from None
        if receipt.intent_fingerprint != link.fingerprint:
            raise _Refused(409, pages.outcome("Not decided", "This link is for another write.", receipt))
        if not post:
            return self._confirm(link, lid, receipt)
        return self._decide(link, lid, self._note(link))

    def _confirm(self, link: Link, lid: str, receipt: Receipt) -> tuple[int, bytes]:
        """GET: show the write and the button; or why this link decides nothing now."""
        earlier = self._calls(lambda s: s.approval_decision(link.operation_id))
        if earlier is not None and earlier.link == lid:
            said = f"This link was used already: {earlier.decision} by {earlier.actor} at {earlier.decided_at}."
            raise _Refused(409, pages.outcome("Link used", said, receipt))
        if receipt.state is not State.AWAITING_APPROVAL or earlier is not None:
            by = f" ({earlier.decision} by {earlier.actor})" if earlier is not None else ""
            raise _Refused(409, pages.outcome("Already decided", f"This write was decided already{by}.", receipt))
        expires = iso(dt.datetime.fromtimestamp(link.expires, dt.UTC))
        return 200, pages.confirm(receipt, approve=link.approve, expires_at=expires)

    def _note(self, link: Link) -> str:
        length = int(self.headers.get("Content-Length") or 0)
        if length > FORM_MAX or length < 0:
            raise _Refused(413, pages.outcome("Not decided", "The form sent is too large."))
        form = urllib.parse.parse_qs(self.rfile.read(length).decode("utf-8", "replace")) if length else {}
        note = (form.get("note") or [""])[0].strip()[: pages.NOTE_MAX]
        return note or ("" if link.approve else "denied with an approval link")

    def _decide(self, link: Link, lid: str, note: str) -> tuple[int, bytes]:
        """POST: record the decision for the holding proxy; then say what became of the write."""
        receipts, actor = self.server.receipts, f"link:{self.client_address[0]}"

        def decide(s: ReceiptStore) -> Any:
            return s.decide_approval(
                link.operation_id,
                approve=link.approve,
                note=note,
                actor=actor,
                fingerprint=link.fingerprint,
                is_alive=lambda instance: _holder_alive(receipts, s, instance),
                rules_version=link.rules_version,
                link=lid,
            )

        try:
            decision = self._calls(decide)
        except LinkUsed as e:
            raise _Refused(409, pages.outcome("Link used", _sentence(str(e)))) from None
        except IllegalTransition as e:
            raise _Refused(409, pages.outcome("Not decided", _sentence(str(e)))) from None
        except StoreError as e:
            raise _Refused(503, pages.outcome("Not decided", f"The receipts store could not record it: {e}")) from None
        logger.warning(f"receipt {link.operation_id}: {decision.decision} by {actor} (approval link)")
        receipt = self._applied(link.operation_id)
        if receipt.state is State.AWAITING_APPROVAL:
            said = f"{decision.decision.capitalize()}: recorded; the proxy that holds the write applies it shortly."
            return 202, pages.outcome("Recorded", said, receipt)
        used = self._calls(lambda s: s.approval_decision(link.operation_id))
        if used is None or used.consumed_at is None:
            said = f"Your decision ({decision.decision}) was recorded but not applied: the write was decided otherwise."
            return 409, pages.outcome("Not applied", said, receipt)
        return 200, pages.outcome(decision.decision.capitalize(), f"The write was {decision.decision}.", receipt)

    def _applied(self, operation_id: str) -> Receipt:
        """The receipt once the holding proxy has moved it on, or after APPLIED_WAIT."""
        deadline = time.monotonic() + APPLIED_WAIT
        receipt: Receipt = self._calls(lambda s: s.get(operation_id))
        while receipt.state is State.AWAITING_APPROVAL and time.monotonic() < deadline:
            time.sleep(APPLIED_POLL)
            receipt = self._calls(lambda s: s.get(operation_id))
        return receipt
