"""
send_guard.py and what it reads: this process's own lease as it knows it (leases.HeldLease, on
CLOCK_BOOTTIME), and the receipt's lifetime (in_flight_until). The whole story, with real
processes stopped by SIGSTOP, is in tests/e2e/store/test_fleet.py; here, each rule on its own,
with the local clock moved by hand. Recovery on a real PostgreSQL: tests/e2e/gate/test_send_guard.py.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from proxy_addon.gate import leases, send_guard
from proxy_addon.gate.leases import HeldLease, send_margin
from proxy_addon.gate.send_guard import SendGuard
from proxy_addon.states import State
from proxy_addon.store import Receipt


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def local(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(leases, "local_clock", clock)
    monkeypatch.setattr(send_guard, "local_clock", clock)
    return clock


def test_the_margin_is_half_of_what_a_lease_outlasts_a_heartbeat_by():
    assert send_margin(15, 5) == 5 and send_margin(3, 1) == 1 and send_margin(2, 1) == 0.5


def test_a_lease_renewed_on_time_lets_a_send_go_and_one_that_runs_low_stops_it(local):
    held = HeldLease(15, margin=5)
    assert held.refusal(held.epoch) is not None  # never claimed: nothing is known to hold
    held.renewed(local.now, continuous=False)  # the claim at start: epoch 1, held until 1015
    epoch = held.epoch
    assert epoch == 1 and held.refusal(epoch) is None
    local.now += 9.9  # 5.1 s left: enough
    assert held.refusal(epoch) is None
    local.now += 0.2  # 4.9 s left: less than the margin
    assert "known to hold for 4.9s more, less than the 5s a send needs" in (held.refusal(epoch) or "")
    held.renewed(local.now - 1, continuous=True)  # a heartbeat sent a second ago got through
    assert held.epoch == epoch and held.refusal(epoch) is None
    local.now += 100  # a stopped process wakes: the clock counted the stop
    assert "less than the 5s a send needs" in (held.refusal(epoch) or "")


def test_a_renewal_counts_from_before_it_was_sent_and_never_shortens_what_is_known(local):
    held = HeldLease(15, margin=5)
    held.renewed(local.now, continuous=False)
    held.renewed(local.now - 10, continuous=True)  # a slow renewal, sent 10 s ago: known until 1005, not less
    assert held.left() == 15


def test_a_lease_taken_again_after_it_expired_refuses_what_was_committed_before(local):
    held = HeldLease(15, margin=5)
    held.renewed(local.now, continuous=False)
    before = held.epoch  # read before a commit
    local.now += 20
    held.renewed(local.now, continuous=False)  # the heartbeat found it expired, and took it again
    assert held.left() == 15  # held again...
    assert "expired and was taken again" in (held.refusal(before) or "")  # ...but what was committed before may be lost
    assert held.refusal(held.epoch) is None  # a receipt committed under the new taking goes
    held.dropped()  # a clean stop drops the lease row
    assert held.refusal(held.epoch) is not None and held.refusal(before) is not None


def receipt(**kw) -> Receipt:
    fields: dict[str, Any] = dict(
        operation_id="20261129T000000Z-abc",
        api="a",
        operation="o",
        method="POST",
        target="https://a.test/x",
        state=State.SUBMITTED,
        intent_fingerprint="sha256:x",
        intent={},
        principal="anonymous",
        submitted_at="2026-11-29T10:00:00.000000Z",
        updated_at="2026-11-29T10:00:00.000000Z",
        completed_at=None,
        http_status=None,
        error=None,
        external_id=None,
        flow_id=None,
        retry_of=None,
        instance="i-1",
        upstream_timeout=30.0,
        in_flight_until="2026-11-29T10:00:30.000000Z",
    )
    return Receipt(**{**fields, **kw})


NOW = dt.datetime(2026, 11, 29, 10, 0, 1, tzinfo=dt.UTC)  # a second after the commit


def test_a_send_never_outlives_the_receipts_time_in_flight(local):
    guard = SendGuard.of(receipt(), None, None, now=NOW)  # SQLite: no lease, the lifetime still counts
    assert guard() is None
    assert guard.deadline(30) == 29  # the exchange's deadline is cut to in_flight_until
    assert guard.deadline(10) == 10
    local.now += 28.5
    assert guard() is None and guard.deadline(30) == 0.5
    local.now += 0.5
    assert "its time in flight has passed (receipts_upstream_timeout, 30s" in (guard() or "")
    assert guard.deadline(30) == 0.001
    legacy = SendGuard.of(receipt(in_flight_until=None, upstream_timeout=None), None, None, now=NOW)
    local.now += 1000
    assert legacy() is None and legacy.deadline(30) == 30  # nothing recorded: the option's timeout, as before


def test_a_send_needs_the_lease_it_was_committed_under(local):
    held = HeldLease(3, margin=1)
    held.renewed(local.now, continuous=False)
    guard = SendGuard.of(receipt(), held, held.epoch, now=NOW)
    assert guard() is None
    local.now += 2.5  # the lease's heartbeats stopped (a partition), or the whole process was stopped
    assert "less than the 1s a send needs" in (guard() or "")
