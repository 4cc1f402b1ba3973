"""
The receipts store every backend subclasses (`ReceiptStore`), put together from one mixin per
job, each written once over the backend's primitives (base.py says what they guarantee):

    transitions.py  guarded transitions and their events, and the observer told of them
    attempts.py     the hot path: deciding an attempt (`begin_attempt`)
    store/approval_decisions.py    operators' decisions on held writes (`decide_approval`, `apply_approval`)
    resolutions.py  settling an unknown outcome by hand (`resolve`) or claiming it for a read
    retention.py    pruning old resolved receipts (`prune`)
    recovery.py     moving on what a stopped proxy left in flight (`recover_in_flight`)
    key_check.py    the check value of the installation's secret.key (`check_key`)
    hash_chain.py   the events' hash chain: the one INSERT of an event, the chain read back in order
    checkpoints.py  signed checkpoints of the chain, and the fleet's verifier key
    versions.py     the fingerprint versions receipts still hold, and the rules' descriptions
    store/queries.py        the reads

    store = Store.open("receipts.db")
    decision = store.begin_attempt(attempt)      # committed before it returns
    if decision.kind == "forward":
        ...send once...
        store.transition(decision.receipt.operation_id, State.SUCCEEDED, reason="HTTP 201")

Every write runs in one `_write()` transaction of the backend.
"""

from __future__ import annotations

from proxy_addon.store.approval_decisions import ReceiptApprovals
from proxy_addon.store.attempts import ReceiptAttempts
from proxy_addon.store.checkpoints import ReceiptCheckpoints
from proxy_addon.store.key_check import ReceiptKeyCheck
from proxy_addon.store.recovery import ReceiptRecovery
from proxy_addon.store.resolutions import ReceiptResolutions
from proxy_addon.store.retention import ReceiptRetention
from proxy_addon.store.versions import ReceiptVersions


class ReceiptStore(
    ReceiptAttempts,
    ReceiptApprovals,
    ReceiptResolutions,
    ReceiptRecovery,
    ReceiptRetention,
    ReceiptVersions,
    ReceiptKeyCheck,
    ReceiptCheckpoints,
):
    """The receipts store over a backend's primitives. A backend subclasses it (sqlite.py, postgres.py)."""
