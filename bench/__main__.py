"""
The receipt-proxy benchmark: `scripts/bench [--quick] [--write-docs]` (see docs/benchmarks.md).

One run starts, on 127.0.0.1 only: a fast upstream (bench/upstream.py); bare mitmdump
with a do-nothing script (bench/noop_addon.py, the baseline); mitmdump with the receipts
addon (its own rules file and a fresh database in a temporary folder); mitmdump with a
constant-answer script (bench/constant_addon.py, the floor for answers an addon makes);
mitmdump with a TCP_QUICKACK script (bench/quickack_addon.py, the requests-stall remedy).
Every process is stopped by its PID at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import procs, report, store_bench
from bench.http_bench import CLIENTS, SCENARIOS, HttpBench
from bench.http_bench import Path as BenchPath

RULES = """\
# receipt-proxy bench rules: POST /bench/things is a write; everything else passes through.
api: bench
hosts: [127.0.0.1]
operations:
  things.create:
    match: {method: POST, path: /bench/things}
    fingerprint: {body: [title]}
    external_id: id
"""
BUDGET = "    budget: {window: 1d, count: 1000000000}\n"  # --budget: checked and counted on every write, never reached


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="fewer samples, and the store without its 1M-receipt database (about 2 minutes)",
    )
    p.add_argument(
        "--samples",
        type=int,
        default=None,
        help="timed requests per path for each client and scenario (default 300; 120 with --quick); "
        "plain requests, which stalls ~40 ms a POST, gets half",
    )
    p.add_argument("--warmup", type=int, default=20, help="untimed rounds before each timed series (default 20)")
    p.add_argument("--clients", default=",".join(CLIENTS), help=f"comma-separated, of {', '.join(CLIENTS)}")
    p.add_argument(
        "--scenarios",
        default=",".join(s.key for s in SCENARIOS),
        help=f"comma-separated, of {', '.join(s.key for s in SCENARIOS)}",
    )
    p.add_argument(
        "--concurrency", type=int, default=64, help="concurrent clients doing matched POSTs (default 64; 0: skip)"
    )
    p.add_argument("--per-client", type=int, default=4, help="requests per concurrent client per round (default 4)")
    p.add_argument("--rounds", type=int, default=None, help="rounds of the concurrent test (default 6; 3 with --quick)")
    p.add_argument(
        "--store-samples", type=int, default=None, help="timed store calls per size (default 300; 150 with --quick)"
    )
    p.add_argument(
        "--store-sizes",
        default=None,
        help="receipts already in the DB (default 0,100000,1000000; 0,100000 with --quick)",
    )
    p.add_argument("--no-http", action="store_true", help="skip the proxy workloads")
    p.add_argument("--no-store", action="store_true", help="skip the store workload")
    p.add_argument(
        "--addon",
        default=str(procs.ROOT / "proxy_addon" / "addon.py"),
        help="the addon script to measure (default proxy_addon/addon.py; e.g. a patched copy)",
    )
    p.add_argument(
        "--compare-addon",
        metavar="PATH",
        help="also measure a second build of the addon (e.g. a patched copy's proxy_addon/addon.py), "
        "interleaved with the first, with its own database",
    )
    p.add_argument(
        "--compare-set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an extra --set for the compared addon only (repeatable); with --compare-addon, or alone "
        "to compare the addon with itself under an option, e.g. --compare-set receipts_forward=mitmproxy",
    )
    p.add_argument(
        "--budget",
        action="store_true",
        help="also measure the addon with a budget on the write (`budget: {window: 1d, count: 1000000000}`, never "
        "reached) as the 'compare' path, with its own database: the cost of the budget check per write",
    )
    p.add_argument(
        "--addon-set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an extra --set for the addon's mitmdump (repeatable), e.g. receipts_forward=mitmproxy",
    )
    p.add_argument(
        "--postgres",
        action="store_true",
        help="also measure the addon on PostgreSQL (a throwaway PostgreSQL 15 started from Debian's binaries "
        "with fsync on, or RECEIPTS_TEST_PG) as the 'compare' path, and the 64-client throughput of 1 "
        "and 2 PostgreSQL instances behind HAProxy (TCP mode, docs/fleet/haproxy.cfg)",
    )
    p.add_argument(
        "--pin",
        action="store_true",
        help="every mitmdump on the last CPU, the client and the upstream on the others: a proxy's CPU per "
        "request then moves least between runs (to compare builds; not how a proxy runs)",
    )
    p.add_argument("--workdir", default=None, help="where the temporary folder goes (default: the system's temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, databases)")
    p.add_argument(
        "--write-docs",
        action="store_true",
        help="rewrite the generated part of docs/benchmarks.md with this run's figures",
    )
    p.add_argument("--json", metavar="PATH", help="also write the raw figures as JSON to PATH")
    a = p.parse_args(argv)
    if a.budget and (a.postgres or a.compare_addon or a.compare_set):
        p.error("--budget measures the 'compare' path: not with --postgres, --compare-addon or --compare-set")
    a.samples = a.samples or (120 if a.quick else 300)
    a.rounds = a.rounds or (3 if a.quick else 6)
    a.store_samples = a.store_samples or (150 if a.quick else 300)
    a.store_sizes = tuple(int(x) for x in (a.store_sizes or ("0,100000" if a.quick else "0,100000,1000000")).split(","))
    a.clients = [c for c in a.clients.split(",") if c]
    a.scenarios = [s for s in a.scenarios.split(",") if s]
    for c in a.clients:
        if c not in CLIENTS:
            p.error(f"unknown client {c!r}")
    for s in a.scenarios:
        if s not in {x.key for x in SCENARIOS}:
            p.error(f"unknown scenario {s!r}")
    return a


def machine() -> dict:
    from importlib.metadata import version

    try:
        commit = subprocess.run(
            ["git", "-C", str(procs.ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(procs.ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "?", ""
    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor(),
        )
        if Path("/proc/cpuinfo").exists()
        else platform.processor()
    )
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "kernel": platform.release(),
        "system": platform.system(),
        "python": platform.python_version(),
        "mitmproxy": version("mitmproxy"),
        "httpx": version("httpx"),
        "requests": version("requests"),
        "urllib3": version("urllib3"),
        "sqlite": __import__("sqlite3").sqlite_version,
        "commit": commit + ("+local changes" if dirty else ""),
        "loadavg_start": _loadavg(),
    }


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--fleet" in argv:  # the store alone, N writer processes: bench/fleet_bench.py
        from bench import fleet_bench

        return fleet_bench.main([x for x in argv if x != "--fleet"])
    a = parse(argv)
    # A TERM (e.g. a CI timeout) unwinds like Ctrl-C, so every child is still stopped by its PID.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    command = "scripts/bench" + "".join(" " + shlex.quote(x) for x in argv)
    t_start = time.monotonic()
    info = machine()
    log = report.Log()
    log(f"receipt-proxy bench: {command}")
    log(
        f"  {info['date']} · {info['nproc']} CPUs ({info['cpu']}) · Linux {info['kernel']} · Python {info['python']} · "
        f"mitmproxy {info['mitmproxy']} · commit {info['commit']}"
    )
    log(f"  {procs.pin(a.pin)}")
    work = Path(tempfile.mkdtemp(prefix="receipt-bench-", dir=a.workdir))
    results: dict = {"command": command, "machine": info, "args": {k: v for k, v in vars(a).items()}}
    running: list[procs.Process] = []
    try:
        if not a.no_http:
            results["http"] = run_http(a, work, running, log)
        for p in running:
            p.stop()
        running.clear()
        if not a.no_store:
            log(f"store: {a.store_samples} timed calls of each kind per database, sizes {a.store_sizes}")
            results["store"] = store_bench.run(work, a.store_sizes, a.store_samples, warmup=20, log=log)
    finally:
        for p in running:
            p.stop()
        if a.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    results["elapsed_seconds"] = time.monotonic() - t_start
    info["loadavg_end"] = _loadavg()
    text = report.summary(results)
    print()
    print(text)
    if a.json:
        report.write_json(Path(a.json), results)
    if a.write_docs:
        path = procs.ROOT / "docs" / "benchmarks.md"
        report.write_docs(path, results)
        print(f"wrote {path.relative_to(procs.ROOT)}")
    return 0


class _Stoppable:
    def __init__(self, stop) -> None:
        self.stop = stop


def start_postgres(work: Path, running: list, log):
    """A PostgreSQL for the bench (fsync on, as a real one), stopped with the other processes; its URL."""
    from tests import pg

    reason = pg.unavailable()
    if reason:
        raise SystemExit(f"--postgres: {reason}")
    cluster = pg.Cluster.find(fsync=True)
    running.append(_Stoppable(cluster.destroy))
    log(f"postgres: {'RECEIPTS_TEST_PG' if not cluster.ours else 'a throwaway PostgreSQL (fsync on)'}")
    return cluster


def pg_addon(name: str, work: Path, a: argparse.Namespace, rules: Path, url: str) -> procs.Process:
    return procs.mitmdump(
        name,
        work,
        Path(a.addon).resolve(),
        "receipt-proxy: ready",
        [
            "--set",
            f"receipts_db={url}",
            "--set",
            f"receipts_rules={rules}",
            "--set",
            f"receipts_secret={work / 'pg-secret.key'}",
            *[x for kv in a.addon_set for x in ("--set", kv)],
        ],
    )


def run_http(a: argparse.Namespace, work: Path, running: list, log) -> dict:
    rules = work / "rules.yaml"
    rules.write_text(RULES)
    budgeted = work / "rules-budget.yaml"  # --budget: the same rules, the write under a budget it never reaches
    budgeted.write_text(RULES + BUDGET)
    pg_url = start_postgres(work, running, log).new_schema() if a.postgres else None
    up, up_port = procs.upstream(work)
    here = Path(__file__).resolve().parent
    proxies = {
        "baseline": procs.mitmdump("baseline", work, here / "noop_addon.py", "bench-noop: ready"),
        "addon": procs.mitmdump(
            "addon",
            work,
            Path(a.addon).resolve(),
            "receipt-proxy: ready",
            [
                "--set",
                f"receipts_db={work / 'receipts.db'}",
                "--set",
                f"receipts_rules={rules}",
                *[x for kv in a.addon_set for x in ("--set", kv)],
            ],
        ),
        **({"compare": pg_addon("compare", work, a, rules, pg_url)} if pg_url else {}),
        **(
            {
                "compare": procs.mitmdump(
                    "compare",
                    work,
                    Path(a.compare_addon or a.addon).resolve(),
                    "receipt-proxy: ready",
                    [
                        "--set",
                        f"receipts_db={work / 'compare' / 'receipts.db'}",
                        "--set",
                        f"receipts_rules={budgeted if a.budget else rules}",
                        *[x for kv in a.addon_set + a.compare_set for x in ("--set", kv)],
                    ],
                )
            }
            if a.compare_addon or a.compare_set or a.budget
            else {}
        ),
        "floor": procs.mitmdump("floor", work, here / "constant_addon.py", "bench-constant: ready"),
        "quickack": procs.mitmdump("quickack", work, here / "quickack_addon.py", "bench-quickack: ready"),
    }
    for p in (up, *proxies.values()):
        running.append(p.start())
    for p in (up, *proxies.values()):
        p.wait_ready()
    for name in ("addon", "compare"):
        if name in proxies and "recording" not in proxies[name].log():
            raise RuntimeError(f"the {name} addon is not recording:\n{proxies[name].log()[-2000:]}")
    paths = {"direct": BenchPath("direct", None)}
    paths.update({name: BenchPath(name, f"http://127.0.0.1:{p.port}") for name, p in proxies.items()})
    pids = {name: p.pid for name, p in proxies.items()}
    hb = HttpBench(f"http://127.0.0.1:{up_port}", paths, run_id=f"{int(time.time())}", log=log)
    out: dict = {"sequential": {}, "cpu_ms_per_request": {}}

    log("warming up every path")
    for sc in SCENARIOS[:3]:
        hb.sequential("httpx", sc, n=50, warmup=a.warmup)

    for client in a.clients:
        n = a.samples // 2 if client == "requests" else a.samples
        for sc in SCENARIOS:
            if sc.key not in a.scenarios:
                continue
            cpu0 = {name: report.cpu_seconds(pid) for name, pid in pids.items()}
            t0 = time.monotonic()
            stats = hb.sequential(client, sc, n=n, warmup=a.warmup)
            cpu1 = {name: report.cpu_seconds(pid) for name, pid in pids.items()}
            # each proxy serves only its own path: its CPU time over the series, per request
            per_req = {name: (cpu1[name] - cpu0[name]) * 1000 / (n + a.warmup) for name in stats if name in pids}
            out["sequential"].setdefault(client, {})[sc.key] = stats
            out["cpu_ms_per_request"].setdefault(client, {})[sc.key] = per_req
            log(report.seq_line(client, sc.key, stats, per_req, time.monotonic() - t0))

    if {"requests", "requests+nodelay"} & set(a.clients):
        log("requests stall: unmatched POSTs through bare mitmdump, and through the TCP_QUICKACK script")
        out["stall"] = hb.stall(n=max(40, a.samples // 3), warmup=10)
        for k, s in out["stall"].items():
            log(f"  {k:<38} p50 {s.p50:7.2f} ms  p99 {s.p99:7.2f} ms")
    for name in ("floor", "quickack"):  # free the CPU for the concurrent run
        proxies[name].stop()

    if a.concurrency:
        log(f"{a.concurrency} concurrent httpx clients, {a.per_client} matched POSTs each per round, {a.rounds} rounds")
        cpu0 = {name: report.cpu_seconds(pids[name]) for name in ("baseline", "addon", "compare") if name in pids}
        out["concurrent"] = hb.concurrent(a.concurrency, a.per_client, a.rounds)
        total = a.concurrency * a.per_client * (a.rounds + 1)
        out["concurrent_cpu_ms_per_request"] = {
            name: (report.cpu_seconds(pids[name]) - cpu0[name]) * 1000 / total for name in cpu0
        }
        for p, s in out["concurrent"].items():
            log(f"  {p:<9} p50 {s.p50:7.2f} ms  p99 {s.p99:7.2f} ms  {s.rps:7.0f} req/s")
    if pg_url and a.concurrency:
        out["fleet"] = run_fleet(a, work, running, log, rules, pg_url, hb, proxies)
    seen = hb.upstream_stats()
    hb.checks.append(
        f"the upstream saw {seen.get('expect', 0)} requests with an Expect header, "
        f"out of {sum(v for k, v in seen.items() if k.startswith('path:'))}"
    )
    out["checks"] = hb.checks
    return out


def postgres_cpu_seconds() -> float:
    """CPU time of every process of the bench's PostgreSQL (run as the postgres user, or receipts-pg)."""
    import pwd

    uids = set()
    for name in ("postgres", "receipts-pg"):
        with contextlib.suppress(KeyError):
            uids.add(pwd.getpwnam(name).pw_uid)
    total = 0.0
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if d.stat().st_uid in uids:
                    total += report.cpu_seconds(int(d.name))
            except (OSError, ValueError):
                pass
    return total


