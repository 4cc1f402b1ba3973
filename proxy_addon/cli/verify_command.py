"""
`receipts verify [BUNDLE]`: recompute the events' hash chain, check its signed checkpoints and each
receipt's state, in the database or in a bundle of `receipts export --signed` (docs/proof.md).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from proxy_addon.cli.values import UsageError
from proxy_addon.errors import StoreError
from proxy_addon.gate.paths import default_db
from proxy_addon.proof.bundle_lines import BundleError, verify_bundle
from proxy_addon.proof.chain_audit import Verdict
from proxy_addon.proof.chain_verdict import verdict_of
from proxy_addon.store import ReceiptStore, is_postgres, open_store


def verify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", nargs="?", metavar="BUNDLE", help="a bundle of `receipts export --signed` (else: --db)")
    # `receipts verify --db DB` as well as `receipts --db DB verify` (SUPPRESS: the top level's value stays).
    p.add_argument("--db", default=argparse.SUPPRESS, help="the receipts database (as `receipts --db`)")
    p.add_argument(
        "--public-key",
        metavar="KEY",
        help="the verifier key checkpoints must be signed with (receipt-proxy+<id>+<base64>, or a file holding it); "
        "default: the one the database (or the bundle) records",
    )


def verify_run(args: argparse.Namespace) -> int:
    public_key = given_verifier(args.public_key)
    if args.bundle is not None:
        if args.db is not None:
            raise UsageError("give a BUNDLE or --db, not both")
        try:
            with open(args.bundle, encoding="utf-8") as f:
                verdict = verify_bundle(f, public_key)
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"cannot read the bundle {args.bundle}: {e}") from None
        except BundleError as e:
            raise UsageError(f"{args.bundle}: {e}") from None
    else:
        given = args.db or default_db()
        store = open_store(given if is_postgres(given) else os.path.expanduser(given), create=False)
        try:
            verdict = audit_store(store, public_key)
        finally:
            store.close()
    print(verdict.line())
    return 0 if verdict.intact else 1


def audit_store(store: ReceiptStore, verifier: str | None = None) -> Verdict:
    """The database's verdict, its checkpoints checked with `verifier`, else with the key it records."""
    try:
        verifier = verifier or store.recorded_checkpoint_key()
        return verdict_of(store.chain_records(), store.receipt_states(), store.checkpoints(), verifier)
    except StoreError as e:
        raise StoreError(f"{e} (a database from before the hash chain: open it with the proxy once)") from e


def given_verifier(value: str | None) -> str | None:
    """--public-key: a verifier key, or a file holding one."""
    if value is None:
        return None
    if "+" not in value and Path(value).is_file():
        return Path(value).read_text().strip()
    if "+" not in value:
        raise UsageError(f"--public-key: {value!r} is neither a verifier key (receipt-proxy+...) nor a file")
    return value.strip()
