"""
Runs last (pytest takes files in name order): every request the suite sent through a
proxy carried distinct marker secrets in Authorization, Cookie, an api-key header and a
?token= query. None of them may be in any receipts DB, its WAL, or any proxy's log.
"""

from __future__ import annotations

from tests.conftest import SECRETS


def test_no_secret_reaches_any_database_or_log(proxy, clients, upstream, bucket, tmp_path_factory):
    # At least these two, whatever else ran: a matched write and an unmatched request.
    assert clients.send("requests", "POST", f"{upstream.url}/api/{bucket}/plain", {"title": "s"}).status == 201
    assert clients.send("curl", "POST", f"{upstream.url}/unruled/{bucket}", {"title": "s"}).status == 201
    base = tmp_path_factory.getbasetemp()
    dbs = [p for p in base.rglob("*.db*") if p.is_file() and not p.name.endswith(".lock")]
    logs = [p for p in base.rglob("*.log") if p.is_file()]
    assert proxy.db in dbs and proxy.log_path in logs
    assert any(p.name.endswith("-wal") for p in dbs)
    for path in dbs + logs:
        try:
            data = path.read_bytes()
        except FileNotFoundError:  # a WAL removed as its last connection closed: its pages are in the DB
            continue
        for name, secret in SECRETS.items():
            assert secret.encode() not in data, f"the {name} secret reached {path}"
    # The ?token= value was redacted, not dropped silently.
    assert b"token=REDACTED" in b"".join(p.read_bytes() for p in dbs if p.exists())
    assert "token=REDACTED" in proxy.log()
