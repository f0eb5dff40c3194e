"""Benchmark: the Spark default against DuckDB's default at scale (10M and 100M rows), time, memory, stages.

Issue 36.4: a user sizing a cluster needs the Spark default's (``sips_cumulative``) cost on a large
table next to DuckDB's, and how the work divides: how many Spark jobs and stages, what each
shuffles, and how many bytes.

Data: synthetic (user_id BIGINT, item BIGINT) Parquet from ``zipf_data.py`` with its default
parameters (Pareto items per user, alpha 1.3, at most 20,000 rows; Zipf(1.1) items over 10M;
rows in random order), ``zipf_<N>m.parquet`` in ``--dir`` (generated when missing; never put it in
the repository).

Each (size, engine) is one cold run in its own process, started under ``nice -n 10`` and
``/usr/bin/time -v``, timed out after ``--timeout`` seconds:

* DuckDB: ``dpsql.connect()``, a view over ``read_parquet``, ``dpsql.set_union(con, 't', epsilon=1,
  delta=1e-5, max_items=100)`` (the default method, or ``--method``), default threads and ``memory_limit``.
* Spark: ``local[--cores]`` with ``spark.driver.memory=--memory`` (local mode: the driver JVM is the
  only executor), Spark's default ``spark.sql.shuffle.partitions`` (200, coalesced by adaptive
  execution) unless ``--partitions``, the event log on; ``dpsql.frontends.spark.set_union(
  spark.read.parquet(path), epsilon=1, delta=1e-5, max_items=100).count()`` (``--method`` likewise).

Measured: the release's wall time inside the process (``release_s``; for Spark without the
session's start, given apart), the process's wall time, and the peak memory of the whole process
tree (the Spark JVM and its Python workers included), sampled every ``--sample`` seconds from
``/proc``: the sum of the processes' resident sets (RSS; pages shared between processes counted
once per process) and of their proportional sets (PSS; shared pages split). ``/usr/bin/time``'s
maximum RSS is that of the largest single process. The load average (``/proc/loadavg``) and the
time are recorded before and after every run.

From Spark's event log (uncompressed, parsed after the run; a run stopped at its time-out leaves
the log of what it did): jobs, stages (completed, skipped, and those cancelled or still running at
the end), and per stage its tasks, input bytes, shuffle bytes read and written, spilled bytes and
task time; from the final (adaptive) plan of each SQL execution, its shuffles (partitioning keys)
and joins, and the task time of the stages under each kind of join.

    python benchmarks/bench_spark_scale.py --rows 10000000,100000000 --json scale.jsonl
    python benchmarks/bench_spark_scale.py --table scale.jsonl     # the Markdown tables of benchmarks/README.md
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

HERE = Path(__file__).resolve().parent
EPS, DELTA, MAX_ITEMS = 1.0, 1e-5, 100
PAGE = os.sysconf("SC_PAGE_SIZE")


def data_path(folder: Path, rows: int) -> Path:
    name = f"zipf_{rows // 1_000_000}m" if rows % 1_000_000 == 0 else f"zipf_{rows}"
    return folder / f"{name}.parquet"


def ensure_data(folder: Path, rows: int) -> Path:
    """The Parquet file of ``rows`` rows of zipf_data.py's default model (generated when missing)."""
    path = data_path(folder, rows)
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(["nice", "-n", "10", sys.executable, str(HERE / "zipf_data.py"), "--rows", str(rows),
                        "--parquet", str(path)], check=True, env={**os.environ, "PYTHONPATH": str(HERE.parent)})
    return path


# --------------------------------------------------------------------------
# Memory of a process tree, from /proc
# --------------------------------------------------------------------------

def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name field may hold spaces and parentheses
        kids[ppid].append(int(entry))
    return kids


def tree(root: int) -> list[int]:
    kids, out, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, ()))
    return out


