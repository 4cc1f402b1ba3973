"""
The soak's resource samples (bench/soak.py takes one every 10 s) and the rule that judges them.

Each sample: every proxy's RSS (/proc/PID/status VmRSS) and open file descriptors (/proc/PID/fd);
PostgreSQL's client connections (pg_stat_activity, the sampler's own left out), its WAL directory's
size (pg_wal) and the WAL written so far (pg_current_wal_lsn), the SQLite proxy's -wal file, the
upstreams' writes so far, and the machine's load average. A
value that cannot be read at that moment (a proxy killed, PostgreSQL restarting) is empty.

"Flat after warm-up", the rule (`judge`): a series is judged on its samples after the warm-up (the
run's first quarter, at least 60 s; for a proxy restarted by the soak, 60 s after its restart, and for
PostgreSQL's connections, 60 s after its restart). They are cut into thirds; the last third's maximum
may exceed the first third's by at most the series' bound (`FLAT`): RSS 15 % + 16 MiB, file
descriptors +24, connections +6, WAL per forwarded write 50 % (medians, since a checkpoint's full-page
images make single intervals jumpy), the SQLite -wal file 50 % + 4 MiB. Each judged series' trend
(its least-squares slope, per hour) is reported beside it, not judged: a slow growth shows there
before a longer run would fail the rule. The pg_wal directory is
judged against PostgreSQL's own bound: max_wal_size + 64 MiB (more means something pins WAL).
With fewer than 9 samples after the warm-up (a run of a few minutes), a series is only checked
bounded (`BOUNDED`): RSS under 1 GiB, under 2000 descriptors, under 150 connections.
"""

from __future__ import annotations

import csv
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MIB = 1024 * 1024
# series -> (relative, absolute) allowance of the last third over the first third
FLAT: dict[str, tuple[float, float]] = {
    "rss": (0.15, 16 * MIB),
    "fds": (0.0, 24),
    "pg_conns": (0.0, 6),
    "wal_per_write": (0.5, 0),
    "sqlite_wal": (0.5, 4 * MIB),
}
BOUNDED: dict[str, float] = {"rss": 1024 * MIB, "fds": 2000, "pg_conns": 150}
MIN_JUDGED = 9


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def dir_bytes(path: Path) -> int | None:
    try:
        return sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    except OSError:
        return None


@dataclass
class Sampler:
    """Takes samples of the soak's processes and PostgreSQL; writes each as a CSV row as it is taken."""

    pids: dict[str, Callable[[], int | None]]  # proxy name -> its current PID (None: not running)
    pg_admin_url: str
    pg_wal_dir: Path | None  # None: a server the soak did not start
    sqlite_db: Path
    writes: Callable[[], int]  # writes the upstreams saw so far
    csv_path: Path

    def __post_init__(self) -> None:
        self.rows: list[dict] = []
        self.columns = [
            "t",
            *(f"{k}_{n}" for n in self.pids for k in ("rss", "fds")),
            "pg_conns",
            "pg_wal_dir",
            "wal_lsn",
            "wal_per_write",
            "sqlite_wal",
            "writes",
            "load1",
        ]
        with open(self.csv_path, "w", newline="") as f:
            csv.writer(f).writerow(self.columns)

    def take(self, t: float) -> dict:
        row: dict = {"t": round(t, 1)}
        for name, pid_of in self.pids.items():
            pid = pid_of()
            row[f"rss_{name}"] = rss_bytes(pid) if pid else None
            row[f"fds_{name}"] = open_fds(pid) if pid else None
        row["pg_conns"], row["wal_lsn"] = self._postgres()
        row["pg_wal_dir"] = dir_bytes(self.pg_wal_dir) if self.pg_wal_dir else None
        wal = Path(f"{self.sqlite_db}-wal")
        row["sqlite_wal"] = wal.stat().st_size if wal.exists() else 0
        row["writes"] = self.writes()
        row["wal_per_write"] = self._wal_per_write(row)
        row["load1"] = round(os.getloadavg()[0], 2)  # the machine's 1-minute load average (a shared machine)
        self.rows.append(row)
        with open(self.csv_path, "a", newline="") as f:
            csv.writer(f).writerow([row.get(c) for c in self.columns])
        return row

    def _postgres(self) -> tuple[int | None, int | None]:
        import psycopg

        try:
            with psycopg.connect(self.pg_admin_url, connect_timeout=3, autocommit=True) as conn:
                conns = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                    "AND pid <> pg_backend_pid()"
                ).fetchone()
                lsn = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint").fetchone()
                return (conns[0] if conns else None), (int(lsn[0]) if lsn else None)
        except psycopg.Error:
            return None, None

    def _wal_per_write(self, row: dict) -> float | None:
        """WAL bytes per upstream write since the last sample that read the LSN (None: no writes, or no LSN)."""
        before = next((r for r in reversed(self.rows) if r.get("wal_lsn") is not None), None)
        if before is None or row["wal_lsn"] is None or row["writes"] <= before["writes"]:
            return None
        return round((row["wal_lsn"] - before["wal_lsn"]) / (row["writes"] - before["writes"]))

    def max_wal_size(self) -> int | None:
        import psycopg

        try:
            with psycopg.connect(self.pg_admin_url, connect_timeout=3, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT setting::bigint * 1024 * 1024 FROM pg_settings WHERE name = 'max_wal_size'"
                ).fetchone()  # the setting is in MB
                return int(row[0]) if row else None
        except psycopg.Error:
            return None


