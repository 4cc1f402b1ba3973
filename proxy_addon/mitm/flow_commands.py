"""
`receipts.*` commands for mitmproxy's command prompt and mitmweb's command bar (dotted names):

    receipts.show @focus
    receipts.reconcile @focus
    receipts.resolve @focus succeeded "the post is live"
"""

from __future__ import annotations

from mitmproxy import command, ctx, exceptions, http
from mitmproxy import flow as mflow

from proxy_addon.errors import ReceiptsError
from proxy_addon.mitm.flows import headers_of, meta_of
from proxy_addon.mitm.receipts_addon import Receipts
from proxy_addon.mitm.web import describe
from proxy_addon.states import RESOLUTIONS, State
from proxy_addon.store import Receipt
from proxy_addon.wire.redaction import credentials_from


class ReceiptCommands:
    def __init__(self, receipts: Receipts):
        self.receipts = receipts

    def _flow_receipt(self, f: mflow.Flow) -> tuple[dict, Receipt]:
        meta = meta_of(f)
        reader = self.receipts.reader()
        if meta is None or reader is None:
            raise exceptions.CommandError("this flow has no receipt")
        return meta, reader.get(meta["operation_id"])

    @command.command("receipts.show")
    def show(self, f: mflow.Flow) -> str:
        """The receipt behind a flow, with its history: receipts.show @focus"""
        meta, receipt = self._flow_receipt(f)
        reader = self.receipts.reader()
        assert reader is not None
        return describe(reader, receipt.operation_id, answer=meta.get("answer"))

    @command.command("receipts.reconcile")
    def reconcile_flow(self, f: mflow.Flow) -> str:
        """Look for a flow's unknown outcome with a read, using the flow's credentials: receipts.reconcile @focus"""
        meta, receipt = self._flow_receipt(f)
        rules, gate = self.receipts.rules, self.receipts.gate
        op = rules.operation(meta["api"], meta["operation"]) if rules else None
        if receipt.state not in (State.OUTCOME_UNKNOWN, State.MANUAL_REVIEW):
            raise exceptions.CommandError(
                f"receipt {receipt.operation_id} is {receipt.state}; "
                "only outcome_unknown and manual_review receipts are reconciled"
            )
        if op is None or gate is None:
            raise exceptions.CommandError(f"the rules no longer have {receipt.api} {receipt.operation}")
        if not isinstance(f, http.HTTPFlow):  # receipts are made for HTTP flows only
            raise exceptions.CommandError("this flow has no receipt")
        credentials = credentials_from(op.credential_headers, headers_of(f.request))
        # The gate runs the read as a task of its own and holds it until it ends; the flow's comment shows the result.
        gate.reconcile(
            op,
            receipt,
            credentials,
            reason="an operator asked for a read",
            actor="mitmweb operator (receipts.reconcile)",
        )
        return f"reconciling receipt {receipt.operation_id}; its flow's comment shows the result"

    @command.command("receipts.resolve")
    def resolve_flow(self, f: mflow.Flow, state: str, note: str) -> str:
        """Settle a flow's receipt by hand: receipts.resolve @focus succeeded|safe_to_retry|rejected "why" """
        _, receipt = self._flow_receipt(f)
        if state not in {s.value for s in RESOLUTIONS}:
            raise exceptions.CommandError(f"resolve as one of {', '.join(RESOLUTIONS)}, not {state!r}")
        calls = self.receipts.calls
        assert calls is not None
        try:
            done = calls.wait(
                lambda s: s.resolve(receipt.operation_id, State(state), note=note, actor="mitmweb operator"),
                timeout=ctx.options.receipts_lock_timeout + 1,
            )
        except (ReceiptsError, ValueError) as e:
            raise exceptions.CommandError(str(e)) from None
        self.receipts.refresh_flow(done)
        return f"receipt {done.operation_id} is now {done.state}"
