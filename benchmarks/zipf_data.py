"""Synthetic Zipfian user-item data for the set-union benchmarks.

Model (all randomness is a hash of ``seed`` and the row's coordinates, so the
output is identical for a given set of parameters whatever the thread count):

* **Users.** User ``i`` (``user_id = i``, ``i = 0, 1, ...``) has a raw degree
  (number of rows) drawn from a discrete Pareto (power-law) distribution::

      d_i = min(max_degree, floor(min_degree * u ** (-1 / alpha))),   u ~ U(0, 1)

  so ``P(d >= x) ~ (min_degree / x) ** alpha``. With the defaults
  (``min_degree = 4``, ``alpha = 1.3``, ``max_degree = 20000``) the mean raw
  degree is about 17 (median 6), roughly 1.5 % of users have more than 100 rows, and
  those heavy users hold roughly 40 % of all rows, so the ``max_items = 100``
  cap of the set-union macros matters. Users are added in order until the
  table has exactly ``rows`` rows (the last user is truncated).

* **Items.** Each row draws its item independently (with replacement, so a
  user can repeat an item; the mechanisms count distinct pairs) from an
  approximate Zipf(``zipf_s``) law over ``vocabulary`` items: ``item = k`` with
  ``P(k) ~ k ** -zipf_s``, ``k = 1..vocabulary`` (k is the popularity rank; 1
  is the most popular item). Sampling inverts the CDF of the continuous power
  law on ``[1, vocabulary + 1)`` and floors it, which is exact in the tail and
  close in the head. With the defaults (``zipf_s = 1.1``, ``vocabulary = 10M``)
  most of the vocabulary occurs at most a few times: many distinct items,
  most of them rare, as in query logs and text corpora.

* **Row order.** ``order='random'`` (default) stores the rows in a
  pseudo-random order, like an event log in time order in which users are
  interleaved; ``order='user'`` stores each user's rows together.

* **Item type.** ``item_type='BIGINT'`` (default) stores the rank; with
  ``'VARCHAR'`` the item is the string ``'w' || rank`` (at most 9 bytes, so
  DuckDB stores it inline).

Output: a table ``user_id BIGINT, item BIGINT|VARCHAR`` in a DuckDB database
file and/or a Parquet file.

CLI::

    python benchmarks/zipf_data.py --rows 10000000 --db benchmarks/data/zipf.duckdb --table t10m
    python benchmarks/zipf_data.py --rows 1000000 --parquet zipf_1m.parquet --item-type VARCHAR

Python::

    from benchmarks.zipf_data import generate
    generate(con, "t", rows=1_000_000)          # con: a duckdb connection
"""
from __future__ import annotations

import argparse
import math
import time

import duckdb

DEFAULTS = dict(min_degree=4, alpha=1.3, max_degree=20000, vocabulary=10_000_000, zipf_s=1.1,
                seed=42, item_type="BIGINT", order="random")

# A uniform double in (0, 1) from a 64-bit hash: the top 53 bits, centred.
_U = "((({h}) >> 11)::DOUBLE + 0.5) / 9007199254740992.0"


def _item_expr(vocabulary: int, zipf_s: float, u: str) -> str:
    # Inverse CDF of the density ~ x^-s on [1, V + 1), floored: k in 1..V.
    v1 = float(vocabulary + 1)
    if abs(zipf_s - 1.0) < 1e-12:
        x = f"pow({v1!r}, {u})"
    else:
        a = 1.0 - zipf_s
        x = f"pow(1.0 + ({u}) * ({v1 ** a!r} - 1.0), {1.0 / a!r})"
    return f"least({vocabulary}, greatest(1, floor({x})::BIGINT))"


def generation_sql(rows: int, n_users: int, *, min_degree: float, alpha: float, max_degree: int,
                   vocabulary: int, zipf_s: float, seed: int, item_type: str, order: str) -> str:
    """The SELECT producing exactly ``rows`` rows (if ``n_users`` users suffice)."""
    u_deg = _U.format(h=f"hash({seed}, 'degree', i)")
    degree = f"least({max_degree}, greatest(1, floor({min_degree!r} * pow({u_deg}, {-1.0 / alpha!r}))::BIGINT))"
    item = _item_expr(vocabulary, zipf_s, _U.format(h=f"hash({seed}, 'item', user_id, j)"))
    if item_type.upper() == "VARCHAR":
        item = f"'w' || {item}"
    elif item_type.upper() != "BIGINT":
        raise ValueError(f"item_type must be BIGINT or VARCHAR (got {item_type!r})")
    if order == "random":
        order_by = f"ORDER BY hash({seed}, 'order', user_id, j)"
    elif order == "user":
        order_by = "ORDER BY user_id, j"
    else:
        raise ValueError(f"order must be 'random' or 'user' (got {order!r})")
    return f"""
WITH users AS (SELECT i AS user_id, {degree} AS d FROM range({n_users}) r(i)),
starts AS (SELECT user_id, d, sum(d) OVER (ORDER BY user_id ROWS UNBOUNDED PRECEDING) - d AS start
           FROM users),
kept AS (SELECT user_id, d, start FROM starts WHERE start < {rows}),
expanded AS (SELECT user_id, start, unnest(range(d)) AS j FROM kept)
SELECT user_id::BIGINT AS user_id, {item} AS item
FROM expanded
WHERE start + j < {rows}
{order_by}"""


