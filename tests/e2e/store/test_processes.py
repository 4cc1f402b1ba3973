"""
The receipts store across processes: processes racing on one fingerprint forward once (on each
backend), and a process killed after its outcome keeps the outcome and the duplicates' events. The
rest of the store, in this process: tests/store/test_receipts.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from proxy_addon.states import State
from proxy_addon.store import Store, open_store
from tests.conftest import ROOT
from tests.store.test_receipts import JOIN_TIMEOUT, n_receipts


@pytest.fixture
def db_path(tmp_path) -> Path:
    return tmp_path / "receipts.db"


@pytest.fixture
def db(backend_db) -> str:
    """The receipts database of one test, on each backend (tests/conftest.py)."""
    return backend_db


@pytest.fixture
def store(backend_store):
    return backend_store


CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    from proxy_addon.store import Attempt, open_store
    path, go, name, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    store = open_store(path, create=False)
    print("ready", flush=True)
    deadline = time.monotonic() + 10
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            sys.exit("no go signal")
        time.sleep(0.001)
    kinds = []
    for i in range(n):
        a = Attempt(api="example", operation="articles.create", method="POST",
                    target="https://api.example/articles", intent_fingerprint="fp-proc",
                    intent={"x": 1}, principal="agent-1", flow_id=f"{name}-{i}", instance=name)
        kinds.append(store.begin_attempt(a).kind)
    print(json.dumps(kinds), flush=True)
    """
)


def test_processes_racing_on_one_fingerprint_forward_once(db, tmp_path):
    open_store(db).close()
    go = tmp_path / "go"
    per_process = 5
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, db, str(go), f"p{i}", str(per_process)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        for p in procs:
            assert p.stdout is not None  # stdout=PIPE
            assert p.stdout.readline().strip() == "ready"
        go.touch()
        outputs = []
        for p in procs:
            out, err = p.communicate(timeout=JOIN_TIMEOUT)
            assert p.returncode == 0, err
            outputs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    kinds = [k for out in outputs for k in out]
    assert len(kinds) == 2 * per_process
    assert kinds.count("forward") == 1
    assert kinds.count("blocked") == 2 * per_process - 1
    s = open_store(db)
    try:
        assert n_receipts(s) == 1
        [r] = s.list()
        assert r.state is State.SUBMITTED
        assert len(s.events(r.operation_id)) == 2 * per_process
    finally:
        s.close()


KILLED_AFTER_OUTCOME = textwrap.dedent(
    """
    import os, signal, sys
    from proxy_addon.states import State
    from proxy_addon.store import Attempt, Store
    s = Store.open(sys.argv[1])
    a = Attempt(api="example", operation="articles.create", method="POST", target="https://x/articles",
                intent_fingerprint="fp-kill", intent={"title": "t"}, principal="p")
    op = s.begin_attempt(a).receipt.operation_id
    s.record_outcome(op, State.SUCCEEDED, reason="HTTP 201", http_status=201)
    assert s.begin_attempt(a).kind == "blocked_succeeded"  # no response recorded to replay: its event is "blocked"
    print(op, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_a_killed_process_keeps_its_outcome_and_duplicate_events(db_path):
    """kill -9 right after a NORMAL commit: it is in the WAL, and the next open finds it."""
    p = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER_OUTCOME, str(db_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=JOIN_TIMEOUT,
    )
    assert p.returncode == -9, p.stderr
    op = p.stdout.strip()
    s = Store.open(db_path)
    try:
        r = s.get(op)
        assert (r.state, r.http_status) == (State.SUCCEEDED, 201)
        assert [e.event for e in s.events(op)] == ["transition", "transition", "blocked"]
    finally:
        s.close()
