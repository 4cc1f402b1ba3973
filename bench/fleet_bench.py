"""
`scripts/bench --fleet`: the store alone, with N concurrent writer processes (bench/fleet_writer.py,
each with its own store) at N = 1, 2, 4, 8, 16 and 32, on one PostgreSQL (a throwaway cluster on
127.0.0.1, fsync on, started as the tests start theirs: tests/pg.py) and on one SQLite file.

    scripts/bench --fleet                                  # both backends, every N, the three scenarios
    scripts/bench --fleet --before /tmp/old                # and, interleaved, an older tree's proxy_addon
    scripts/bench --fleet --backends pg --writers 1,16 --scenarios distinct --duration 5

For each point the writers decide attempts for `--duration` seconds after `--warmup` seconds
(every writer starts at the same instant): `begin_attempt` timed, a forwarded one's outcome
recorded. Scenarios:

- distinct: every attempt a new intent (a new receipt, then its outcome);
- storm:    every writer sends the same intent: one winner, the others replayed (or blocked);
- mix:      a new intent 3 times in 4, else one of 4 intents that every writer shares.

Reported per point: decisions a second (every `begin_attempt` answered, all writers), p50 and
p99 of `begin_attempt`, how many were forwarded, warm-up included (a storm's must be 1), the CPU the writers and
PostgreSQL used, the machine's busy share of its CPUs, and what PostgreSQL's backends waited on
(pg_stat_activity sampled every 20 ms: the share of samples per wait event; "CPU" when a backend
was active and waiting on nothing). A fresh schema (or file) per point; the writer processes of
one N are started once and kept for its scenarios. `--before TREE` runs the same points with
TREE's proxy_addon (e.g. `git archive <commit> | tar -x -C TREE`), alternating which goes first.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WRITER = Path(__file__).resolve().parent / "fleet_writer.py"
SCENARIOS = ("distinct", "storm", "mix")
DESIGNS = ("as-is", "index", "serializable", "intent-only", "notify-in-tx")


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/bench --fleet", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--writers", default="1,2,4,8,16,32", help="the numbers of writer processes (default 1,2,4,8,16,32)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated, of {', '.join(SCENARIOS)}")
    p.add_argument("--backends", default="pg,sqlite", help="comma-separated, of pg, sqlite (default both)")
    p.add_argument("--duration", type=float, default=5.0, help="timed seconds per point (default 5)")
    p.add_argument("--warmup", type=float, default=1.0, help="untimed seconds before each point (default 1)")
    p.add_argument("--before", metavar="TREE", help="also measure TREE's proxy_addon (an older checkout), interleaved")
    p.add_argument(
        "--tree",
        metavar="TREE",
        default=str(ROOT),
        help="the proxy_addon measured as 'this tree' (default this checkout; a snapshot keeps a long run "
        "from measuring edits made meanwhile)",
    )
    p.add_argument(
        "--design",
        action="append",
        default=[],
        choices=DESIGNS,
        help="PostgreSQL's locking: this tree's own (as-is, the default) or a candidate measured against "
        "it (repeatable): index (no lock, the unique index decides), serializable (no lock, "
        "SERIALIZABLE and retries), intent-only (the per-intent locks without the shared fleet lock), "
        "notify-in-tx (NOTIFY inside the write transaction, as before)",
    )
    p.add_argument(
        "--fsync",
        choices=("on", "off"),
        default="on",
        help="the PostgreSQL cluster's fsync (off: a diagnostic of what the WAL flush costs)",
    )
    p.add_argument("--json", metavar="PATH", help="also write every point as JSON to PATH")
    a = p.parse_args(argv)
    a.writers = [int(x) for x in a.writers.split(",") if x]
    a.scenarios = [s for s in a.scenarios.split(",") if s]
    a.backends = [b for b in a.backends.split(",") if b]
    a.design = a.design or ["as-is"]
    for s in a.scenarios:
        if s not in SCENARIOS:
            p.error(f"unknown scenario {s!r}")
    for b in a.backends:
        if b not in ("pg", "sqlite"):
            p.error(f"unknown backend {b!r}")
    return a


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Writers:
    """N writer processes of one tree and design, stopped by PID in `stop`."""

    def __init__(self, n: int, tree: Path, design: str):
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
        self.procs: list[subprocess.Popen] = []
        try:
            for i in range(n):
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, str(WRITER), str(i), design],
                        env=env,
                        cwd=tree,
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                )
            for p in self.procs:
                self._read(p)  # {"loaded": true}
        except BaseException:
            self.stop()
            raise

    @staticmethod
    def _read(p: subprocess.Popen) -> dict:
        assert p.stdout is not None
        line = p.stdout.readline()  # bounded by the writer: each command ends within its duration
        if not line:
            raise RuntimeError(f"writer {p.pid} ended (exit {p.wait(timeout=30)})")
        return json.loads(line)

    def run(self, command: dict, warmup: float, duration: float, sampler) -> list[dict]:
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(json.dumps(command) + "\n")
            p.stdin.flush()
        for p in self.procs:
            self._read(p)  # {"ready": true}: the store is open
        start = time.time() + 0.3
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(json.dumps({"start": start, "warmup": warmup, "duration": duration}) + "\n")
            p.stdin.flush()
        sampler(start + warmup, start + warmup + duration)
        return [self._read(p) for p in self.procs]

    def stop(self) -> None:
        for p in self.procs:
            try:
                if p.stdin:
                    p.stdin.close()
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=30)


def _busy() -> tuple[int, int]:
    """The machine's busy and total jiffies (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


