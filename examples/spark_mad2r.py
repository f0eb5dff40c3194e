"""MAD2R on Spark: release the items of a (user_id, item) Parquet file under (epsilon, delta)-DP.

    pip install ".[spark]"              # in the checkout: pyspark, sqlglot; needs Java 17+
    python examples/spark_mad2r.py --epsilon 1 --delta 1e-5      # the embedded AskReddit sample, local[2]
    python examples/spark_mad2r.py events.parquet --epsilon 1 --delta 1e-5 --user-col uid --item-col query \
        --output released.parquet
    python examples/spark_mad2r.py events.parquet --epsilon 1 --delta 1e-5 --master spark://host:7077

MAD2R is chosen by name: without a method, ``set_union`` runs the default, DuckDB's
(``sips_cumulative``). The release is a Spark DataFrame with one column ``item``; it is materialised once (reading it
again does not redraw the noise). Every parameter is checked before Spark reads a row, and a
NULL user or item stops it with a ``dpsql:`` error before anything is drawn.

No PYSPARK_PYTHON is needed on a local master: dpsql runs its own tasks with this interpreter
(even from a virtualenv that is not activated), and they need numpy, pyarrow, randomgen and
pandas, not duckdb. On a cluster, point PYSPARK_PYTHON at an interpreter the executors have.
"""
from __future__ import annotations

import argparse
from importlib import resources


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parquet", nargs="?", help="input Parquet file or folder (default: the demo data)")
    parser.add_argument("--user-col", default="user_id")
    parser.add_argument("--item-col", default="item")
    # Required, as everywhere in dpsql: a default would spend budget nobody typed.
    parser.add_argument("--epsilon", type=float, required=True, help="privacy parameter epsilon > 0, e.g. 1")
    parser.add_argument("--delta", type=float, required=True, help="privacy parameter 0 < delta < 1, e.g. 1e-5")
    parser.add_argument("--max-items", type=int, default=100)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--output", help="write the released items to this Parquet folder")
    args = parser.parse_args(argv)

    from pyspark.sql import SparkSession

    from dpsql.frontends import spark as dpspark

    path = args.parquet or str(resources.files("dpsql") / "data" / "askreddit_unigrams.parquet")
    session = (SparkSession.builder.master(args.master).appName("dpsql-mad2r")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    try:
        rows = session.read.parquet(path)
        released = dpspark.set_union(rows, "mad2r", epsilon=args.epsilon, delta=args.delta,
                                     max_items=args.max_items, user_col=args.user_col, item_col=args.item_col)
        n = released.count()
        print(f"MAD2R at (epsilon={args.epsilon}, delta={args.delta}, max_items={args.max_items}) "
              f"released {n} items")
        if args.output:
            released.write.mode("overwrite").parquet(args.output)
            print(f"written to {args.output}")
        else:
            print(", ".join(str(r[0]) for r in released.orderBy("item").limit(20).collect()))
    finally:
        session.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