def tree_memory(root: int) -> tuple[int, int]:
    """(sum of RSS, sum of PSS) in bytes of ``root`` and its descendants (processes gone meanwhile skipped)."""
    rss = pss = 0
    for pid in tree(root):
        try:
            with open(f"/proc/{pid}/statm") as f:
                rss += int(f.read().split()[1]) * PAGE
            with open(f"/proc/{pid}/smaps_rollup") as f:
                pss += next(int(line.split()[1]) for line in f if line.startswith("Pss:")) * 1024
        except (OSError, StopIteration, ValueError):
            continue
    return rss, pss


class PeakSampler(threading.Thread):
    """Samples the memory of a process tree until stopped; keeps the peaks."""

    def __init__(self, root: int, every: float):
        super().__init__(daemon=True)
        self.root, self.every = root, every
        self.peak_rss = self.peak_pss = self.peak_processes = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            rss, pss = tree_memory(self.root)
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
            self.peak_processes = max(self.peak_processes, len(tree(self.root)))
            self._stop_event.wait(self.every)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


# --------------------------------------------------------------------------
# Spark's event log
# --------------------------------------------------------------------------

_METRICS = {"internal.metrics.input.bytesRead": "input_bytes",
            "internal.metrics.shuffle.read.remoteBytesRead": "shuffle_read_bytes",
            "internal.metrics.shuffle.read.localBytesRead": "shuffle_read_bytes",
            "internal.metrics.shuffle.read.recordsRead": "shuffle_read_records",
            "internal.metrics.shuffle.write.bytesWritten": "shuffle_write_bytes",
            "internal.metrics.shuffle.write.recordsWritten": "shuffle_write_records",
            "internal.metrics.memoryBytesSpilled": "memory_spilled_bytes",
            "internal.metrics.diskBytesSpilled": "disk_spilled_bytes",
            "internal.metrics.executorRunTime": "run_ms",
            "internal.metrics.peakExecutionMemory": "peak_execution_memory"}
_NODE = re.compile(r"^\((\d+)\) (\w+)[^\n]*\n((?:[^\n]+\n)*)", re.M)


def _clean(text: str) -> str:
    """An expression of a plan without attribute ids and plan ids (``user_id#12L`` -> ``user_id``)."""
    text = re.sub(r"#\d+L?", "", text)
    return re.sub(r", \[plan_id=\d+\]", "", text).strip()


def plan_features(plan: str) -> dict[str, list[str]]:
    """The joins and shuffles of a formatted physical plan (Spark's ``explain('formatted')`` text).

    Of an adaptive plan after its run, the final plan's: adaptive execution may replace the
    initial plan's joins (e.g. a nested-loop join by a hash join once the build side's size is known)."""
    joins, shuffles = [], []
    tree = plan.split("\n\n", 1)[0]
    if "== Final Plan ==" in tree:  # an adaptive plan as run: the nodes of its final plan only
        final = tree.split("== Final Plan ==", 1)[1].split("== Initial Plan ==", 1)[0]
        keep = set(re.findall(r"\((\d+)\)", final))
    else:
        keep = None
    for m in _NODE.finditer(plan + "\n"):
        node, body = m.group(2), m.group(3)
        if keep is not None and m.group(1) not in keep:
            continue
        if node == "Exchange":
            args = re.search(r"Arguments: ([^\n]*)", body)
            if args:
                shuffles.append(_clean(re.sub(r", (ENSURE_REQUIREMENTS|REPARTITION_BY_\w+).*$", "", args.group(1))))
        elif node.endswith("Join") and node != "Join":  # "Join": a logical node in some descriptions
            kind = re.search(r"Join type: (\w+)", body)
            cond = re.search(r"Join condition: ([^\n]*)", body)
            keys = re.search(r"Left keys \[\d+\]: ([^\n]*)", body)
            text = f"{node} {kind.group(1) if kind else ''}"
            if keys:
                text += f" on {_clean(keys.group(1))}"
            if cond and cond.group(1).strip() != "None":
                text += f" if {_clean(cond.group(1))}"
            joins.append(text)
    return {"joins": joins, "shuffles": shuffles}


