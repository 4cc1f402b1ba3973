"""receipt-proxy: durable receipts for the writes an agent sends, as a mitmproxy addon."""

from proxy_addon.errors import (
    IllegalTransition,
    ReceiptsError,
    RulesError,
    StoreError,
    StoreUnavailable,
    UnknownReceipt,
)
from proxy_addon.rules import RuleSet, load_rules, load_rules_path
from proxy_addon.states import TRANSITIONS, UNRESOLVED, State
from proxy_addon.store import Attempt, Decision, Event, Receipt, Store

__all__ = [
    "TRANSITIONS",
    "UNRESOLVED",
    "Attempt",
    "Decision",
    "Event",
    "IllegalTransition",
    "Receipt",
    "ReceiptsError",
    "RuleSet",
    "RulesError",
    "State",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "UnknownReceipt",
    "load_rules",
    "load_rules_path",
]
