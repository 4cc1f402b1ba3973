"""
The soak, 2 minutes of it (bench/soak.py; `scripts/soak` runs it for 20). THE SLOWEST TEST of the suite:
about 4 minutes (2 of load, up to 3 more to start, settle and check). It runs by default in
scripts/test; `-m "not soak"` leaves it out.

Two proxies on one PostgreSQL behind HAProxy (docs/fleet/haproxy.cfg) and one on SQLite take a mixed
load: writes meeting every fault of the matrix (docs/guarantees.md), the agents' retries, identical
writes at once, retries of old intents, reads and MCP tool calls. Fleet proxy "a" is killed (kill -9)
and started again, the SQLite proxy too, and PostgreSQL is restarted, at set points of the run.

What it checks, as scripts/soak does: no intent has more than one upstream effect; every write the
upstreams saw has a receipt; once the run has settled no receipt is left `submitted`. Resources: two
minutes give too few samples after the warm-up to judge flatness, so this run checks only that they
are bounded (every sample of every proxy's RSS under 1 GiB, its descriptors under 2000, PostgreSQL's
connections under 150; the pg_wal directory within max_wal_size + 64 MiB); scripts/soak's longer
runs judge them flat (bench/soak_samples.py states the rule). Nothing here times anything: the set
points only place the disruptions, and every wait is bounded generously for a busy 2-core machine.
"""

from __future__ import annotations

import pytest

from bench.soak import Options, Soak, haproxy_binary


@pytest.mark.soak
def test_two_minutes_of_mixed_load_with_faults_kills_and_a_restart_leave_nothing_extra_missing_or_stuck(
    pg_cluster, pg_url, tmp_path
):
    if haproxy_binary() is None:
        pytest.skip("soak not run: haproxy is not installed (apt-get install haproxy)")
    result = Soak(Options(minutes=2), tmp_path, pg_cluster, pg_url).run()
    print(result.report)
    f = result.findings
    assert f.extra == [], result.report
    assert f.missing == [], result.report
    assert result.settled_in is not None and f.submitted == [], result.report
    assert [v.line() for v in result.verdicts if not v.ok] == [], result.report
    # The load did what it says: the fleet and the SQLite proxy both recorded writes, duplicates were
    # replayed and blocked, MCP calls went through, and the disruptions happened.
    assert f.intents >= 20 and f.forwarded >= 20, result.report
    assert f.states["fleet"] and f.states["sqlite"], result.report
    answers = " ".join(result.tally)
    assert "replayed" in answers and " 409" in answers, result.report
    assert any(k.startswith("mcp") for k in result.tally), result.report  # MCP sessions ran (their outcomes vary)
    happened = "\n".join(result.events)
    assert "kill -9 proxy a" in happened and "proxy a started again" in happened, happened
    assert "kill -9 proxy sqlite" in happened and "proxy sqlite started again" in happened, happened
    assert "PostgreSQL started again" in happened or not pg_cluster.ours, happened