def _event_lines(path: str) -> Iterator[str]:
    """The lines of an uncompressed event log: one file, or Spark's rolling folder (``events_<n>_<app>``, in order)."""
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "events_*")),
                       key=lambda f: int(os.path.basename(f).split("_")[1]))
    else:
        files = [path]
    for name in files:
        with open(name) as f:
            yield from f


def parse_event_log(path: str) -> dict[str, Any]:
    """Jobs, stages (with their metrics and the final plan's joins and shuffles), from one event log.

    ``path`` is a file or Spark's rolling folder. Each stage is attributed to the SQL execution of
    its job; its plan is that execution's last (adaptive) plan. A log cut short (a run stopped at
    its time-out) gives what had happened by then."""
    jobs: dict[int, dict] = {}
    stages: dict[int, dict] = {}
    plans: dict[int, str] = {}
    stage_execution: dict[int, int] = {}
    submitted: dict[int, int] = {}
    blocks: dict[str, int] = {}
    for line in _event_lines(path):
        try:
            event = json.loads(line)
        except json.JSONDecodeError:  # the last line of a log cut short
            break
        kind = event.get("Event", "")
        if kind == "SparkListenerJobStart":
            execution = (event.get("Properties") or {}).get("spark.sql.execution.id")
            jobs[event["Job ID"]] = {"stages": [s["Stage ID"] for s in event["Stage Infos"]],
                                     "submitted": event["Submission Time"]}
            if execution is not None:
                for stage in jobs[event["Job ID"]]["stages"]:
                    stage_execution.setdefault(stage, int(execution))
        elif kind == "SparkListenerStageSubmitted":
            submitted[event["Stage Info"]["Stage ID"]] = event["Stage Info"].get("Submission Time", 0)
        elif kind == "SparkListenerJobEnd":
            jobs[event["Job ID"]]["completed"] = event["Completion Time"]
        elif kind == "SparkListenerStageCompleted":
            info = event["Stage Info"]
            row: dict[str, Any] = {"name": info["Stage Name"], "tasks": info["Number of Tasks"],
                                   "ms": info.get("Completion Time", 0) - info.get("Submission Time", 0),
                                   "failed": bool(info.get("Failure Reason"))}  # e.g. cancelled at the time-out
            for m in set(_METRICS.values()):
                row[m] = 0
            for acc in info.get("Accumulables", []):
                key = _METRICS.get(acc.get("Name", ""))
                if key is not None:
                    row[key] += int(acc.get("Value", 0))
            stages[info["Stage ID"]] = row
        elif kind.endswith("SparkListenerSQLExecutionStart") or kind.endswith("SparkListenerSQLAdaptiveExecutionUpdate"):
            plans[int(event["executionId"])] = event.get("physicalPlanDescription", "")
        elif kind == "SparkListenerBlockUpdated":
            info = event["Block Updated Info"]
            block = info["Block ID"]
            if block.startswith("rdd_"):
                size = int(info.get("Memory Size", 0)) + int(info.get("Disk Size", 0))
                blocks[block] = max(blocks.get(block, 0), size)
    features = {e: plan_features(p) for e, p in plans.items()}
    shuffle_keys: Counter = Counter()
    joins: Counter = Counter()
    join_ms: Counter = Counter()
    for stage_id, row in stages.items():
        execution = stage_execution.get(stage_id)
        row["execution"] = execution
        if execution in features:
            row["plan_joins"] = sorted(set(features[execution]["joins"]))
            for join in row["plan_joins"]:
                join_ms[join] += row["run_ms"]
    for f in features.values():
        shuffle_keys.update(f["shuffles"])
        joins.update(f["joins"])
    unfinished = [{"stage": sid, "submitted_ms": t, "execution": stage_execution.get(sid),
                   "plan_joins": sorted(set(features.get(stage_execution.get(sid, -1), {}).get("joins", [])))}
                  for sid, t in sorted(submitted.items()) if sid not in stages or stages[sid]["failed"]]
    ran = set(stages)
    listed = {s for j in jobs.values() for s in j["stages"]}
    totals = {k: sum(s[k] for s in stages.values()) for k in set(_METRICS.values()) if k != "peak_execution_memory"}
    return {"jobs": len(jobs), "sql_executions": len(plans), "stages_run": len(ran),
            "stages_skipped": len(listed - ran), "tasks": sum(s["tasks"] for s in stages.values()),
            "totals": totals,
            "max_stage_shuffle_write": max((s["shuffle_write_bytes"] for s in stages.values()), default=0),
            "max_stage_peak_execution_memory": max((s["peak_execution_memory"] for s in stages.values()), default=0),
            "checkpoint_block_bytes": sum(blocks.values()), "shuffles_in_plans": dict(shuffle_keys),
            "joins_in_plans": dict(joins), "task_ms_of_stages_with_join": dict(join_ms),
            "unfinished_stages": unfinished,
            "stages": {str(k): v for k, v in sorted(stages.items())}}