def run_fleet(a, work: Path, running: list, log, rules: Path, pg_url: str, hb: HttpBench, proxies: dict) -> dict:
    """64 concurrent clients through HAProxy (TCP) in front of 1, then 2, addon instances on one PostgreSQL."""
    haproxy = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    if haproxy is None:
        log("fleet: skipped, haproxy is not installed (apt-get install haproxy)")
        return {"skipped": "haproxy is not installed"}
    proxies["compare"].stop()  # free the CPU: the fleet's instances replace it
    instances = [pg_addon(f"pg{i}", work, a, rules, pg_url) for i in (1, 2)]
    for p in instances:
        running.append(p.start())
    for p in instances:
        p.wait_ready()
    fronts = {}
    for n, name in ((1, "addon"), (2, "compare")):
        port = procs.free_port()
        servers = "".join(f"    server pg{i} 127.0.0.1:{p.port}\n" for i, p in enumerate(instances[:n], 1))
        cfg = work / f"haproxy-{n}.cfg"
        cfg.write_text(
            "defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 330s\n"
            f"    timeout server 330s\nfrontend f\n    bind 127.0.0.1:{port}\n    default_backend b\n"
            f"backend b\n    balance leastconn\n{servers}"
        )
        ha = procs.Process(f"haproxy-{n}", [haproxy, "-db", "-f", str(cfg)], work / f"haproxy-{n}.log", "", port)
        running.append(ha.start())
        ha.wait_ready()
        fronts[name] = f"http://127.0.0.1:{port}"
    paths = {
        "direct": hb.paths["direct"],
        "baseline": hb.paths["baseline"],
        "addon": BenchPath("addon", fronts["addon"]),
        "compare": BenchPath("compare", fronts["compare"]),
    }
    fleet = HttpBench(hb.upstream, paths, run_id=f"{hb.run_id}-fleet", log=log)
    pids = {"baseline": proxies["baseline"].pid, "pg1": instances[0].pid, "pg2": instances[1].pid}
    log(
        f"fleet: {a.concurrency} concurrent httpx clients through HAProxy (TCP) to 1 and to 2 addon instances "
        "on one PostgreSQL"
    )
    cpu0 = {k: report.cpu_seconds(v) for k, v in pids.items()}
    pg0 = postgres_cpu_seconds()
    stats = fleet.concurrent(a.concurrency, a.per_client, a.rounds)
    total = a.concurrency * a.per_client * (a.rounds + 1)
    # bare mitmdump served one path; the two instances served both HAProxy paths (2 × total requests)
    cpu = {
        k: (report.cpu_seconds(v) - cpu0[k]) * 1000 / (total if k == "baseline" else 2 * total) for k, v in pids.items()
    }
    pg_ms = (postgres_cpu_seconds() - pg0) * 1000 / (2 * total)  # both HAProxy paths wrote receipts
    names = {
        "direct": "direct",
        "baseline": "bare mitmdump",
        "addon": "HAProxy → 1 instance",
        "compare": "HAProxy → 2 instances",
    }
    for path, s in stats.items():
        log(f"  {names[path]:<22} p50 {s.p50:7.2f} ms  p99 {s.p99:7.2f} ms  {s.rps:7.0f} req/s")
    log(
        f"  CPU ms per request: bare mitmdump {cpu['baseline']:.2f}; the addon instances together "
        f"{(cpu['pg1'] + cpu['pg2']):.2f} (pg1 {cpu['pg1']:.2f}, pg2 {cpu['pg2']:.2f}); PostgreSQL {pg_ms:.2f}"
    )
    return {"concurrent": stats, "cpu_ms_per_request": cpu, "postgres_cpu_ms_per_receipt": pg_ms}


if __name__ == "__main__":
    sys.exit(main())
