"""
The soak: `scripts/soak [--minutes 20]` (python -m bench.soak). Minutes of mixed traffic with faults
against a fleet and a lone proxy, then the invariants and the resources, judged; exit 1 on a violation.

What it starts, on 127.0.0.1 only, each process stopped by its PID at the end (also on Ctrl-C):
- a PostgreSQL (tests/pg.py; fsync on), and two proxies on it (real mitmdump with the addon, as the
  tests start them: tests/e2e/processes.py), behind HAProxy with the fleet recipe (docs/fleet/haproxy.cfg,
  its ports rewritten as tests/e2e/proxy/test_haproxy.py does); plus one proxy on a SQLite file;
- the upstreams (tests/upstream.py): plain HTTP, HTTPS the proxies trust, HTTPS they do not trust (the
  TLS-handshake-failure row), a port that refuses connections; and the MCP server (tests/e2e/mcp/server.py);
- the load (bench/soak_load.py): writes with the fault matrix's faults, the agents' retries, identical
  writes at once, retries of old intents, reads, and MCP tool calls through the SDK's own client.

At set points of the run: fleet proxy "a" is killed (kill -9) at 30 % and started again 20 s later
(the lease, 15 s, has passed: "b" took its receipts over); the SQLite proxy is killed at 45 % and
started again 3 s later (its start recovers what it left); PostgreSQL is stopped and started at 60 %.

Then the load stops and the run settles: the soak waits until no receipt is `submitted` (a receipt
left in flight by a killed proxy becomes `outcome_unknown` when a live proxy sees its lease expire, or
when it starts again; docs/fleet.md), at most SETTLE_BOUND seconds. It checks (bench/soak_checks.py):
0 extra upstream effects, 0 missing receipts, 0 receipts left `submitted`; and the resources sampled
every 10 s (bench/soak_samples.py states the "flat after warm-up" rule). The report, the samples
(samples.csv) and every process's log are kept in the run's folder (--out, else a new one under /tmp).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bench.soak_checks import Findings, check, submitted_count
from bench.soak_load import Load, Targets, refusing_port
from bench.soak_samples import Sampler, Verdict, judge, table

if TYPE_CHECKING:
    from tests.e2e.processes import Proxy

# The MCP server's write, declared in rules (tests/e2e/mcp/test_mcp.py's RULES).
MCP_RULES = """\
api: tracker
hosts: ["127.0.0.1"]
operations:
  issues.create:
    match: {method: POST, path: /mcp, mcp: {tool: create_issue}}
    fingerprint: {body: [params.arguments.title, params.arguments.body]}
    external_id: number
