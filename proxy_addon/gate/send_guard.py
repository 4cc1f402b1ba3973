"""
Whether a committed write may still go upstream: asked just before its first byte is written.

    epoch = lease.epoch if lease else None                 # read BEFORE the receipt is committed
    ...commit...
    guard = SendGuard.of(receipt, lease, epoch, now=utcnow())
    why = guard()                                          # None: send it; else why not (not_sent)
    deadline = guard.deadline(receipts_upstream_timeout)   # never past the receipt's in_flight_until

A committed receipt stops being this proxy's to send in two ways, and the guard checks both on
this process's own clock (`leases.local_clock`: CLOCK_BOOTTIME), with no database round trip:

- Its lifetime. The receipt says its request may be in flight until `in_flight_until` (when it
  became submitted, or when the next round of its MCP call was decided: store/rounds.py, plus
  this proxy's receipts_upstream_timeout), and a read elsewhere may prove
  it absent after that (reconcile/judge.py, `landed_by`). So the exchange's deadline never passes it, and a
  request not yet written by then is not sent at all. On SQLite too.
- On PostgreSQL (a fleet), its lease. Another proxy takes the receipt over (recovery: submitted →
  outcome_unknown) once this proxy's lease has expired, then may read "absent", mark it
  safe_to_retry and send a new attempt. A proxy that was paused after the commit (a GC pause, a
  stopped process or VM, a partition) must then not send when it wakes. The guard refuses unless
  the lease is known to hold for `margin` more seconds and has not been lost since the commit
  (`leases.HeldLease`).

Where it is asked: the exchange asks it on the connection the request goes on, after the
connection is open (opening one may take up to the connect timeout), right before the request's
bytes are handed to the socket, with nothing awaited in between: mitm/http1.py before its write,
mitm/httpcore_send.py in httpcore's trace hook before it writes the headers (HTTP/2, an upstream
proxy). The addon asks it once more before the exchange starts, so that a refusal costs no
connection. With receipts_forward=mitmproxy, the addon asks it when it hands the request to
mitmproxy, before mitmproxy opens the connection: a pause inside mitmproxy's connect is not covered.
A refusal is recorded not_sent if the receipt is still submitted (still ours); if another proxy
took it over, nothing is recorded (its state is that proxy's to decide). The agent gets the
not_sent answer either way: nothing was sent.

Why a paused process that wakes after its lease expired cannot send (PostgreSQL)

Notation: L = receipts_lease, H = receipts_heartbeat, M = (L - H) / 2 (leases.send_margin);
C = this machine's CLOCK_BOOTTIME; S = the database server's clock, the only clock that leases
are judged by (`expires_at` against `now()`).

1. Each renewal that reached the database (the claim at start, each heartbeat) was sent after
   this process read C = c0. The server set `expires_at = now() + L`, `now()` being its
   transaction's start, which came after c0. Within one taking of the lease, `expires_at` never
   goes back below the last renewal's (renewals come one after another from one thread, and a new
   receipt's transaction only raises it: fleet.py). So, in real time, the server holds the lease
   at least until c0 + L as C counts it: `HeldLease.until` is the largest such c0 + L.
2. A renewal that found the lease expired takes it again, and that starts a new epoch
   (`HeldLease.epoch`). The epoch is read before the receipt's transaction, which itself checks
   that the lease holds (fleet.py, `_insert`). So the same epoch at send time means the lease has
   not been found expired and taken again since before the commit.
3. Another proxy moves a `submitted` receipt only after reading it, and then only if it finds
   its instance's lease expired by S (recovery.py; leases.recover_expired reads the leases after
   the receipts). A receipt committed under a lease that has held ever since cannot be moved.
4. The guard passes at time t only if the epoch is unchanged and until - t >= M > 0. By 1 and 2,
   the lease has held on the server from before the commit until at least t + M: by 3, nobody has
   taken the receipt over, and nobody can before t + M. It is still `submitted`, and ours.
5. A process stopped for P seconds (SIGSTOP, a GC pause, swapped out, a suspended machine) finds
   C advanced by P when it wakes: if the lease could have expired meanwhile, until - t < M and the
   guard refuses; if a heartbeat ran first and took the lease again, the epoch differs and it
   refuses. A partitioned process keeps running: its heartbeats fail, C runs on past `until`, and
   it refuses. Whichever of the woken threads runs first, the send is refused.

What the margin M (at least half a second: H < L, whole seconds) covers: a server clock that runs
fast or a local clock that runs slow over a lease (NTP slews at most 0.05%: 7.5 ms over 15 s), a
server clock stepped forward by less than M, and a stop of less than M between the guard and the
write. Clock skew (an offset between S and C, or between two proxies) does not matter here:
nobody compares times taken on two machines; each side compares its clock with itself (the
server: `expires_at` with `now()`; this process: C with C).

What no check made by the sending process can cover:
- A stop longer than M that falls between the guard and the write, a few microseconds of code.
  Only the upstream could fence a stale sender, and APIs do not. A database round trip per write
  does not close it either: it moves the window to "the answer came back, then the write".
- A clock that does not count a stop. CLOCK_BOOTTIME counts a stopped process and a suspended
  machine; a hypervisor that pauses a whole VM and resumes it with the guest's clocks where they
  stopped (QEMU/KVM's kvmclock does so by default) makes C miss the pause, and the guard then
  trusts a lease that may have expired. A database round trip before the write would see such a
  pause (S counted it), at one more round trip per write, and still not a pause after it. Keep
  VMs that run a fleet's proxies from being paused (live migration's brief stop is shorter than
  any lease) or their receipts_lease longer than any pause.
- The rest of a body larger than the socket's buffers: the first byte went while the lease
  held, but a process stopped in the middle of writing it writes the rest when it wakes (the
  event loop flushes a writable socket before it runs the exchange's expired deadline). A
  request is then complete only after the wake, possibly after its `in_flight_until`.
When a late request does go out after all, takeover reads still wait out its lifetime
(reconcile/judge.py), so a late write that still lands within `in_flight_until` is found, not retried.
"""

