"""Empirical privacy audit of every mechanism (``dpsql.audit``): the full table.

For each mechanism of ``dpsql.audit.MECHANISMS`` (the shipped releases and two deliberately
broken variants), pilot runs choose a neighbouring pair and an event, then ``--runs`` fresh
copies of that pair released in one SQL call per dataset give a Clopper-Pearson lower bound on
the realised epsilon at ``--confidence``. Prints a markdown table (and ``--json`` rows) with the
date, machine and load; seeded connections, so the numbers reproduce (and are NOT private).

    python benchmarks/audit.py --runs 100000 --epsilon 1 --delta 1e-5 --confidence 0.95
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import time

from dpsql import audit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--mechanisms", nargs="*", default=None, help="default: all of dpsql.audit.MECHANISMS")
    parser.add_argument("--json", action="store_true", help="also print one JSON object per result")
    args = parser.parse_args()

    names = args.mechanisms or list(audit.MECHANISMS)
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    results = []
    for j, name in enumerate(names):
        r = audit.audit(name, args.epsilon, args.delta, args.runs, args.confidence, args.seed + j)
        results.append(r)
        print(f"# {name}: lower bound {r.epsilon_lower_bound:.3f} (claim {r.claimed_epsilon:g}), "
              f"{r.seconds:.1f} s", flush=True)
        if args.json:
            print(json.dumps(dataclasses.asdict(r)), flush=True)
    total = time.perf_counter() - started
    print()
    print(f"{datetime.date.today().isoformat()}, {platform.machine()} {platform.system()}, "
          f"{os.cpu_count()} cores; (epsilon, delta) = ({args.epsilon:g}, {args.delta:g}), "
          f"runs {args.runs:,} per dataset, confidence {args.confidence:g}, seed {args.seed}; "
          f"total {total:.0f} s; load average before / after {load_before:.2f} / {os.getloadavg()[0]:.2f}")
    print()
    print(audit.to_markdown(results))


if __name__ == "__main__":
    main()
