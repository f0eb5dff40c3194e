"""Benchmark: the Spark default's releases against DuckDB's default's, on every shared dataset.

Issue 36.1 asks that ``dpsql.frontends.spark.set_union`` (the default method, ``sips_cumulative``)
release within noise of ``dpsql.set_union`` (DuckDB, the same default) on the shared data. The
pre-noise stages are tested equal on the same capped rows (tests/frontends/test_spark.py); what
remains is the whole release: the two engines cap with different keyed hashes (identically
distributed, not the same rows) and draw their own noise, so the numbers of released items are two
samples of one distribution if the translation is right.

For each dataset (the Parquet files of the shared data folder, ``DPSQL_SHARED_DATA`` or
``../shared/data`` next to the repository) and each setting, (a) epsilon=1, delta=1e-5,
max_items=100 and (b) epsilon=3, delta=e^-10, max_items=100, the script makes ``--runs`` private
(unseeded) releases with each engine, interleaved (D S, S D, D S, ...), and reports per engine the
mean and sample standard deviation of the number of released items, and two two-sample tests of
"same distribution": Welch's t-test (means) and the Mann-Whitney U test (ranks). The stated
tolerance: the two engines agree on a dataset and setting when Welch's p-value is at least
0.05 / 8 (Bonferroni over the 8 comparisons), i.e. their means differ by less than about 3.2
standard errors of the difference; a smaller p-value is evidence of a difference (the verdict column).

DuckDB reads the file through a ``read_parquet`` view (default threads), Spark through
``spark.read.parquet`` on ``local[--cores]``. Both are charged to their own in-memory ledgers,
without budgets. ``--users P`` keeps a public pseudo-random P % of the users (a hash of the user id)
for quick runs. Wall times are printed too (they are not the point: see bench_spark_scale.py).

    python benchmarks/bench_spark_parity.py --runs 10 --json parity.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a source checkout without installing
sys.path.insert(0, str(HERE))

import duckdb  # noqa: E402

import dpsql  # noqa: E402
from bench_policy import shared_data  # noqa: E402  (the shared datasets' folder: one rule for every benchmark)
from bench_set_union import machine_info  # noqa: E402

FILES = {
    "askreddit_unigrams": "reddit_askreddit_1pct/unigrams.parquet",
    "askreddit_bigrams": "reddit_askreddit_1pct/bigrams.parquet",
    "tweets": "health_news_tweets/tweet_tokens.parquet",
    "debian": "debian_bookworm_descriptions/package_description_tokens.parquet",
}
SETTINGS = {"a": (1.0, 1e-5, 100), "b": (3.0, math.exp(-10), 100)}
ALPHA = 0.05 / 8  # the tolerance: Bonferroni over 4 datasets x 2 settings


def compare(duck: Sequence[int], spark: Sequence[int]) -> dict[str, float]:
    """Means, sample SDs, the difference of means in standard errors, Welch's t and Mann-Whitney p-values.

    Welch: t = (m_S - m_D) / sqrt(s_S^2 / n_S + s_D^2 / n_D), p two-sided from Student's t with
    the Welch-Satterthwaite degrees of freedom. Mann-Whitney U: two-sided, exact when there are no ties.
    Two constant samples that are equal give p = 1 (no evidence of a difference).
    """
    from scipy import stats

    md, ms = statistics.fmean(duck), statistics.fmean(spark)
    sd_d, sd_s = statistics.stdev(duck), statistics.stdev(spark)
    se = math.sqrt(sd_d ** 2 / len(duck) + sd_s ** 2 / len(spark))
    if se == 0.0:
        p_welch = 1.0 if md == ms else 0.0
        p_mw = p_welch
    else:
        p_welch = float(stats.ttest_ind(spark, duck, equal_var=False).pvalue)
        p_mw = float(stats.mannwhitneyu(spark, duck, alternative="two-sided").pvalue)
    return {"duckdb_mean": md, "duckdb_sd": sd_d, "spark_mean": ms, "spark_sd": sd_s,
            "diff": ms - md, "diff_in_se": (ms - md) / se if se else 0.0,
            "rel_diff": (ms - md) / md if md else 0.0, "p_welch": p_welch, "p_mannwhitney": p_mw}


def markdown(results: Sequence[dict]) -> str:
    """The results as rows of a Markdown table (one a dataset and setting)."""
    lines = ["| dataset | setting | users kept | DuckDB mean ± sd | Spark mean ± sd | Spark − DuckDB (SE) "
             "| Welch p | Mann-Whitney p | within tolerance |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        lines.append(f"| {r['dataset']} | {r['setting']} | {r.get('users_pct', 100):g} % "
                     f"| {r['duckdb_mean']:.1f} ± {r['duckdb_sd']:.1f} | {r['spark_mean']:.1f} ± {r['spark_sd']:.1f} "
                     f"| {r['diff']:+.1f} ({r['diff_in_se']:+.2f}) | {r['p_welch']:.2f} | {r['p_mannwhitney']:.2f} "
                     f"| {'yes' if r['p_welch'] >= ALPHA else 'NO'} |")
    return "\n".join(lines)


def spark_session(cores: int, partitions: int, memory: str):
    """A local session; dpsql's tasks run with this interpreter (PYSPARK_PYTHON)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master(f"local[{cores}]").appName("dpsql-parity")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.memory", memory)
               .config("spark.sql.shuffle.partitions", str(partitions)).getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session