# --------------------------------------------------------------------------
# One run, in its own process
# --------------------------------------------------------------------------

def worker(engine: str, path: str, cores: int, memory: str, partitions: Optional[int], events: str,
           method: Optional[str], conf: Sequence[str] = ()) -> dict:
    """One release of ``method`` (default: the engine's default) on ``path``; its times and settings."""
    sys.path.insert(0, str(HERE.parent))
    import warnings

    warnings.simplefilter("ignore", FutureWarning)  # pyspark's notice about pandas
    import dpsql

    if engine == "duckdb":
        t0 = time.perf_counter()
        con = dpsql.connect()
        con.execute(f"CREATE VIEW t AS SELECT user_id, item FROM read_parquet('{path}')")
        threads, memory_limit = con.execute(
            "SELECT current_setting('threads'), current_setting('memory_limit')").fetchone()
        settings = {"threads": threads, "memory_limit": memory_limit}
        t1 = time.perf_counter()
        from dpsql.union import DEFAULT_METHOD

        items = dpsql.set_union(con, "t", method or DEFAULT_METHOD, epsilon=EPS, delta=DELTA,
                                max_items=MAX_ITEMS).num_rows
        t2 = time.perf_counter()
        con.close()
        return {"start_s": t1 - t0, "release_s": t2 - t1, "items": items, "method": method or DEFAULT_METHOD,
                **settings}
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    from dpsql.frontends import spark as dpspark

    t0 = time.perf_counter()
    builder = (SparkSession.builder.master(f"local[{cores}]").appName("dpsql-scale")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.memory", memory)
               .config("spark.eventLog.enabled", "true").config("spark.eventLog.dir", "file://" + events)
               .config("spark.eventLog.compress", "false")  # flushed as it goes: a stopped run's log is readable
               .config("spark.eventLog.logBlockUpdates.enabled", "true"))
    if partitions:
        builder = builder.config("spark.sql.shuffle.partitions", str(partitions))
    for setting in conf:
        key, value = setting.split("=", 1)
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    conf = {k: session.conf.get(k, None) for k in ("spark.sql.shuffle.partitions", "spark.sql.adaptive.enabled",
                                                   "spark.driver.memory", "spark.local.dir",
                                                   "spark.sql.autoBroadcastJoinThreshold")}
    t1 = time.perf_counter()
    items = dpspark.set_union(session.read.parquet(path), method or dpspark.DEFAULT_METHOD, epsilon=EPS,
                              delta=DELTA, max_items=MAX_ITEMS).count()
    t2 = time.perf_counter()
    session.stop()
    return {"start_s": t1 - t0, "release_s": t2 - t1, "items": items, "spark_conf": conf,
            "method": method or dpspark.DEFAULT_METHOD}


