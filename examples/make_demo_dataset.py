"""Build the demo dataset shipped as ``dpsql/data/askreddit_unigrams.parquet``.

Usage::

    python examples/make_demo_dataset.py PATH/TO/reddit_askreddit_1pct/unigrams.parquet

The source file (columns ``user_id``, ``item``; one row per distinct pair) has
Reddit author names as ``user_id``. This script replaces each author by an
opaque id ``u00001``, ``u00002``, ... assigned in a seeded random order (so the
ids carry no trace of the alphabetical order of the names), keeps ``item``
unchanged, sorts by (user_id, item) and writes zstd Parquet. It prints the
row, user and item counts for ``dpsql/data/README.md``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

DEFAULT_OUTPUT = Path(__file__).resolve().parent.parent / "dpsql" / "data" / "askreddit_unigrams.parquet"
SEED = 20201  # fixed so that rebuilding gives byte-identical ids; the value itself is arbitrary


def pseudonymise(table: pa.Table, seed: int) -> pa.Table:
    """Replace ``user_id`` by ``u`` + a zero-padded number drawn from a seeded permutation."""
    authors = pc.unique(table["user_id"]).sort()  # sorted first so the result depends only on the seed
    order = np.random.default_rng(seed).permutation(len(authors))
    width = max(5, len(str(len(authors))))
    ids = pa.array([f"u{int(k) + 1:0{width}d}" for k in order], type=pa.string())
    new_user = pc.take(ids, pc.index_in(table["user_id"], value_set=authors))
    out = pa.table({"user_id": new_user, "item": table["item"].cast(pa.string())})
    out = out.group_by(["user_id", "item"]).aggregate([])  # distinct pairs (the source already is)
    return out.sort_by([("user_id", "ascending"), ("item", "ascending")])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="reddit_askreddit_1pct/unigrams.parquet")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)

    source = pq.read_table(args.source, columns=["user_id", "item"])
    table = pseudonymise(source, args.seed)
    if table.num_rows != source.num_rows:
        raise SystemExit(f"source has duplicate (user_id, item) pairs: {source.num_rows} rows -> {table.num_rows}")
    table = table.replace_schema_metadata(None)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, args.output, compression="zstd", compression_level=19)

    degrees = pc.value_counts(table["user_id"]).field("counts").to_numpy()
    print(f"wrote {args.output} ({args.output.stat().st_size:,} bytes)")
    print(f"rows {table.num_rows:,}; users {len(degrees):,}; distinct items {len(pc.unique(table['item'])):,}")
    print(f"items/user mean {degrees.mean():.1f}, median {int(np.median(degrees))}, max {degrees.max()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
