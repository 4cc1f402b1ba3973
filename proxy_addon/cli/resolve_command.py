"""`receipts resolve`: settle an outcome_unknown or manual_review receipt by hand."""

from __future__ import annotations

import argparse

from proxy_addon.cli import cli_spans
from proxy_addon.cli.values import UsageError, cli_actor
from proxy_addon.states import RESOLUTIONS, State
from proxy_addon.store import ReceiptStore


def resolve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("operation_id", metavar="ID", help="an outcome_unknown or manual_review receipt")
    p.add_argument(
        "--as",
        dest="resolution",
        required=True,
        choices=[s.value for s in RESOLUTIONS],
        help="what happened: succeeded (it took effect), safe_to_retry (it provably did not), "
        "rejected (the API refused it)",
    )
    p.add_argument("--note", required=True, help="why you know: recorded in the receipt's history")
    p.add_argument("--external-id", metavar="X", help="the id the API gave the created object (with --as succeeded)")


def resolve_run(store: ReceiptStore, args: argparse.Namespace) -> int:
    if not args.note.strip():
        raise UsageError("--note must say how you know what happened")
    if args.external_id is not None and args.resolution != State.SUCCEEDED:
        raise UsageError(f"--external-id goes with --as succeeded, not --as {args.resolution}")
    receipt = store.get(args.operation_id)
    before = receipt.state
    # OpenTelemetry (OTEL_EXPORTER_OTLP_*): a person's resolution is a span linked to the write's (cli/cli_spans.py)
    with cli_spans.opened() as spans, cli_spans.change(spans, "receipt.resolve", receipt) as span:
        r = store.resolve(
            args.operation_id,
            State(args.resolution),
            note=args.note.strip(),
            actor=cli_actor(),
            external_id=args.external_id,
        )
        if span is not None:  # the note is a person's free text: not in the span
            span.set_attribute("receipt.state", str(r.state))
    print(f"{r.operation_id} is now {r.state} (was {before})")
    return 0