"""
UPSTREAM_TIMEOUT = 30  # receipts_upstream_timeout of the soak's proxies (the default, 300 s, would hold a
# taken-over receipt's absence unprovable for 5 minutes)
LEASE = 15  # receipts_lease, the default
SETTLE_BOUND = LEASE + 5 + UPSTREAM_TIMEOUT + 120  # seconds the run may take to settle, on a busy machine
READY_BOUND = 180  # seconds a proxy may take to start on a busy machine


@dataclass
class Options:
    minutes: float = 20.0
    workers: int = 6
    pause: float = 0.3  # mean seconds a worker waits between scenarios
    mcp_every: float = 10.0  # mean seconds between MCP client sessions
    sample_every: float = 10.0
    seed: int = 1
    out: Path | None = None  # the run's folder (None: a new one under /tmp)


@dataclass
class Result:
    findings: Findings
    verdicts: list[Verdict]
    settled_in: float | None  # seconds the run took to settle (None: it did not, within SETTLE_BOUND)
    report: str
    out: Path
    events: list[str] = field(default_factory=list)
    tally: Counter = field(default_factory=Counter)  # "<scenario> <store> <answer>" -> how many the agents got

    @property
    def ok(self) -> bool:
        return self.findings.ok and self.settled_in is not None and all(v.ok for v in self.verdicts)


def haproxy_binary() -> str | None:
    return shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)


def fixed_port_proxy(workdir: Path, confdir: Path, port: int, **kwargs):
    """A Proxy (tests/e2e/processes.py) on a port of its own that a restart keeps (HAProxy names it)."""
    from tests.conftest import wait_for
    from tests.e2e.processes import Proxy

    class FixedPortProxy(Proxy):
        def args(self) -> list[str]:
            args = super().args()
            args[args.index("-p") + 1] = str(port)
            return args

        def ready(self) -> Proxy:
            wait_for(self._ready, timeout=READY_BOUND, what=f"mitmdump to be ready (log: {self.log_path})")
            return self

    workdir.mkdir(parents=True, exist_ok=True)
    return FixedPortProxy(workdir, confdir, **kwargs)


class Soak:
    """One soak run in `out`, on `cluster` (tests/pg.py) and the database `pg_url` in it."""

    def __init__(self, opts: Options, out: Path, cluster, pg_url: str, log=print):
        self.o, self.out, self.cluster, self.pg_url, self.log = opts, out, cluster, pg_url, log
        self.duration = opts.minutes * 60
        self.warmup = max(60.0, self.duration / 4)  # seconds of load before the resources are judged
        self.started = 0.0  # when the load started, in seconds since t0
        self.stack = contextlib.ExitStack()
        self.events: list[str] = []
        self.since: dict[str, float] = {}  # series suffix -> when it was disrupted (its warm-up restarts)
        self.t0 = 0.0

    def now(self) -> float:
        return time.monotonic() - self.t0

    def event(self, text: str) -> None:
        line = f"[{self.now():7.1f}s] {text}"
        self.events.append(line)
        self.log(line)

    def run(self) -> Result:
        try:
            return self._run()
        finally:
            self.stack.close()  # every process stopped by its PID, in the reverse order of its start

    def _run(self) -> Result:
        self._start_parts()
        stop = threading.Event()
        self.stack.callback(stop.set)
        self.load.start(self.o.workers, stop)
        self.started = self.now()  # the set points count from here
        sampling = threading.Thread(target=self._sample_until, args=(stop,), daemon=True)
        sampling.start()
        self.event(f"load started: {self.o.workers} workers and one MCP client, for {self.o.minutes:g} min")
        self._timeline()
        stop.set()
        sampling.join(timeout=60)
        stuck = self.load.join(timeout=180)
        self.event(
            f"load stopped ({len(self.load.intents)} HTTP intents, {len(self.load.mcp_intents)} MCP intents)"
            + (f"; workers still running: {stuck}" if stuck else "")
        )
        settled = self._settle()
        self.sampler.take(self.now())  # the settled state, shown in the table (judged: only the loaded run)
        loaded = [r for r in self.sampler.rows if r["t"] <= self.started + self.duration]
        verdicts = judge(
            loaded, warmup=self.started + self.warmup, since=self.since, max_wal=self.sampler.max_wal_size()
        )
        findings = check(self.load.intents, self.load.mcp_intents, self.upstreams, self.mcp.effects(), self.dbs)
        return self._result(findings, verdicts, settled)

    # --- the parts --------------------------------------------------------------------------

    def _start_parts(self) -> None:
        from tests.e2e.mcp.fixtures import McpServer
        from tests.upstream import Upstream, free_port

        self.t0 = time.monotonic()
        http = self.stack.enter_context(Upstream())
        tls = self.stack.enter_context(Upstream(tls=True, certdir=self.out / "tls-cert"))
        untrusted = self.stack.enter_context(Upstream(tls=True, certdir=self.out / "untrusted-cert"))
        self.upstreams = {"http": http, "tls": tls, "untrusted": untrusted}
        for name, up in self.upstreams.items():  # a connection the proxy cut (kill -9): logged, not printed
            assert up.server is not None
            setattr(up.server, "handle_error", _error_log(self.out / f"upstream-{name}-errors.log"))  # noqa: B010
        refusing, refused_port = refusing_port()
        self.stack.callback(refusing.close)
        self.mcp = McpServer("json", self.out).start()
        self.stack.callback(self.mcp.stop)
        rules = self.out / "rules"
        rules.mkdir(exist_ok=True)
        shutil.copy(Path(__file__).resolve().parent.parent / "tests" / "rules_it" / "test-api.yaml", rules)
        (rules / "tracker.yaml").write_text(MCP_RULES)
        confdir, key = self.out / "mitmproxy-conf", self.out / "fleet-secret.key"
        common = {"rules": rules, "upstream_ca": tls.cert_path}
        timeout = ("--set", f"receipts_upstream_timeout={UPSTREAM_TIMEOUT}")
        fleet = ("--set", f"receipts_secret={key}", *timeout)
        self.proxies = {
            "a": fixed_port_proxy(self.out / "a", confdir, free_port(), db=self.pg_url, extra=fleet, **common),
            "b": fixed_port_proxy(self.out / "b", confdir, free_port(), db=self.pg_url, extra=fleet, **common),
            "sqlite": fixed_port_proxy(self.out / "sqlite", confdir, free_port(), extra=timeout, **common),
        }
        for name, p in self.proxies.items():  # one at a time: the first makes the CA in confdir and the key
            p.start()
            self.stack.callback(p.stop)
            self.event(f"proxy {name} ready on 127.0.0.1:{p.port} (pid {p.proc.pid}, log {p.log_path})")
        front = self._haproxy(free_port())
        self.dbs = {"fleet": self.pg_url, "sqlite": str(self.proxies["sqlite"].db)}
        targets = Targets(
            fronts={"fleet": front, "sqlite": self.proxies["sqlite"].url},
            ca=self.proxies["a"].ca,
            http=http.url,
            tls=tls.url,
            untrusted=untrusted.url,
            refused=f"http://127.0.0.1:{refused_port}",
            mcp=self.mcp.url,
        )
        self.load = Load(targets, self.upstreams, seed=self.o.seed, pause=self.o.pause, mcp_every=self.o.mcp_every)
        self.sampler = Sampler(
            pids={n: _pid_of(p) for n, p in self.proxies.items()},
            pg_admin_url=self.cluster.url,
            pg_wal_dir=self.cluster.datadir / "pg_wal" if self.cluster.ours else None,
            sqlite_db=Path(self.proxies["sqlite"].db),
            csv_path=self.out / "samples.csv",
            writes=self._writes,
        )

    def _writes(self) -> int:
        """Writes the upstreams saw so far."""
        total = 0
        for up in self.upstreams.values():
            with up.lock:
                total += sum(1 for r in up.requests if r["method"] == "POST")
        return total

    def _haproxy(self, port: int) -> str:
        from tests.conftest import wait_for
        from tests.e2e.proxy.test_haproxy import listening, recipe_with_ports

        binary = haproxy_binary()
        assert binary, "haproxy is not installed (apt-get install haproxy; .ci/run installs it)"
        cfg = self.out / "haproxy.cfg"
        cfg.write_text(recipe_with_ports(port, [self.proxies["a"].port, self.proxies["b"].port]))
        with open(self.out / "haproxy.log", "wb") as out:  # the child keeps its own copy of the descriptor
            ha = subprocess.Popen([binary, "-db", "-f", str(cfg)], stdout=out, stderr=subprocess.STDOUT)
        self.stack.callback(_stop, ha)
        wait_for(lambda: listening(port) or ha.poll() is not None, timeout=60, what="haproxy to listen")
        assert ha.poll() is None, (self.out / "haproxy.log").read_text()
        self.event(f"haproxy (pid {ha.pid}) on 127.0.0.1:{port} in front of a and b")
        return f"http://127.0.0.1:{port}"

    # --- the run ----------------------------------------------------------------------------

    def _timeline(self) -> None:
        """The disruptions at their set points, then the end of the loaded run; sleeps in between (bounded)."""
        d, s = self.duration, self.started
        steps = [
            (0.30 * d, "kill a", lambda: self._kill("a")),
            (0.30 * d + 20, "start a", lambda: self._again("a")),
            (0.45 * d, "kill sqlite", lambda: self._kill("sqlite")),
            (0.45 * d + 3, "start sqlite", lambda: self._again("sqlite")),
            (0.60 * d, "restart postgresql", self._restart_postgres),
            (d, "end", lambda: None),
        ]
        for at, _name, step in sorted(((s + at, name, step) for at, name, step in steps), key=lambda x: x[0]):
            while self.now() < at:
                time.sleep(min(1.0, at - self.now()))
            step()

    def _kill(self, name: str) -> None:
        p = self.proxies[name]
        pid = p.proc.pid
        p.stop(signal.SIGKILL)
        self.event(f"kill -9 proxy {name} (pid {pid})")

    def _again(self, name: str) -> None:
        p = self.proxies[name]
        p.start()
        self.since[f"_{name}"] = self.now()
        self.event(f"proxy {name} started again (pid {p.proc.pid})")

    def _restart_postgres(self) -> None:
        if not self.cluster.ours:
            self.event("PostgreSQL not restarted: RECEIPTS_TEST_PG names a server the soak cannot stop")
            return
        self.event("PostgreSQL stopping (fast shutdown: connections cut)")
        self.cluster.stop()
        time.sleep(3)
        self.cluster.start_again()
        self.since["pg_conns"] = self.now()
        self.event("PostgreSQL started again")

    def _sample_until(self, stop: threading.Event) -> None:
        nxt = 0.0
        while not stop.is_set():
            row = self.sampler.take(self.now())
            self.log("  sample " + " ".join(f"{k}={v}" for k, v in row.items() if k != "wal_lsn"))
            nxt += self.o.sample_every
            stop.wait(max(0.0, nxt - self.now()))

    def _settle(self) -> float | None:
        """Seconds until no receipt is `submitted` (None: still some after SETTLE_BOUND)."""
        start = time.monotonic()
        while time.monotonic() - start < SETTLE_BOUND:
            n = submitted_count(self.dbs)
            if n == 0:
                took = time.monotonic() - start
                self.event(f"settled: no receipt submitted ({took:.0f}s after the load stopped)")
                return took
            time.sleep(2)
        self.event(f"NOT settled: receipts still submitted {SETTLE_BOUND}s after the load stopped")
        return None

    def _result(self, f: Findings, verdicts: list[Verdict], settled: float | None) -> Result:
        tally = Counter(self.load.tally)
        lines = [
            f"soak: {self.o.minutes:g} min, {self.o.workers} workers; load average now "
            f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; folder {self.out}",
            "",
            "events:",
            *self.events,
            "",
            "what the agents got (scenario, store, answer: count):",
            *(f"  {k}: {v}" for k, v in sorted(tally.items())),
            "",
            f"intents: {f.intents}; writes the upstreams and the MCP server saw: {f.forwarded}",
            "upstream effects per intent: " + ", ".join(f"{k}: {v}" for k, v in sorted(f.effects.items())),
            *(
                f"receipts in {store}: " + ", ".join(f"{s} {n}" for s, n in sorted(c.items()))
                for store, c in f.states.items()
            ),
            f"load errors (worker exceptions): {len(self.load.errors)}",
            *self.load.errors[:10],
            "",
            f"extra upstream effects: {len(f.extra)}",
            *f.extra[:20],
            f"missing receipts: {len(f.missing)}",
            *f.missing[:20],
            f"receipts left submitted: {len(f.submitted)}"
            + ("" if settled is not None else f" (not settled within {SETTLE_BOUND}s)"),
            *f.submitted[:20],
            "",
            f"samples (every {self.o.sample_every:g}s; MiB: rss, pg_wal_dir, sqlite_wal; wal_per_write: bytes):",
            table(self.sampler.rows, self.sampler.columns),
            "",
            f"resources (judged on the loaded run after its warm-up, {self.warmup:.0f}s; rule: bench/soak_samples.py):",
            *(v.line() for v in verdicts),
        ]
        result = Result(f, verdicts, settled, "", self.out, self.events, tally)
        lines += ["", f"soak: {'PASSED' if result.ok else 'FAILED'}"]
        result.report = "\n".join(lines)
        (self.out / "report.txt").write_text(result.report + "\n")
        return result


def _pid_of(proxy: Proxy) -> Callable[[], int | None]:
    """The proxy's current PID, read at each sample (None while it is not running: killed, not restarted yet)."""

    def pid() -> int | None:
        proc = proxy.proc
        return proc.pid if proc is not None and proc.poll() is None else None

    return pid