def _time_v(stderr: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for line in stderr.splitlines():
        line = line.strip()
        if line.startswith("Maximum resident set size (kbytes):"):
            out["time_max_rss_bytes"] = int(line.rsplit(":", 1)[1]) * 1024
        elif line.startswith("Elapsed (wall clock) time"):
            parts = [float(p) for p in line.rsplit(" ", 1)[1].split(":")]
            out["time_elapsed_s"] = sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
        elif line.startswith("Exit status:"):
            out["exit_status"] = int(line.rsplit(":", 1)[1])
    return out


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def measure(engine: str, path: Path, args: argparse.Namespace, events: Path) -> dict[str, Any]:
    """One run of ``engine`` on ``path`` in a child process tree, with its peak memory and load."""
    events.mkdir(parents=True, exist_ok=True)
    cmd = ["nice", "-n", "10", "/usr/bin/time", "-v", sys.executable, __file__, "--worker", engine,
           "--path", str(path), "--cores", str(args.cores), "--memory", args.memory, "--events", str(events)]
    if args.partitions:
        cmd += ["--partitions", str(args.partitions)]
    if args.method:
        cmd += ["--method", args.method]
    for setting in args.conf:
        cmd += ["--conf", setting]
    run: dict[str, Any] = {"engine": engine, "data": path.name, "start": _now(),
                           "loadavg_before": open("/proc/loadavg").read().split()[:3]}
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True, env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
    sampler = PeakSampler(child.pid, args.sample)
    sampler.start()
    try:
        stdout, stderr = child.communicate(timeout=args.timeout)
        run["timed_out"] = False
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, 15)  # the group this function started (the child's own session)
        stdout, stderr = child.communicate()
        run["timed_out"] = True
    sampler.stop()
    run.update(wall_s=time.perf_counter() - t0, end=_now(), loadavg_after=open("/proc/loadavg").read().split()[:3],
               peak_tree_rss_bytes=sampler.peak_rss, peak_tree_pss_bytes=sampler.peak_pss,
               peak_processes=sampler.peak_processes, **_time_v(stderr))
    result = [line for line in stdout.splitlines() if line.startswith("{")]
    if result:
        run.update(json.loads(result[-1]))
    else:
        run["stderr_tail"] = stderr[-3000:]
    if engine == "spark":
        logs = sorted(glob.glob(str(events / "*")), key=os.path.getmtime)
        if logs:
            run["event_log_path"] = logs[-1]
            run["event_log"] = parse_event_log(logs[-1])
    return run


def _gb(b: float) -> str:
    return f"{b / 2 ** 30:.2f}"


def summary(run: dict[str, Any]) -> str:
    line = (f"{run['engine']} {run['data']}: release {run.get('release_s', float('nan')):.1f} s (process "
            f"{run['wall_s']:.1f} s), {run.get('items')} items, peak tree RSS {_gb(run['peak_tree_rss_bytes'])} GiB, "
            f"PSS {_gb(run['peak_tree_pss_bytes'])} GiB, load {run['loadavg_before'][0]} -> {run['loadavg_after'][0]}")
    log = run.get("event_log")
    if log:
        t = log["totals"]
        line += (f"\n  jobs {log['jobs']}, stages {log['stages_run']} run + {log['stages_skipped']} skipped, "
                 f"tasks {log['tasks']}, shuffle write {_gb(t['shuffle_write_bytes'])} GiB, read "
                 f"{_gb(t['shuffle_read_bytes'])} GiB, spilled to disk {_gb(t['disk_spilled_bytes'])} GiB, "
                 f"checkpoint blocks {_gb(log['checkpoint_block_bytes'])} GiB\n  shuffles: {log['shuffles_in_plans']}"
                 f"\n  joins: {log['joins_in_plans']}")
    return line


