"""
proxy_addon/gate/instances.py: which proxy processes are alive, by an exclusive flock that each
holds on `<db>.instances/<id>.lock` for as long as it lives. A process killed with SIGKILL:
tests/e2e/gate/test_instances.py.
"""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path

import pytest

from proxy_addon.gate import instances


def lock_path(db: Path, instance: str) -> Path:
    return db.parent / f"{db.name}.instances" / f"{instance}.lock"


def locked_by_someone(path: Path) -> bool:
    """Whether another open file description holds an exclusive flock on `path`."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


@pytest.fixture
def db(tmp_path) -> Path:
    return tmp_path / "receipts.db"


def test_claim_gives_a_fresh_id_and_holds_its_lock(db):
    instance, fd = instances.claim(db)
    try:
        assert instance.startswith(f"{os.getpid()}-")
        path = lock_path(db, instance)
        assert instances.directory(db) == path.parent
        assert path.is_file()
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert locked_by_someone(path)
        other, other_fd = instances.claim(db)  # a second claim, as a second proxy on the same DB
        try:
            assert other != instance
            assert locked_by_someone(lock_path(db, other))
        finally:
            os.close(other_fd)
    finally:
        os.close(fd)


def test_a_held_lock_is_alive_and_stays(db):
    instance, fd = instances.claim(db)
    try:
        assert instances.alive(db, instance) is True
        assert instances.alive(db, instance) is True  # asking does not take or remove the lock
        assert lock_path(db, instance).is_file()
        assert locked_by_someone(lock_path(db, instance))
    finally:
        os.close(fd)


@pytest.mark.parametrize("instance", [None, "", "12345-deadbeef"], ids=["none", "empty", "unknown"])
def test_an_unknown_instance_is_not_alive(db, instance):
    held, fd = instances.claim(db)  # the directory exists and holds another instance's lock
    try:
        assert instances.alive(db, instance) is False
        assert sorted(p.name for p in instances.directory(db).iterdir()) == [f"{held}.lock"]
    finally:
        os.close(fd)


def test_no_instances_directory_is_not_alive(db):
    assert instances.alive(db, "12345-deadbeef") is False
    assert not instances.directory(db).exists()


def test_a_released_lock_is_not_alive_and_its_file_is_removed(db):
    instance, fd = instances.claim(db)
    other, other_fd = instances.claim(db)
    try:
        os.close(fd)  # as the kernel does when the holder dies
        assert instances.alive(db, instance) is False
        assert not lock_path(db, instance).exists()
        assert instances.alive(db, instance) is False  # and still not, with the file gone
        assert instances.alive(db, other) is True  # the other holder is untouched
    finally:
        os.close(other_fd)