def _expected_degree(min_degree: float, alpha: float, max_degree: int) -> float:
    # Mean of the continuous Pareto truncated at max_degree: a safe over-estimate of the floored one.
    if abs(alpha - 1.0) < 1e-12:
        return min_degree * (1.0 + math.log(max_degree / min_degree))
    return min(max_degree, min_degree * alpha / (alpha - 1.0)
               * (1.0 - (min_degree / max_degree) ** (alpha - 1.0)) + min_degree * (min_degree / max_degree) ** alpha)


def generate(con: duckdb.DuckDBPyConnection, table: str, rows: int, *, replace: bool = True,
             parquet: str | None = None, **params) -> int:
    """Create ``table`` on ``con`` with exactly ``rows`` rows of Zipfian user-item data.

    ``params`` override :data:`DEFAULTS` (``min_degree``, ``alpha``,
    ``max_degree``, ``vocabulary``, ``zipf_s``, ``seed``, ``item_type``,
    ``order``). If ``parquet`` is given the table is also written there.
    Returns the number of rows written.
    """
    unknown = set(params) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"unknown parameters: {', '.join(sorted(unknown))}")
    p = {**DEFAULTS, **params}
    if rows < 1:
        raise ValueError("rows must be >= 1")
    n_users = int(rows / _expected_degree(p["min_degree"], p["alpha"], p["max_degree"]) * 1.3) + 1000
    create = "CREATE OR REPLACE TABLE" if replace else "CREATE TABLE"
    while True:
        con.execute(f"{create} {table} AS {generation_sql(rows, n_users, **p)}")
        got = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        if got == rows:
            break
        n_users *= 2  # too few users to fill the table: retry with more
        create = "CREATE OR REPLACE TABLE"
    if parquet:
        con.execute(f"COPY {table} TO '{parquet}' (FORMAT parquet)")
    return got


def describe(con: duckdb.DuckDBPyConnection, table: str, max_items: int = 100) -> dict:
    """Summary statistics of a generated table (users, distinct pairs and items, share over the cap)."""
    row = con.execute(f"""
        WITH pairs AS (SELECT DISTINCT user_id, item FROM {table}),
        deg AS (SELECT user_id, count(*) AS d FROM pairs GROUP BY user_id)
        SELECT (SELECT count(*) FROM {table}), count(*), sum(d), max(d),
               count(*) FILTER (WHERE d > {max_items}), sum(d) FILTER (WHERE d > {max_items}),
               sum(least(d, {max_items})),
               (SELECT count(DISTINCT item) FROM {table})
        FROM deg""").fetchone()
    rows, users, pairs, max_d, heavy, heavy_pairs, capped_pairs, items = row
    return dict(rows=rows, users=users, distinct_pairs=pairs, max_distinct_degree=max_d,
                users_over_cap=heavy, pairs_of_users_over_cap=heavy_pairs or 0,
                pairs_after_cap=capped_pairs, distinct_items=items)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, required=True, help="exact number of rows")
    ap.add_argument("--db", default=":memory:", help="DuckDB database file to write the table into")
    ap.add_argument("--table", default="t", help="table name (default t)")
    ap.add_argument("--parquet", help="also write the table to this Parquet file")
    for name in ("min_degree", "alpha", "zipf_s"):
        ap.add_argument("--" + name.replace("_", "-"), type=float, default=DEFAULTS[name])
    for name in ("max_degree", "vocabulary", "seed"):
        ap.add_argument("--" + name.replace("_", "-"), type=int, default=DEFAULTS[name])
    ap.add_argument("--item-type", choices=["BIGINT", "VARCHAR"], default=DEFAULTS["item_type"])
    ap.add_argument("--order", choices=["random", "user"], default=DEFAULTS["order"])
    ap.add_argument("--describe", action="store_true", help="print summary statistics afterwards")
    args = ap.parse_args(argv)
    if args.db == ":memory:" and not args.parquet:
        ap.error("give --db FILE and/or --parquet FILE (an in-memory table would be lost)")
    params = {k: getattr(args, k) for k in DEFAULTS}
    con = duckdb.connect(args.db)
    t0 = time.perf_counter()
    n = generate(con, args.table, args.rows, parquet=args.parquet, **params)
    print(f"{args.table}: {n} rows in {time.perf_counter() - t0:.1f} s", flush=True)
    if args.describe:
        for k, v in describe(con, args.table).items():
            print(f"  {k}: {v}")
    con.close()


if __name__ == "__main__":
    main()
