"""
The floor for answers made by an addon: every request is answered at once with a constant
JSON 200 in the `request` hook, without touching any upstream or database.

A duplicate answered from the receipts record cannot be faster than this; the difference
between the two is ours (the store lookups and the duplicate's audit event).
"""

import logging

from mitmproxy import http

BODY = b'{"id": 0}'


def running() -> None:
    logging.getLogger("bench").info("bench-constant: ready")


def request(flow: http.HTTPFlow) -> None:
    flow.response = http.Response.make(200, BODY, {"Content-Type": "application/json"})
