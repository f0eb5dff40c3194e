"""``dpsql demo``: every set-union method on the embedded r/AskReddit sample.

The coverage numbers are computed from the raw table, so they are a
NON-PRIVATE evaluation of what each release would give an analyst; only the
released sets themselves are differentially private.
"""
from __future__ import annotations

import json
import sys
import warnings
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Iterator, Optional, TextIO

import duckdb

import dpsql
from dpsql.core.validation import sql_string

__all__ = ["DATASET", "ATTRIBUTION", "dataset_path", "dataset_summary", "run_demo", "format_demo", "print_demo"]

DATASET = "askreddit_unigrams.parquet"
ATTRIBUTION = ("Data: r/AskReddit comment sample of Gopi et al., \"Differentially Private Set Union\" (ICML 2020; "
               "MIT licence, (c) Microsoft), via opendp/smartnoise-sdk (MIT licence, (c) President and Fellows "
               "of Harvard College); user ids pseudonymised. See dpsql/data/README.md.")
EPSILON, DELTA, MAX_ITEMS = 1.0, 1e-5, 100
EVALUATION_NOTE = ("Coverage is computed from the raw data: a NON-PRIVATE evaluation of the released sets, "
                   "for this demo only.")

_TABLE = "askreddit"

# Both shares are computed against the raw table; dp_demo_released holds one released set.
_COVERAGE_SQL = f"""
SELECT count(DISTINCT a.user_id) FILTER (WHERE r.item IS NOT NULL) AS users_covered,
       count(r.item) AS entries_covered
FROM {_TABLE} AS a LEFT JOIN dp_demo_released AS r ON a.item = r.item
"""


@contextmanager
def dataset_path() -> Iterator[Path]:
    """A filesystem path of the embedded dataset (extracted for the duration if the package is zipped)."""
    with resources.as_file(resources.files("dpsql") / "data" / DATASET) as path:
        yield path



def _load(con: duckdb.DuckDBPyConnection, path: Path) -> dict:
    con.execute(f"CREATE TEMP TABLE {_TABLE} AS SELECT user_id, item FROM read_parquet({sql_string(str(path))})")
    [(entries, users, items)] = con.execute(
        f"SELECT count(*), count(DISTINCT user_id), count(DISTINCT item) FROM {_TABLE}").fetchall()
    return {"name": "r/AskReddit unigrams (1% comment sample)", "file": DATASET,
            "entries": entries, "users": users, "items": items, "attribution": ATTRIBUTION}


def dataset_summary() -> dict:
    """Name, size (entries, users, distinct items) and attribution of the embedded dataset."""
    con = duckdb.connect()
    try:
        with dataset_path() as path:
            return _load(con, path)
    finally:
        con.close()


def run_demo(*, epsilon: float = EPSILON, delta: float = DELTA, max_items: int = MAX_ITEMS,
             seed: Optional[int] = None, methods: Optional[list[str]] = None) -> list[dict]:
    """Run each method once on the embedded dataset; one dict per method.

    Keys: ``method``, ``released`` (number of items), ``users_covered`` /
    ``user_share`` (users holding a released item), ``entries_covered`` /
    ``entry_share`` ((user, item) entries whose item was released), and the
    public calibration ``noise``, ``scale``, ``threshold``. ``seed`` makes the
    run reproducible and NOT private.
    """
    methods = list(dpsql.METHODS) if methods is None else methods
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # callers print their own warning for a seed
        con = dpsql.connect(seed=seed)
    try:
        with dataset_path() as path:
            summary = _load(con, path)
        rows = []
        for method in methods:
            # a method may have no cap: max_items is passed only to the methods that take it.
            cap = max_items if "max_items" in dpsql.METHODS[method].param_names else None
            released = dpsql.set_union(con, _TABLE, method, epsilon=epsilon, delta=delta, max_items=cap)
            con.register("dp_demo_released", released)
            try:
                [(users_covered, entries_covered)] = con.execute(_COVERAGE_SQL).fetchall()
            finally:
                con.unregister("dp_demo_released")
            cal = dpsql.calibrate(method, epsilon=epsilon, delta=delta, max_items=max_items)
            rows.append({
                "method": method,
                "released": released.num_rows,
                "users_covered": users_covered,
                "user_share": users_covered / summary["users"] if summary["users"] else 0.0,
                "entries_covered": entries_covered,
                "entry_share": entries_covered / summary["entries"] if summary["entries"] else 0.0,
                "noise": cal.noise,
                "scale": cal.scale,
                "threshold": cal.threshold,
            })
        return rows
    finally:
        con.close()