from __future__ import annotations

import datetime as dt

from proxy_addon.gate.leases import HeldLease, local_clock
from proxy_addon.store import Receipt


class SendGuard:
    """Why a committed receipt may not be sent now (a callable: None, or the reason), and its exchange's deadline."""

    __slots__ = ("ends", "epoch", "lease", "timeout")

    def __init__(
        self,
        *,
        lease: HeldLease | None,
        epoch: int | None,
        ends: float | None,
        timeout: float | None = None,
    ):
        self.lease, self.epoch = lease, epoch
        self.ends = ends  # on local_clock: when the receipt's in_flight_until comes (None: not recorded)
        self.timeout = timeout  # the upstream timeout the receipt was recorded with (for the reason given)

    @classmethod
    def of(cls, receipt: Receipt, lease: HeldLease | None, epoch: int | None, *, now: dt.datetime) -> SendGuard:
        """The guard of `receipt`, committed under `epoch` of `lease` (None: SQLite); `now` on the store's clock."""
        ends = None
        if receipt.in_flight_until:
            ends = local_clock() + (dt.datetime.fromisoformat(receipt.in_flight_until) - now).total_seconds()
        return cls(lease=lease, epoch=epoch, ends=ends, timeout=receipt.upstream_timeout)

    def __call__(self) -> str | None:
        if self.ends is not None and local_clock() >= self.ends:
            return (
                f"its time in flight has passed (receipts_upstream_timeout, {self.timeout or 0:g}s, since it was "
                "committed): a read may prove it absent by now, so it is not sent late"
            )
        if self.lease is not None and self.epoch is not None:
            return self.lease.refusal(self.epoch)
        return None

    def deadline(self, timeout: float) -> float:
        """Seconds the exchange may take from now: `timeout`, but never past the receipt's in_flight_until."""
        if self.ends is None:
            return timeout
        return max(min(timeout, self.ends - local_clock()), 0.001)