def subsample(path: Path, users_pct: float, folder: str) -> Path:
    """A public pseudo-random ``users_pct`` % of the users of ``path`` (a hash of the user id), as Parquet."""
    if users_pct >= 100:
        return path
    out = Path(folder) / (path.parent.name + "_" + path.stem + f"_{users_pct:g}pct.parquet")
    con = duckdb.connect()
    try:
        con.execute(f"COPY (SELECT user_id, item FROM read_parquet('{path}') "
                    f"WHERE hash(user_id) % 10000 < {int(users_pct * 100)}) TO '{out}' (FORMAT parquet)")
    finally:
        con.close()
    return out


def released_counts(path: Path, session: Any, setting: tuple[float, float, int], runs: int,
                    log: Callable[[str], None] = print) -> dict[str, list]:
    """``runs`` private releases of the default method with each engine on ``path``, interleaved."""
    from dpsql.frontends import spark as dpspark

    eps, delta, max_items = setting
    con = dpsql.connect()
    try:
        con.execute(f"CREATE VIEW t AS SELECT user_id, item FROM read_parquet('{path}')")
        frame = session.read.parquet(str(path))
        engines = {
            "duckdb": lambda: dpsql.set_union(con, "t", epsilon=eps, delta=delta, max_items=max_items).num_rows,
            "spark": lambda: dpspark.set_union(frame, epsilon=eps, delta=delta, max_items=max_items).count(),
        }
        out: dict[str, list] = {"duckdb": [], "spark": [], "duckdb_s": [], "spark_s": []}
        for i in range(runs):
            for name in (list(engines) if i % 2 == 0 else list(engines)[::-1]):
                t0 = time.perf_counter()
                n = int(engines[name]())
                seconds = time.perf_counter() - t0
                out[name].append(n)
                out[name + "_s"].append(round(seconds, 2))
                log(f"  run {i} {name}: {n} items, {seconds:.1f} s, load {os.getloadavg()[0]:.2f}")
        return out
    finally:
        con.close()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="releases per engine, dataset and setting")
    ap.add_argument("--datasets", default=",".join(FILES), help="comma-separated, of " + ", ".join(FILES))
    ap.add_argument("--settings", default="a,b")
    ap.add_argument("--users", type=float, default=100.0, help="percent of users kept (public hash of user_id)")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=8, help="spark.sql.shuffle.partitions")
    ap.add_argument("--memory", default="4g", help="Spark driver memory (local mode: the whole JVM)")
    ap.add_argument("--json", help="write the report here too")
    ap.add_argument("--table", nargs="+", metavar="JSON", help="only print the Markdown table of these reports")
    args = ap.parse_args(argv)
    if args.table:
        print(markdown([r for f in args.table for r in json.loads(Path(f).read_text())["results"]]))
        return 0
    if args.runs < 2:
        ap.error("--runs must be >= 2 (a standard deviation needs two runs)")
    data = shared_data()
    if data is None:
        print("no shared data folder (set DPSQL_SHARED_DATA)", file=sys.stderr)
        return 1
    warnings.simplefilter("ignore", FutureWarning)  # pyspark's notice about pandas
    from dpsql.frontends import spark as dpspark
    from dpsql.union import DEFAULT_METHOD

    report: dict[str, Any] = {**machine_info(), "duckdb_default": DEFAULT_METHOD,
                              "spark_default": dpspark.DEFAULT_METHOD, "runs": args.runs, "users_pct": args.users,
                              "cores": args.cores, "partitions": args.partitions, "memory": args.memory,
                              "load_before": os.getloadavg(), "results": []}
    session = spark_session(args.cores, args.partitions, args.memory)
    try:
        import pyspark

        report["pyspark"] = pyspark.__version__
        with tempfile.TemporaryDirectory() as folder:
            for name in args.datasets.split(","):
                path = subsample(data / FILES[name], args.users, folder)
                for key in args.settings.split(","):
                    print(f"{name} ({key}) {SETTINGS[key]}", flush=True)
                    counts = released_counts(path, session, SETTINGS[key], args.runs,
                                             log=lambda s: print(s, flush=True))
                    row = {"dataset": name, "setting": key, "users_pct": args.users, **compare(counts["duckdb"], counts["spark"]), **counts}
                    report["results"].append(row)
                    print(f"  duckdb {row['duckdb_mean']:.1f} ± {row['duckdb_sd']:.1f}, spark "
                          f"{row['spark_mean']:.1f} ± {row['spark_sd']:.1f}, diff {row['diff_in_se']:+.2f} SE, "
                          f"Welch p={row['p_welch']:.3f}, Mann-Whitney p={row['p_mannwhitney']:.3f}", flush=True)
    finally:
        session.stop()
    report["load_after"] = os.getloadavg()
    text = json.dumps(report, indent=2)
    print(text)
    print(markdown(report["results"]))
    if args.json:
        Path(args.json).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