def _error_log(path: Path):
    """A socketserver handle_error that appends the traceback to `path` (a peer that went away mid-answer)."""

    def handle_error(request, client_address) -> None:
        with open(path, "a") as f:
            f.write(f"--- {client_address}\n{traceback.format_exc()}")

    return handle_error


def _stop(proc: subprocess.Popen) -> None:
    from tests.e2e.processes import stop_process

    stop_process(proc)


def parse(argv: list[str]) -> Options:
    p = argparse.ArgumentParser(
        prog="scripts/soak", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--minutes", type=float, default=20.0, help="minutes of load (default 20)")
    p.add_argument("--workers", type=int, default=6, help="threads sending HTTP scenarios (default 6)")
    p.add_argument("--pause", type=float, default=0.3, help="mean seconds a worker waits between scenarios")
    p.add_argument("--mcp-every", type=float, default=10.0, help="mean seconds between MCP client sessions")
    p.add_argument("--sample-every", type=float, default=10.0, help="seconds between resource samples")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=None, help="the run's folder (default: a new one under /tmp)")
    a = p.parse_args(argv)
    return Options(a.minutes, a.workers, a.pause, a.mcp_every, a.sample_every, a.seed, a.out)


def _interrupted(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # SIGTERM as Ctrl-C: every finally stops what it started


def main(argv: list[str] | None = None) -> int:
    from tests import pg

    opts = parse(sys.argv[1:] if argv is None else argv)
    reason = pg.unavailable()
    if reason or not haproxy_binary():
        print(f"soak: cannot run: {reason or 'haproxy is not installed (apt-get install haproxy)'}", file=sys.stderr)
        return 2
    out = opts.out or Path(tempfile.mkdtemp(prefix="receipts-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _interrupted)
    print(f"soak: {opts.minutes:g} minutes; the run's folder: {out}", flush=True)
    cluster = pg.Cluster.find(fsync=True)
    try:
        result = Soak(opts, out, cluster, cluster.new_schema()).run()
    except KeyboardInterrupt:
        print(f"soak: interrupted; every process it started is stopped (logs in {out})", file=sys.stderr)
        return 130
    finally:
        if cluster.datadir is not None:  # its log, kept with the run's
            with contextlib.suppress(OSError):
                shutil.copy(cluster.datadir.parent / "server.log", out / "postgresql.log")
        cluster.destroy()
    print(result.report)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
