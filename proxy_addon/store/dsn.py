"""
Which `receipts_db` / `--db` values name a PostgreSQL database (a URL or libpq conninfo, else a
SQLite path: `is_postgres`), and how messages show one: `describe` (user, host, port, database)
and `without_password`. Nothing here connects; libpq's own parsing (psycopg.conninfo) decides.
MISSING says why PostgreSQL cannot be used on this machine (no psycopg or no libpq), or is None.

    is_postgres("postgresql://proxy@db.internal/receipts")   # True
    is_postgres("host=db.internal dbname=receipts")          # True (conninfo)
    is_postgres("/var/lib/receipts/a=b.db")                  # False: a SQLite file
"""

from __future__ import annotations

import os
import re
import urllib.parse

try:  # psycopg needs libpq (Debian's libpq5) or its binary extra: only a PostgreSQL database needs either
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    MISSING: str | None = None
except ImportError as e:  # pragma: no cover - depends on the machine
    MISSING = (
        f"PostgreSQL needs psycopg with libpq ({e}): pip install 'psycopg[binary]', or install libpq "
        "(apt-get install libpq5)"
    )

_URL = re.compile(r"^postgres(ql)?://", re.IGNORECASE)
_CONNINFO = re.compile(r"^\s*[a-z_]+\s*=", re.IGNORECASE)


def is_postgres(db: str | os.PathLike[str]) -> bool:
    """Whether a `receipts_db` / `--db` value names a PostgreSQL database (a URL or libpq conninfo)."""
    s = os.fspath(db)
    if _URL.match(s):
        return True
    if not _CONNINFO.match(s):
        return False
    if MISSING:
        return bool(re.match(r"^\s*(host|hostaddr|port|dbname|user|service|sslmode)\s*=", s))
    try:
        conninfo_to_dict(s)
    except psycopg.Error:
        return False  # a path with '=' in it: a SQLite file
    return True


def without_password(db: str) -> tuple[str, bool]:
    """
    `db` without the password it carries, and whether it carried one: a URL keeps its form
    (`postgresql://user:pw@host/db?password=pw` → `postgresql://user@host/db`), conninfo is
    rewritten by libpq's rules. A SQLite path, or a value that cannot be parsed, is returned as is.
    """
    if MISSING or not is_postgres(db):
        return db, False
    if _URL.match(db):
        parts = urllib.parse.urlsplit(db)
        userinfo, _, hostport = parts.netloc.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True) if k != "password"]
        if not colon and len(query) == len(urllib.parse.parse_qsl(parts.query, keep_blank_values=True)):
            return db, False
        netloc = f"{user}@{hostport}" if user else hostport
        rest = f"?{urllib.parse.urlencode(query)}" if query else ""  # (urlunsplit drops `//` before an empty host)
        return f"{parts.scheme}://{netloc}{parts.path}{rest}", True
    try:
        params = conninfo_to_dict(db)
    except psycopg.Error:
        return db, False
    if "password" not in params:
        return db, False
    del params["password"]
    return make_conninfo("", **params), True


def describe(dsn: str) -> str:
    """The database as messages name it: `postgresql://user@host:port/dbname`, never the password."""
    if MISSING:
        return "postgresql://(psycopg is missing)"
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error:
        return "postgresql://(unparsable connection string)"
    env = os.environ
    user = str(params.get("user") or env.get("PGUSER") or "")
    host = str(params.get("host") or params.get("hostaddr") or env.get("PGHOST") or "")
    port = str(params.get("port") or env.get("PGPORT") or "")
    dbname = str(params.get("dbname") or env.get("PGDATABASE") or "")
    if "/" in str(host):  # a Unix socket directory
        host = f"[{host}]"
    where = f"{host}:{port}" if port else f"{host}"
    return f"postgresql://{user + '@' if user else ''}{where}/{dbname}"
