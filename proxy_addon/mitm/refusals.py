"""
Matched requests the proxy answers itself and never sends, with no receipt written: a header
field no HTTP client can send (400, wire/fields.py), a header the proxy reads as text that is not
UTF-8 (400, fields.undecodable), text entering the intent that is no Unicode (400,
errors.UnpairedSurrogate), method override headers the rules cannot take (400), a request
target servers read differently (400: a fragment, `;` path parameters, RuleSet.match), a JSON
body servers read in more than one way (400, wire/json_body.py), a write a budget cannot count
(400, errors.UncountableWrite), and a store that cannot write the receipt (503: fail closed).
And the new writes the rules refuse, their receipt rejected: denied by a decision (403), past a
budget (429). Each logs one line naming the operation (never a header's value), answers, and
marks the flow (flows.refuse).
"""

from __future__ import annotations

import logging

from mitmproxy import http

from proxy_addon.mitm.flows import refuse
from proxy_addon.outcome import http_answers as answers
from proxy_addon.rules.ruleset import AMBIGUOUS_TARGET
from proxy_addon.store import Decision, Receipt

__all__ = [
    "bad_header",
    "bad_json",
    "bad_override",
    "bad_target",
    "by_rules",
    "denied",
    "over_budget",
    "refused",
    "unavailable",
    "uncountable",
    "undecodable_header",
    "unpaired_surrogate",
]

logger = logging.getLogger("proxy_addon.mitm.receipts_addon")


def bad_header(flow: http.HTTPFlow, meta: dict, header: str, problem: str) -> None:
    """A header field no HTTP client can send: 400 naming it, never its value."""
    logger.warning(f"receipt-proxy: {meta['api']} {meta['operation']} NOT forwarded: its {header} header {problem}")
    answer = answers.bad_header(meta["api"], meta["operation"], header, problem)
    refuse(flow, meta, answer, "bad_header", f"the {header} header {problem}")


def undecodable_header(flow: http.HTTPFlow, meta: dict, header: str) -> None:
    """A header the proxy reads as text (fingerprint, principal, key), not UTF-8: 400 naming it, not its value."""
    problem = "is not UTF-8 text"
    logger.warning(f"receipt-proxy: {meta['api']} {meta['operation']} NOT forwarded: its {header} header {problem}")
    answer = answers.undecodable_header(meta["api"], meta["operation"], header)
    refuse(flow, meta, answer, "undecodable_header", f"the {header} header {problem}")


def unpaired_surrogate(flow: http.HTTPFlow, meta: dict, why: str) -> None:
    """Text entering the intent that is no Unicode (a JSON "\\ud800" escape alone): 400, bad input, not 503."""
    logger.warning(f"receipt-proxy: {meta['api']} {meta['operation']} NOT forwarded: {why}")
    answer = answers.unpaired_surrogate(meta["api"], meta["operation"], why)
    refuse(flow, meta, answer, "unpaired_surrogate", why)


def denied(flow: http.HTTPFlow, meta: dict, receipt: Receipt, why: str) -> None:
    """A write a `deny` decision refused (intent/decisions.py): 403 naming the rule, its receipt rejected, not sent."""
    logger.warning(f"receipt-proxy: {meta['api']} {meta['operation']} NOT forwarded: {why}")
    body = {
        "error": "denied_by_policy",
        "operation_id": receipt.operation_id,
        "api": receipt.api,
        "operation": receipt.operation,
        "state": "rejected",
        "sent": False,
        "detail": why,
        "hint": "the rules deny this write; it was not sent, and sending it again is denied again",
    }
    refuse(flow, meta, answers.json_answer(403, body, answers.receipt_headers(receipt)), "denied", why)


def by_rules(flow: http.HTTPFlow, meta: dict, decision: Decision) -> None:
    """A new write the rules refused, its receipt rejected: denied by a decision (403), or past a budget (429)."""
    if decision.kind == "over_budget":
        over_budget(flow, meta, decision.receipt, decision.reason, decision.retry_after or 1)
    else:
        denied(flow, meta, decision.receipt, decision.reason)


def over_budget(flow: http.HTTPFlow, meta: dict, receipt: Receipt, why: str, retry_after: int) -> None:
    """A write past a budget (store/budgets.py): 429 with Retry-After, its receipt rejected, not sent."""
    logger.warning(f"receipt-proxy: {meta['api']} {meta['operation']} NOT forwarded: {why}")
    answer = answers.over_budget(receipt, why, retry_after)
    refuse(flow, meta, answer, "over_budget", why)


def uncountable(flow: http.HTTPFlow, meta: dict, why: str) -> None:
    """A write a budget sums a field of, with no number there (errors.UncountableWrite): 400, no receipt."""
    logger.warning(f"receipt-proxy: {meta['api']} {meta['operation']} NOT forwarded: {why}")
    refuse(flow, meta, answers.uncountable(meta["api"], meta["operation"], why), "budget_uncountable", why)


def refused(flow: http.HTTPFlow, meta: dict) -> None:
    """
    A match RuleSet.match refused (`meta["refused"]`), by its kind (`meta["refused_as"]`): a
    target servers read differently, a body read two ways on an MCP or GraphQL endpoint
    (bad_json), else method override headers or an MCP call the proxy cannot take.
    """
    if meta.get("refused_as") == AMBIGUOUS_TARGET:
        bad_target(flow, meta)
    elif meta.get("refused_as") == "bad_json":
        bad_json(flow, meta, meta["refused"])
    else:
        bad_override(flow, meta)


def bad_target(flow: http.HTTPFlow, meta: dict) -> None:
    """A request target servers read differently (a fragment, `;` path parameters) that can be a write: 400."""
    logger.warning(f"receipt-proxy: {meta['api']} {meta['operation']} NOT forwarded: {meta['refused']}")
    answer = answers.ambiguous_target(meta["api"], meta["operation"], meta["refused"])
    refuse(flow, meta, answer, AMBIGUOUS_TARGET, meta["refused"])


def bad_override(flow: http.HTTPFlow, meta: dict) -> None:
    """Method override headers that name different methods or that the rule refuses, an MCP call the proxy
    cannot take: 400."""
    logger.warning(f"receipt-proxy: {meta['api']} {meta['operation']} NOT forwarded: {meta['refused']}")
    answer = answers.method_override_refused(meta["api"], meta["operation"], meta["refused"])
    refuse(flow, meta, answer, "method_override_refused", meta["refused"])


def bad_json(flow: http.HTTPFlow, meta: dict, why: str) -> None:
    """A JSON body servers read in more than one way (a key twice; on MCP and GraphQL, not strict): 400."""
    logger.warning(f"receipt-proxy: {meta['api']} {meta['operation']} NOT forwarded: {why}")
    refuse(flow, meta, answers.bad_json(meta["api"], meta["operation"], why), "bad_json", why)


def unavailable(flow: http.HTTPFlow, meta: dict, why: str) -> None:
    """No receipt could be written (or the proxy is not configured): 503, loudly."""
    logger.error(f"receipt-proxy: {meta['api']} {meta['operation']} NOT forwarded, no receipt could be written: {why}")
    answer = answers.unavailable(meta["api"], meta["operation"], why)
    refuse(flow, meta, answer, "store_unavailable", f"no receipt could be written ({why})", marker="store_unavailable")
