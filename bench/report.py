"""Progress lines, the summary table, target checks, and the generated part of docs/benchmarks.md."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from bench.http_bench import SCENARIOS, Stats

BEGIN = "<!-- BEGIN scripts/bench --write-docs: generated, do not edit by hand -->"
END = "<!-- END scripts/bench --write-docs -->"
TITLES = {s.key: s.title for s in SCENARIOS}
_TICK = os.sysconf("SC_CLK_TCK")


class Log:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def seq_line(client: str, key: str, stats: dict[str, Stats], cpu: dict[str, float], seconds: float) -> str:
    parts = [f"{p} {s.p50:6.2f}" for p, s in stats.items()]
    ratios = " ".join(
        f"{p}/baseline {stats[p].p50 / stats['baseline'].p50:4.2f}" for p in ("addon", "compare") if p in stats
    )
    if "compare" in stats and "addon" in stats:
        ratios += f" compare/addon {stats['compare'].p50 / stats['addon'].p50:4.2f}"
    cpus = " ".join(f"{p} {cpu[p]:.2f}" for p in ("baseline", "addon", "compare") if p in cpu)
    return f"{client:<17} {key:<9} p50 ms: {' · '.join(parts)}  {ratios}  CPU ms/req {cpus}  ({seconds:.0f}s)"


# --- targets ------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Target:
    what: str
    where: str
    value: float
    limit: float
    note: str = ""

    @property
    def met(self) -> bool:
        return self.value <= self.limit


def targets(results: dict) -> list[Target]:
    out: list[Target] = []
    seq = results.get("http", {}).get("sequential", {})
    for client, per in seq.items():
        for key, limit, what in (
            ("write", 1.10, "matched write p50 ≤ 1.10× baseline"),
            ("read", 1.03, "unmatched GET p50 ≤ 1.03× baseline"),
            ("pass", 1.03, "unmatched POST p50 ≤ 1.03× baseline"),
            ("blocked", 0.90, "blocked duplicate p50 ≤ 0.90× a forwarded write"),
            ("replayed", 0.90, "replayed duplicate p50 ≤ 0.90× a forwarded write"),
        ):
            if key not in per:
                continue
            s = per[key]
            note = ""
            if "floor" in s:
                note = f"constant-answer floor {s['floor'].p50 / s['baseline'].p50:.2f}×"
            out.append(Target(what, client, s["addon"].p50 / s["baseline"].p50, limit, note))
            if "compare" in s:
                out.append(Target(what, f"{client}, compare", s["compare"].p50 / s["baseline"].p50, limit, note))
    store = results.get("store", {}).get("ops", {})
    if store and 0 in store and len(store) > 1:
        big = max(store)
        for op, label in (
            ("insert", "insert"),
            ("dup-check", "duplicate check"),
            ("dup-record", "duplicate answer (check + event)"),
        ):
            ratio = store[big][op].p50 / store[0][op].p50
            out.append(
                Target(
                    f"store {label} p50 at {big:,} receipts ≤ 1.10× empty",
                    "store",
                    ratio,
                    1.10,
                    "" if big >= 1_000_000 else "1M not measured (--quick)",
                )
            )
    return out


# --- tables ---------------------------------------------------------------------------------------------


def _table(head: list[str], rows: list[list[str]], align: str = "") -> str:
    """A markdown table; `align` has an "l" or "r" per column (default: the first left, the others right)."""
    align = align or "l" + "r" * (len(head) - 1)
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _ms(x: float) -> str:
    return f"{x:.2f}"


def tables(results: dict) -> list[tuple[str, str]]:
    """(title, markdown table) pairs."""
    out = []
    tg = targets(results)
    if tg:
        rows = [
            [t.what, t.where, f"{t.value:.2f}×", f"{t.limit:.2f}×", "met" if t.met else "**missed**", t.note]
            for t in tg
        ]
        out.append(("Targets", _table(["target", "client", "measured", "limit", "", "note"], rows, "llrrll")))
    http = results.get("http", {})
    cpu = http.get("cpu_ms_per_request", {})
    for client, per in http.get("sequential", {}).items():
        rows = []
        compare = any("compare" in s for s in per.values())
        for key, s in per.items():
            b, a = s["baseline"], s["addon"]
            c = cpu.get(client, {}).get(key, {})
            row = [
                TITLES[key],
                _ms(s["direct"].p50),
                _ms(b.p50),
                _ms(a.p50) + (f" (floor {_ms(s['floor'].p50)})" if "floor" in s else ""),
                f"**{a.p50 / b.p50:.2f}×**",
                _ms(b.p99),
                _ms(a.p99),
                f"{a.p99 / b.p99:.2f}×",
                f"{b.rps:.0f} / {a.rps:.0f}",
                f"{c.get('baseline', 0):.2f} / {c.get('addon', 0):.2f}",
            ]
            if compare:
                k = s["compare"]
                row += [_ms(k.p50), f"**{k.p50 / b.p50:.2f}×**", f"{k.p99 / b.p99:.2f}×", f"{c.get('compare', 0):.2f}"]
            rows.append(row)
        head = [
            "workload",
            "direct p50",
            "baseline p50",
            "addon p50",
            "addon/baseline p50",
            "baseline p99",
            "addon p99",
            "addon/baseline p99",
            "req/s baseline / addon",
            "proxy CPU ms/req baseline / addon",
        ]
        if compare:
            head += ["compare p50", "compare/baseline p50", "compare/baseline p99", "compare CPU ms/req"]
        out.append(
            (
                f"One {client} client, keep-alive, {per[next(iter(per))]['addon'].n} timed requests per path",
                _table(head, rows),
            )
        )
    if "stall" in http:
        rows = [[k, _ms(s.p50), _ms(s.p99)] for k, s in http["stall"].items()]
        out.append(
            (
                "The requests stall: unmatched POSTs through bare mitmdump and through the TCP_QUICKACK script",
                _table(["client via proxy", "p50 ms", "p99 ms"], rows),
            )
        )
    if "concurrent" in http:
        con = http["concurrent"]
        ccpu = http.get("concurrent_cpu_ms_per_request", {})
        b = con["baseline"]
        rows = [
            [
                p,
                _ms(s.p50),
                _ms(s.p99),
                f"{s.rps:.0f}",
                f"{s.p50 / b.p50:.2f}×" if p != "direct" else "",
                f"{s.rps / b.rps:.2f}×" if p != "direct" else "",
                f"{ccpu[p]:.2f}" if p in ccpu else "",
            ]
            for p, s in con.items()
        ]
        n = con["addon"].n
        out.append(
            (
                f"{results['args']['concurrency']} concurrent httpx clients doing matched POSTs ({n} timed per path)",
                _table(
                    ["path", "p50 ms", "p99 ms", "req/s", "p50 vs baseline", "req/s vs baseline", "proxy CPU ms/req"],
                    rows,
                ),
            )
        )
    store = results.get("store", {})
    if store:
        ops = store["ops"]
        sizes = sorted(ops)
        rows = []
        for op in next(iter(ops.values())):
            row = [op]
            for size in sizes:
                s = ops[size][op]
                row.append(f"{_ms(s.p50)} / {_ms(s.p99)}")
            row += [f"{ops[size][op].p50 / ops[sizes[0]][op].p50:.2f}×" for size in sizes[1:]]
            rows.append(row)
        head = (
            ["store call"]
            + [f"{size:,} receipts: p50 / p99 ms" for size in sizes]
            + [f"p50 {size:,} / empty" for size in sizes[1:]]
        )
        fills = ", ".join(f"{k:,} in {v:.1f}s" for k, v in store["fill_seconds"].items() if k)
        out.append(
            (
                f"The store alone (`Store.begin_attempt` / `record_outcome`, WAL: a new receipt FULL, an outcome and "
                f"a duplicate NORMAL; fill: {fills})",
                _table(head, rows),
            )
        )
    return out


def summary(results: dict) -> str:
    m = results["machine"]
    parts = [
        f"command: {results['command']}",
        f"machine: {m['nproc']} CPUs ({m['cpu']}), {m['system']} {m['kernel']}, Python {m['python']}, "
        f"mitmproxy {m['mitmproxy']}, httpx {m['httpx']}, requests {m['requests']} (urllib3 {m['urllib3']}), "
        f"SQLite {m['sqlite']}; commit {m['commit']}; {m['date']}; took {results['elapsed_seconds']:.0f}s; "
        f"load average {m['loadavg_start']} at the start, {m['loadavg_end']} at the end",
    ]
    for title, table in tables(results):
        parts += ["", f"## {title}", "", table]
    checks = results.get("http", {}).get("checks", [])
    if checks:
        parts += ["", "Checks: " + "; ".join(checks) + "."]
    return "\n".join(parts)


def _plain(o):
    if dataclasses.is_dataclass(o) and not isinstance(o, type):  # an instance (Stats, Target), not a class
        return dataclasses.asdict(o)
    if isinstance(o, dict):
        return {str(k): _plain(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_plain(v) for v in o]
    return o


def write_json(path: Path, results: dict) -> None:
    path.write_text(json.dumps(_plain(results), indent=2, default=str) + "\n")


def write_docs(path: Path, results: dict) -> None:
    m = results["machine"]
    block = "\n".join(
        [
            BEGIN,
            "",
            f"Produced by `{results['command']}` on {m['date']} (commit {m['commit']}), in "
            f"{results['elapsed_seconds']:.0f} s.",
            "",
            f"Machine: {m['nproc']} CPUs ({m['cpu']}), {m['system']} {m['kernel']}; Python {m['python']}; "
            f"mitmproxy {m['mitmproxy']}; httpx {m['httpx']}; requests {m['requests']} with urllib3 {m['urllib3']}; "
            f"SQLite {m['sqlite']}. Load average (1, 5, 15 min) {m['loadavg_start']} at the start, "
            f"{m['loadavg_end']} at the end.",
            *[line for title, table in tables(results) for line in ("", f"### {title}", "", table)],
            "",
            *(
                ["Checks: " + "; ".join(results["http"]["checks"]) + ".", ""]
                if results.get("http", {}).get("checks")
                else []
            ),
            END,
        ]
    )
    if path.exists() and BEGIN in (text := path.read_text()) and END in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        path.write_text(head + block + tail)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# Benchmarks\n\n{block}\n")
