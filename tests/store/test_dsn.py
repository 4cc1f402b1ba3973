"""
Which `receipts_db` / `--db` values name a PostgreSQL database (store/dsn.py), without a server: a URL or
libpq conninfo, and the password taken out of the option and kept for connecting. The PostgreSQL
backend against a real server: tests/e2e/store/test_postgres.py.
"""

from __future__ import annotations

from proxy_addon.store import is_postgres


def test_what_names_postgresql():
    for db in (
        "postgresql://u@h/db",
        "postgres://h",
        "postgresql://",
        "host=db.internal dbname=receipts",
        "dbname=receipts",
    ):
        assert is_postgres(db), db
    for db in ("receipts.db", "./a=b.db", "/var/lib/receipts.db", "~/state/receipts.db", "weird=name.db"):
        assert not is_postgres(db), db


def test_a_password_is_taken_out_of_the_option_and_kept_for_connecting():
    from proxy_addon.store.dsn import without_password

    cases = {
        "postgresql://proxy:s3cret-PW@db.internal:5433/receipts?sslmode=require": (
            "postgresql://proxy@db.internal:5433/receipts?sslmode=require",
            True,
        ),
        "postgres://proxy@db/r?password=s3cret-PW&sslmode=verify-full": (
            "postgres://proxy@db/r?sslmode=verify-full",
            True,
        ),
        "postgresql://:s3cret-PW@/receipts?host=/run/postgresql": (
            "postgresql:///receipts?host=%2Frun%2Fpostgresql",
            True,
        ),
        "postgresql://proxy@db.internal/receipts": ("postgresql://proxy@db.internal/receipts", False),
        "/var/lib/receipt-proxy/receipts.db": ("/var/lib/receipt-proxy/receipts.db", False),
    }
    for given, expected in cases.items():
        assert without_password(given) == expected, given
    shown, had = without_password("host=db.internal user=proxy password=s3cret-PW dbname=receipts")
    assert had and "s3cret" not in shown and "host=db.internal" in shown and "dbname=receipts" in shown