@dataclass
class Verdict:
    series: str
    rule: str
    first: float | None
    last: float | None
    ok: bool
    slope: float | None = None  # least-squares slope over the judged samples, per hour (reported, not judged)

    def line(self) -> str:
        def show(v: float | None) -> str:
            if v is None:
                return "-"
            return f"{v / MIB:.1f} MiB" if self.series.startswith(("rss", "sqlite_wal", "pg_wal")) else f"{v:.0f}"

        verdict = "ok  " if self.ok else "FAIL"
        trend = f"  (trend {show(self.slope)}/h)" if self.slope is not None else ""
        return f"{verdict} {self.series:<18} {show(self.first):>12} -> {show(self.last):>12}  {self.rule}{trend}"


def judge(rows: list[dict], *, warmup: float, since: dict[str, float], max_wal: int | None) -> list[Verdict]:
    """Each series' verdict under the module's rule; `since`: series prefix -> time its warm-up restarts from."""
    if not rows:
        return []
    verdicts = []
    for column in rows[0]:
        kind = column.split("_")[0] if column.startswith(("rss_", "fds_")) else column
        if kind not in FLAT:
            continue
        start = max([warmup, *(t + 60 for prefix, t in since.items() if column.endswith(prefix))])
        judged = [(r["t"], r[column]) for r in rows if r["t"] >= start and r.get(column) is not None]
        every = [r[column] for r in rows if r.get(column) is not None]
        verdict = _verdict(column, kind, [v for _, v in judged], every)
        if len(judged) >= MIN_JUDGED:
            verdict.slope = slope_per_hour(judged)
        verdicts.append(verdict)
    wal = [r["pg_wal_dir"] for r in rows if r.get("pg_wal_dir") is not None]
    if wal and max_wal:
        bound = max_wal + 64 * MIB
        verdicts.append(
            Verdict(
                "pg_wal_dir",
                f"max <= max_wal_size + 64 MiB ({bound / MIB:.0f} MiB)",
                wal[0],
                max(wal),
                max(wal) <= bound,
            )
        )
    return verdicts


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """The least-squares slope of (seconds, value) points, per hour."""
    n = len(points)
    mt, mv = sum(t for t, _ in points) / n, sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return 0.0 if var == 0 else 3600 * sum((t - mt) * (v - mv) for t, v in points) / var


def _verdict(column: str, kind: str, values: list[float], every: list[float]) -> Verdict:
    """`values`: the series after its warm-up; `every`: all of it (what "bounded" looks at)."""
    if len(values) < MIN_JUDGED:
        bound = BOUNDED.get(kind)
        top = max(every) if every else None
        if bound is None or top is None:
            return Verdict(column, f"not judged ({len(values)} samples after warm-up)", top, top, True)
        shown = f"{bound / MIB:.0f} MiB" if kind == "rss" else f"{bound:.0f}"
        return Verdict(
            column,
            f"bounded: every sample < {shown} (too few after warm-up to judge flatness)",
            every[0],
            top,
            top < bound,
        )
    third = len(values) // 3
    first, last = values[:third], values[-third:]
    rel, extra = FLAT[kind]
    if kind == "wal_per_write":
        a, b = statistics.median(first), statistics.median(last)
        rule = f"flat: last third's median <= first third's x {1 + rel:.2f}"
    else:
        a, b = max(first), max(last)
        slack = f"{extra / MIB:.0f} MiB" if kind in ("rss", "sqlite_wal") else f"{extra:.0f}"
        rule = f"flat: last third's max <= first third's x {1 + rel:.2f} + {slack}"
    return Verdict(column, rule, a, b, b <= a * (1 + rel) + extra)


def table(rows: list[dict], columns: list[str]) -> str:
    """The samples as a text table (MiB for byte counts)."""

    def cell(c: str, v) -> str:
        if v is None:
            return "-"
        if c.startswith(("rss_", "pg_wal_dir", "sqlite_wal")):
            return f"{v / MIB:.1f}"
        return str(v)

    shown = [c for c in columns if c != "wal_lsn"]
    widths = {c: max(len(c), *(len(cell(c, r.get(c))) for r in rows)) for c in shown}
    lines = ["  ".join(c.rjust(widths[c]) for c in shown)]
    lines += ["  ".join(cell(c, r.get(c)).rjust(widths[c]) for c in shown) for r in rows]
    return "\n".join(lines)
