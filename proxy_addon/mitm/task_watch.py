"""
A client's `tasks/get` and `tasks/result` passing through the proxy, read as they pass: they are
reads, never writes, and go untouched, but their answers may say that the task a write waits for
has ended (outcome/task_ends.py), which settles its receipt (gate.task_seen) before the answer goes on.

A request to an MCP endpoint the rules name (whose body named no write: body_match.settle) is
noted in the request hook (`note_read`); its answer, JSON or an event stream, is read in the
response hook (`learn`). What is kept in the flow's metadata is the API, the request's JSON-RPC id,
the method and the task id, only until its answer comes (never stored: the store keeps a task's
id sealed, store/rounds.py). An answer that settles nothing (no write waits for that task, an
error, a task not ended) changes nothing.
"""

from __future__ import annotations

import logging

from mitmproxy import http

from proxy_addon.errors import ReceiptsError
from proxy_addon.gate.admission import Gate
from proxy_addon.outcome.task_ends import get_report, result_report, task_request
from proxy_addon.rules import RuleSet
from proxy_addon.store import Receipt
from proxy_addon.wire.jsonpath import parse_json
from proxy_addon.wire.jsonrpc import response_for

logger = logging.getLogger(__name__)

TASK_READ = "receipts_task_read"  # flow.metadata: (api, JSON-RPC id, method, task id) of a tasks/get or tasks/result


def note_read(flow: http.HTTPFlow, body: bytes, api: str) -> None:
    """A tasks/get or tasks/result request to an endpoint of `api`: its answer is read in the response hook."""
    if flow.request.method != "POST":
        return
    doc = parse_json(body)
    asked = task_request(doc)
    if asked is not None and isinstance(doc, dict):
        flow.metadata[TASK_READ] = (api, doc["id"], *asked)


async def learn(flow: http.HTTPFlow, gate: Gate, rules: RuleSet) -> None:
    noted = flow.metadata.pop(TASK_READ, None)
    resp = flow.response
    if noted is None or resp is None or resp.status_code // 100 != 2:
        return
    api, rid, method, task_id = noted
    try:
        body = resp.content or b""
    except ValueError:  # a Content-Encoding mitmproxy cannot undo: nothing learnt
        return
    message = response_for(body, resp.headers.get("content-type"), rid)
    if message is None:
        return

    def operation(receipt: Receipt):  # the rules in force now name the receipt's operation (or none: not settled)
        return rules.operation(receipt.api, receipt.operation)

    try:
        if method == "tasks/get":
            report = get_report(message)
            if report is not None:
                await gate.task_seen(api, task_id, report, operation)
            return
        waiting = await gate.calls(lambda s: s.waiting_task(api, task_id))  # tasks/result: its error needs the status
        report = result_report(message, waiting.task_status if waiting is not None else None)
        if waiting is not None and report is not None:
            await gate.task_seen(api, task_id, report, operation)
    except ReceiptsError as e:  # the answer passes all the same; the write's receipt waits on
        logger.warning(f"receipt-proxy: a {method} answer passing to {api} was not read for its task: {e}")