def format_demo(rows: list[dict], summary: dict, *, epsilon: float = EPSILON, delta: float = DELTA,
                max_items: int = MAX_ITEMS) -> str:
    """The demo's report as text: dataset line, attribution, one table row per method, evaluation note."""
    header = ("method", "words released", "users covered", "entries covered")
    body = [(r["method"], f"{r['released']:,}", f"{100 * r['user_share']:.1f} %", f"{100 * r['entry_share']:.1f} %")
            for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]

    def line(cells):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    out = [
        f"Dataset: {summary['name']}: {summary['entries']:,} (user, word) entries, "
        f"{summary['users']:,} users, {summary['items']:,} distinct words.",
        summary["attribution"],
        "",
        f"Set union at epsilon={epsilon:g}, delta={delta:g}, max_items={max_items} (user-level DP):",
        "",
        line(header),
        line(["-" * w for w in widths]),
        *(line(b) for b in body),
        "",
        EVALUATION_NOTE,
        "users covered: share of users holding at least one released word; "
        "entries covered: share of (user, word) entries whose word was released.",
    ]
    return "\n".join(out)


def run_top_k(*, k: int = 10, epsilon: float = EPSILON, delta: float = DELTA, max_items: int = MAX_ITEMS,
              seed: Optional[int] = None) -> dict:
    """A private top-k of the embedded dataset (``dp_top_k``) and the true top-k (NON-PRIVATE, for comparison)."""
    from dpsql import topk

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # callers print their own warning for a seed
        con = dpsql.connect(seed=seed)
    try:
        with dataset_path() as path:
            _load(con, path)
        private = topk.top_k(con, _TABLE, k, epsilon=epsilon, delta=delta, max_items=max_items)
        true = con.execute(f"SELECT item FROM {_TABLE} GROUP BY item ORDER BY count(DISTINCT user_id) DESC, item "
                           f"LIMIT {int(k)}").fetchall()
        return {"k": k, "private": private.column("item").to_pylist(), "true_non_private": [r[0] for r in true]}
    finally:
        con.close()


def format_top_k(top: dict, *, epsilon: float = EPSILON, delta: float = DELTA) -> str:
    """The private top-k next to the true top-k (the latter labelled NON-PRIVATE)."""
    k = top["k"]
    out = [f"Top-{k} words: dp_top_k at epsilon={epsilon:g}, delta={delta:g} (private) vs. the true top-{k} "
           f"(NON-PRIVATE, computed from the raw data for comparison):", "",
           f"rank  {'private':<14}true (NON-PRIVATE)"]
    for i in range(k):
        p = top["private"][i] if i < len(top["private"]) else "-"
        t = top["true_non_private"][i] if i < len(top["true_non_private"]) else "-"
        out.append(f"{i + 1:>4}  {p:<14}{t}")
    return "\n".join(out)


def print_demo(rows: list[dict], summary: dict, *, epsilon: float = EPSILON, delta: float = DELTA,
               max_items: int = MAX_ITEMS, as_json: bool = False, seeded: bool = False,
               out: TextIO = sys.stdout, top_k: Optional[dict] = None) -> None:
    """Print the report as text, or as one JSON object (``private`` is false for a seeded run)."""
    if as_json:
        doc = {"dataset": summary, "epsilon": epsilon, "delta": delta, "max_items": max_items,
               "private": not seeded, "evaluation": EVALUATION_NOTE, "rows": rows}
        if top_k is not None:
            doc["top_k"] = top_k
        out.write(json.dumps(doc, indent=2) + "\n")
    else:
        out.write(format_demo(rows, summary, epsilon=epsilon, delta=delta, max_items=max_items) + "\n")
        if top_k is not None:
            out.write("\n" + format_top_k(top_k, epsilon=epsilon, delta=delta) + "\n")
    out.flush()