class Sampler:
    """Samples pg_stat_activity's wait events of the writers' backends, and CPU use, over a point's timed window."""

    def __init__(self, admin_url: str | None, datadir: Path | None):
        self.admin_url = admin_url
        self.datadir = datadir
        self.conn = None
        if admin_url:
            import psycopg

            self.conn = psycopg.connect(admin_url, autocommit=True)
        self.waits: Counter[str] = Counter()
        self.samples = 0
        self.busy = 0.0
        self.pg_cpu = 0.0

    def __call__(self, t0: float, t1: float) -> None:
        self.waits, self.samples = Counter(), 0
        while time.time() < t0:
            time.sleep(0.005)
        b0, pg0 = _busy(), self._pg_cpu()
        while time.time() < t1:
            if self.conn is not None:
                rows = self.conn.execute(
                    "SELECT state, wait_event_type, wait_event FROM pg_stat_activity "
                    "WHERE application_name = 'receipt-proxy'"
                ).fetchall()
                for state, kind, event in rows:
                    if state == "active":
                        self.waits["CPU" if kind is None else f"{kind}:{event}"] += 1
                    elif state and state.startswith("idle in transaction"):
                        self.waits["idle in transaction (the writer's turn)"] += 1
                    else:
                        self.waits["idle (between transactions)"] += 1
                self.samples += len(rows)
            time.sleep(0.02)
        b1 = _busy()
        self.busy = (b1[0] - b0[0]) / max(1, b1[1] - b0[1])
        pg1 = self._pg_cpu()  # the processes alive over the whole window (the writers' backends are)
        self.pg_cpu = sum(pg1[pid] - pg0[pid] for pid in pg1.keys() & pg0.keys())

    def _pg_cpu(self) -> dict[int, float]:
        """CPU seconds of our cluster's postmaster and each of its children (other clusters left out), by PID."""
        if self.datadir is None:
            return {}
        from bench.report import cpu_seconds

        try:
            postmaster = int((self.datadir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return {}
        out: dict[int, float] = {}
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                    if int(d.name) == postmaster or ppid == postmaster:
                        out[int(d.name)] = cpu_seconds(int(d.name))
                except (OSError, ValueError, IndexError):
                    continue
        return out

    def top(self, n: int = 4) -> str:
        if not self.samples:
            return ""
        return ", ".join(f"{k} {v * 100 / self.samples:.0f}%" for k, v in self.waits.most_common(n))

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def _percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def point(writers: Writers, backend: str, scenario: str, target: str, a: argparse.Namespace, sampler: Sampler) -> dict:
    n = len(writers.procs)
    stamp = f"{os.getpid()}-{time.time_ns()}"
    command = {
        "scenario": scenario,
        "target": target,
        "storm": f"sha256:storm-{stamp}",
        "hot": [f"sha256:hot-{stamp}-{i}" for i in range(4)],
    }
    results = writers.run(command, a.warmup, a.duration, sampler)
    ms = [x for r in results for x in r["ms"]]
    kinds: Counter[str] = Counter()
    for r in results:
        kinds.update(r["kinds"])
    return {
        "backend": backend,
        "scenario": scenario,
        "writers": n,
        "decisions": len(ms),
        "per_second": len(ms) / a.duration,
        "p50": _percentile(ms, 0.5),
        "p99": _percentile(ms, 0.99),
        "kinds": dict(kinds),
        "forwarded": sum(r["forwarded"] for r in results),
        "failures": sum(r["failures"] for r in results),
        "writers_cpu": sum(r["cpu"] for r in results),
        "pg_cpu": sampler.pg_cpu,
        "busy": sampler.busy,
        "waits": sampler.top(),
        "loadavg": os.getloadavg()[0],
    }


def main(argv: list[str]) -> int:
    a = parse(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds: writers stopped, the cluster destroyed
    command = "scripts/bench --fleet" + "".join(" " + shlex.quote(x) for x in argv)
    log(f"{command} · {os.cpu_count()} CPUs · load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    trees: list[tuple[str, Path, str]] = [
        (f"this tree ({d})" if d != "as-is" else "this tree", Path(a.tree).resolve(), d) for d in a.design
    ]
    if a.before:
        trees.append(("before", Path(a.before).resolve(), "as-is"))
    work = Path(tempfile.mkdtemp(prefix="receipt-fleet-bench-"))
    cluster = None
    out: list[dict] = []
    try:
        if "pg" in a.backends:
            from tests import pg

            reason = pg.unavailable()
            if reason:
                raise SystemExit(f"--fleet: {reason}")
            cluster = pg.Cluster.find(fsync=a.fsync == "on")
            log(f"postgres: fsync {a.fsync}")
        for backend in a.backends:
            sampler = Sampler(*((cluster.url, cluster.datadir) if backend == "pg" and cluster else (None, None)))
            try:
                for k, n in enumerate(a.writers):
                    order = trees[k % len(trees) :] + trees[: k % len(trees)]  # alternate which tree goes first
                    for name, tree, design in order:
                        writers = Writers(n, tree, design)
                        try:
                            for scenario in a.scenarios:
                                target = _target(backend, cluster, work)
                                r = point(writers, backend, scenario, target, a, sampler)
                                r["tree"] = name
                                out.append(r)
                                log(_line(r))
                        finally:
                            writers.stop()
            finally:
                sampler.close()
    finally:
        if cluster is not None and cluster.ours:
            cluster.destroy()
    print(table(out))
    if a.json:
        Path(a.json).write_text(json.dumps({"command": command, "points": out}, indent=1))
    return 0


def _target(backend: str, cluster, work: Path) -> str:
    from proxy_addon.store import Store
    from proxy_addon.store.postgres import PostgresStore

    if backend == "pg":
        url = cluster.new_schema()
        PostgresStore.open(url).close()  # migrated once, here
        return url
    path = work / f"fleet-{time.time_ns()}.db"
    Store.open(path).close()
    return str(path)


def _line(r: dict) -> str:
    return (
        f"{r['backend']:<6} {r['scenario']:<8} {r['tree']:<28} N={r['writers']:<3} {r['per_second']:7.0f}/s "
        f"p50 {r['p50']:6.1f} ms p99 {r['p99']:6.1f} ms  forwarded {r['forwarded']:<6} "
        f"failed {r['failures']:<3} CPU writers {r['writers_cpu']:5.1f}s pg {r['pg_cpu']:5.1f}s "
        f"busy {r['busy'] * 100:3.0f}%  load {r['loadavg']:.1f}  {r['waits']}"
    )


def table(points: list[dict]) -> str:
    lines = [
        "| backend | scenario | tree | writers | decisions/s | p50 ms | p99 ms | forwarded | "
        "CPU ms/decision (writers + pg) | machine busy | PostgreSQL waits |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in sorted(points, key=lambda r: (r["backend"], SCENARIOS.index(r["scenario"]), r["tree"], r["writers"])):
        lines.append(
            f"| {r['backend']} | {r['scenario']} | {r['tree']} | {r['writers']} | {r['per_second']:.0f} | "
            f"{r['p50']:.1f} | {r['p99']:.1f} | {r['forwarded']} | "
            f"{(r['writers_cpu'] + r['pg_cpu']) * 1000 / max(1, r['decisions']):.2f} | {r['busy'] * 100:.0f}% | "
            f"{r['waits']} |"
        )
    return "\n".join(lines)
