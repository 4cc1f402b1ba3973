"""
Marker secrets (tests/conftest.py: SECRETS) in Authorization, Cookie, an api-key header and a
?token= query reach neither the receipts DB, nor its WAL, nor the proxy's log.

This test checks the shared proxy's files while it runs (its WAL is there then). Every other
DB, WAL and log the run writes is checked after the last test, whichever tests ran, by the
session fixture no_marker_secret_anywhere in conftest.py: no file order is relied on.
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import marker_secrets_in, read


def test_no_secret_reaches_the_database_its_wal_or_the_log(proxy, clients, upstream, bucket):
    # A matched write and an unmatched request, whatever else ran.
    assert clients.send("requests", "POST", f"{upstream.url}/api/{bucket}/plain", {"title": "s"}).status == 201
    assert clients.send("curl", "POST", f"{upstream.url}/unruled/{bucket}", {"title": "s"}).status == 201
    wal = Path(f"{proxy.db}-wal")
    assert proxy.db.is_file() and wal.is_file() and proxy.log_path.is_file()
    assert marker_secrets_in([proxy.db, wal, Path(f"{proxy.db}-shm"), proxy.log_path]) == []
    # The ?token= value was redacted, not dropped silently.
    assert b"token=REDACTED" in read(proxy.db) + read(wal)
    assert "token=REDACTED" in proxy.log()
