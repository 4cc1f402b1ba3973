"""
proxy_addon/gate/instances.py with a real second process: one killed with SIGKILL, which cleans
nothing up, is no longer alive (its flock went with it). The rest: tests/gate/test_instances.py.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from proxy_addon.gate import instances
from tests.conftest import ROOT
from tests.gate.test_instances import lock_path


@pytest.fixture
def db(tmp_path) -> Path:
    return tmp_path / "receipts.db"


CLAIMER = """
import sys, time
from pathlib import Path
from proxy_addon.gate import instances
instance, fd = instances.claim(Path(sys.argv[1]))
print(instance, flush=True)
time.sleep(120)
"""


def test_a_process_killed_with_sigkill_is_not_alive(db):
    """A real second process claims, is killed with SIGKILL (no cleanup of its own), and is then dead."""
    proc = subprocess.Popen([sys.executable, "-c", CLAIMER, str(db)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None  # stdout=PIPE
    try:
        assert select.select([proc.stdout], [], [], 30)[0], "the claiming process printed nothing in 30 s"
        instance = proc.stdout.readline().strip()
        assert instance.startswith(f"{proc.pid}-"), instance
        assert instances.alive(db, instance) is True
        assert lock_path(db, instance).is_file()
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert instances.alive(db, instance) is False
        assert not lock_path(db, instance).exists()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        proc.stdout.close()
