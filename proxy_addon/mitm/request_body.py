"""
A matched request's body: collected within receipts_body_cap, and decoded (wire/bodies.py) for
the fingerprint. Past the cap, or with a coding that cannot be decoded, the request is
answered 413 or 400 and never sent; it is still forwarded exactly as the agent sent it.
"""

from __future__ import annotations

import asyncio
import logging

from mitmproxy import http

from proxy_addon.errors import BadEncoding, BodyTooLarge
from proxy_addon.mitm import internals
from proxy_addon.mitm.flows import refuse
from proxy_addon.outcome import http_answers as answers
from proxy_addon.wire.bodies import codings, decode_body

logger = logging.getLogger(__name__)


def bound(flow: http.HTTPFlow, meta: dict, cap: int) -> None:
    """
    Collect a matched request's body within receipts_body_cap (internals.BoundedBody): past
    the cap, or all of it when its Content-Length is above, it is read and dropped, and the
    `request` hook answers 413.
    """
    length = flow.request.headers.get("content-length", "").strip()
    if length.isdigit() and int(length) > cap:
        meta["body_over_cap"] = int(length)

    def overflow(received: int) -> None:
        meta["body_over_cap"] = max(received, meta.get("body_over_cap", 0))

    internals.bound_request_body(flow, 0 if "body_over_cap" in meta else cap, overflow)


async def decoded(flow: http.HTTPFlow, meta: dict, cap: int, *, configured: bool = True) -> bytes | None:
    """
    The request's body with its Content-Encoding decoded (wire/bodies.py), at most receipts_body_cap
    bytes as sent and decoded; None when the request was refused for it (answered 413 or 400).
    """
    raw = flow.request.raw_content or b""
    if not configured:
        return raw  # answered 503 (_begin)
    try:
        if "body_over_cap" in meta or len(raw) > cap:
            raise BodyTooLarge(cap)
        coding = flow.request.headers.get("content-encoding")
        if not codings(coding):
            return raw
        return await asyncio.to_thread(decode_body, raw, coding, limit=cap)  # a large body: off the event loop
    except (BodyTooLarge, BadEncoding) as e:
        too_large = isinstance(e, BodyTooLarge)
        logger.warning(f"receipt-proxy: {meta['api']} {meta['operation']} NOT forwarded: {e}")
        answer = answers.body_refused(meta["api"], meta["operation"], too_large=too_large, detail=str(e))
        refuse(flow, meta, answer, "body_too_large" if too_large else "bad_encoding", str(e))
        return None