def markdown(runs: Sequence[dict[str, Any]]) -> str:
    """The scale table (one row a run) and, per Spark run, its shuffles and joins."""
    out = ["| rows | engine | method | release (s) | process (s) | peak RSS, tree (GiB) | peak PSS, tree (GiB) "
           "| items | jobs | stages run + skipped | tasks | task time (s) | shuffle written (GiB) "
           "| checkpoints (GiB) | spilled to disk (GiB) | load before → after | started (UTC) |",
           "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in runs:
        log = r.get("event_log") or {}
        t = log.get("totals", {})
        release = "timed out" if r.get("timed_out") else (f"{r['release_s']:.0f}" if "release_s" in r else "failed")
        spark = bool(log)
        settings = "".join(f"<br>`{c.removeprefix('spark.sql.')}`" for c in r.get("spark_settings") or ())
        out.append(
            f"| {r['rows'] / 1e6:g}M | {r['engine']}{settings} | {r.get('method', r.get('requested_method') or 'default')} "
            f"| {release} | {r['wall_s']:.0f} | {_gb(r['peak_tree_rss_bytes'])} | {_gb(r['peak_tree_pss_bytes'])} "
            f"| {r.get('items', '—')} | {log.get('jobs', '—') if spark else '—'} "
            f"| {str(log.get('stages_run')) + ' + ' + str(log.get('stages_skipped')) if spark else '—'} "
            f"| {log.get('tasks', '—') if spark else '—'} "
            + (f"| {t['run_ms'] / 1000:.0f} | {_gb(t['shuffle_write_bytes'])} | {_gb(log['checkpoint_block_bytes'])} "
               f"| {_gb(t['disk_spilled_bytes'])} " if spark else "| — | — | — | — ") +
            f"| {r['loadavg_before'][0]} → {r['loadavg_after'][0]} | {r['start'][:16]} |")
    for r in runs:
        log = r.get("event_log")
        if not log:
            continue
        out += ["", f"{r['rows'] / 1e6:g}M rows, Spark {r.get('method', '')}"
                f"{' (stopped at the time-out)' if r.get('timed_out') else ''}: shuffles in the final plans "
                f"(times a plan has one) and joins, with the task time of the stages whose plan has the join", "",
                "| shuffle | plans |", "|---|---:|"]
        out += [f"| `{k}` | {v} |" for k, v in sorted(log["shuffles_in_plans"].items(), key=lambda kv: -kv[1])]
        out += ["", "| join | plans | task time of its stages (s) |", "|---|---:|---:|"]
        out += [f"| `{k}` | {v} | {log['task_ms_of_stages_with_join'].get(k, 0) / 1000:.0f} |"
                for k, v in sorted(log["joins_in_plans"].items(), key=lambda kv: -kv[1])]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="10000000,100000000", help="comma-separated table sizes")
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "dpsql_scale"),
                    help="folder of the Parquet data and the event logs (outside the repository)")
    ap.add_argument("--engines", default="duckdb,spark")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--memory", default="8g", help="spark.driver.memory (local mode: the JVM of driver and executor)")
    ap.add_argument("--partitions", type=int, help="spark.sql.shuffle.partitions (default: Spark's own)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per run before it is stopped")
    ap.add_argument("--sample", type=float, default=0.5, help="seconds between memory samples")
    ap.add_argument("--method", help="the set-union method (default: each engine's default)")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark setting of the session (repeatable), e.g. spark.sql.autoBroadcastJoinThreshold=1g")
    ap.add_argument("--json", help="append each run's report (one JSON object a line) to this file")
    ap.add_argument("--table", nargs="+", metavar="JSONL", help="only print Markdown tables of these reports")
    ap.add_argument("--worker", choices=["duckdb", "spark"], help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--events", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.path, args.cores, args.memory, args.partitions, args.events,
                                args.method, args.conf)))
        return 0
    if args.table:
        print(markdown([json.loads(line) for f in args.table for line in Path(f).read_text().splitlines() if line]))
        return 0
    folder = Path(args.dir)
    for rows in (int(r) for r in args.rows.split(",")):
        path = ensure_data(folder, rows)
        for engine in args.engines.split(","):
            run = measure(engine, path, args, folder / "events" / f"{engine}_{rows}_{int(time.time())}")
            run.update(rows=rows, cores=args.cores, spark_driver_memory=args.memory, nproc=os.cpu_count(),
                       requested_method=args.method, spark_settings=args.conf)
            print(summary(run), flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(run) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
