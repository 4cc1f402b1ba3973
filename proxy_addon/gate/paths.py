"""
Where things live by default, for the proxy and the `receipts` CLI alike.

    receipts.db, secret.key     in $RECEIPT_PROXY_STATE_DIR, else ~/.local/state/receipt-proxy
    the rules                   $RECEIPT_PROXY_RULES, else rules/ of this checkout

The proxy's options (`receipts_db`, `receipts_secret`, `receipts_rules`) override these;
the CLI's `--db` and `--rules` too.
"""

from __future__ import annotations

import os
from pathlib import Path

STATE_DIR = "~/.local/state/receipt-proxy"
DB_NAME = "receipts.db"
KEY_NAME = "secret.key"
DEFAULT_DB = f"{STATE_DIR}/{DB_NAME}"
DEFAULT_RULES = str(Path(__file__).resolve().parents[2] / "rules")  # rules/ of this checkout


def default_db() -> str:
    """The receipts database the CLI opens: $RECEIPT_PROXY_DB, else in $RECEIPT_PROXY_STATE_DIR, else DEFAULT_DB."""
    if os.environ.get("RECEIPT_PROXY_DB"):
        return os.environ["RECEIPT_PROXY_DB"]
    if os.environ.get("RECEIPT_PROXY_STATE_DIR"):
        return str(Path(os.environ["RECEIPT_PROXY_STATE_DIR"]) / DB_NAME)
    return DEFAULT_DB


def default_rules() -> str:
    return os.environ.get("RECEIPT_PROXY_RULES") or DEFAULT_RULES


def key_path(db: str | Path, secret: str | None = None) -> Path:
    """
    The HMAC key: `secret` if given, else secret.key beside the SQLite database, or for a
    PostgreSQL database in $RECEIPT_PROXY_STATE_DIR, else in ~/.local/state/receipt-proxy.
    """
    if secret:
        return Path(secret).expanduser()
    from proxy_addon.store.dsn import is_postgres  # gate/paths.py is imported before the store

    if is_postgres(db):
        return Path(os.environ.get("RECEIPT_PROXY_STATE_DIR") or STATE_DIR).expanduser() / KEY_NAME
    return Path(db).expanduser().parent / KEY_NAME
