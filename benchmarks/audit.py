"""Empirical privacy audit of every mechanism (``dpsql.tools.audit``): the full table.

For each mechanism of ``dpsql.tools.audit.MECHANISMS`` (the shipped releases and deliberately broken
variants), pilot runs choose a neighbouring pair and an event, then fresh trials of that pair give
a Clopper-Pearson lower bound on the realised epsilon at ``--confidence``. A trial is one copy of
a replicated pair (``--runs`` copies released in one SQL call per dataset) or, for the
whole-output cases (row order, number of rows, exact output), one whole release (``--output-runs``
queries per dataset). Then every case is run once more with a non-constant epsilon, which must be
refused before the charge. Prints markdown tables (and ``--json`` rows) with the date, machine and
load; seeded connections, so the numbers reproduce (and are NOT private).

    python benchmarks/audit.py --runs 100000 --output-runs 2000 --epsilon 1 --delta 1e-5 --confidence 0.95
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import time

from dpsql.tools import audit
from dpsql.core import registry as mechanisms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--output-runs", type=int, default=2_000,
                        help="trials per dataset of the whole-output cases (one query each)")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--mechanisms", nargs="*", default=None, help="default: all of dpsql.tools.audit.MECHANISMS")
    parser.add_argument("--json", action="store_true", help="also print one JSON object per result")
    args = parser.parse_args()

    names = args.mechanisms or list(audit.MECHANISMS)
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    results = []
    for j, name in enumerate(names):
        whole = isinstance(audit.MECHANISMS[name], audit.OutputCase)
        runs = args.output_runs if whole else args.runs
        r = audit.audit(name, args.epsilon, args.delta, runs, args.confidence, args.seed + j)
        results.append(r)
        print(f"# {name}: lower bound {r.epsilon_lower_bound:.3f} (claim {r.claimed_epsilon:g}), "
              f"{r.seconds:.1f} s", flush=True)
        if args.json:
            print(json.dumps(dataclasses.asdict(r)), flush=True)
    refusals = [audit.check_refusal(name) for name in names]
    # the LIST form of the attack on every audited mechanism that declares a LIST parameter (split)
    declared = mechanisms.all_mechanisms()
    refusals += [audit.check_refusal(name, audit.VOLATILE_SPLIT, parameter="split") for name in names
                 if name in declared and "split" in declared[name].param_names
                 and declared[name].param("split").sql_type.endswith("[]")]
    total = time.perf_counter() - started
    print()
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()} "
          f"{platform.system()}, {os.cpu_count()} cores; (epsilon, delta) = ({args.epsilon:g}, {args.delta:g}), "
          f"runs {args.runs:,} copies / {args.output_runs:,} whole releases per dataset, "
          f"confidence {args.confidence:g}, seed {args.seed}; total {total:.0f} s; "
          f"load average before / after {load_before:.2f} / {os.getloadavg()[0]:.2f}")
    print()
    print(audit.to_markdown(results))
    print()
    print("| mechanism | parameter := (non-constant) | refused before the charge | charges |")
    print("|---|---|---|---|")
    for r in refusals:
        print(f"| `{r.mechanism}` | `{r.parameter} := {r.expression}` | {'yes' if r.refused else '**NO**'} | "
              f"{r.charges} |")


if __name__ == "__main__":
    main()
