"""
Which proxy processes are alive, so that recovery only touches the receipts of dead ones.

Each process claims an instance id and holds an exclusive `flock` on
`<db>.instances/<id>.lock` for as long as it lives; the kernel releases it when the process
dies, however it dies. Several proxies can then share one receipts database: at startup,
each moves to `outcome_unknown` only the in-flight receipts of instances whose lock is free.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
from pathlib import Path


def directory(db: Path) -> Path:
    return db.parent / f"{db.name}.instances"


def claim(db: Path) -> tuple[str, int]:
    """A fresh instance id, with a lock file held for as long as this process lives."""
    d = directory(db)
    d.mkdir(mode=0o700, exist_ok=True)
    instance = f"{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(d / f"{instance}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return instance, fd


def alive(db: Path, instance: str | None, *, tidy: bool = True) -> bool:
    """Whether the process that claimed `instance` still runs; `tidy`: remove a dead one's lock file."""
    if not instance:
        return False
    path = directory(db) / f"{instance}.lock"
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        if tidy:
            with contextlib.suppress(OSError):
                path.unlink()
        return False
    finally:
        os.close(fd)
