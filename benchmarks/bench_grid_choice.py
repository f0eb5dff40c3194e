"""A private choice between the default and ``greedy_update`` on the robustness grid (issue 33, point 2).

The grid (``bench_grid.py``) shows the default ``sips_cumulative`` behind ``greedy_update`` where users
hold one to three items or popularity is steep, and ahead on the shared datasets and on flat
geometric / heavy-tailed shapes; the better of the two at the full budget is at or above every
sequential method on every pair measured. This benchmark measures what choosing between them
**privately** costs: a share of epsilon spent on a statistic of the data's shape, and wrong picks near
the border. A prototype (benchmark code), not a release method.

**The statistic** (:func:`statistic`). Degree bound D, cut c = p/q in lowest terms. Each user
contributes ``q [d <= D] - p`` (d: the user's own number of distinct items), so

    f = q #{users with d <= D} - p #{users},

an integer with ``f >= 0`` exactly when the share of users with d <= D is at least c. Adding or
removing one user with all its rows changes only that user's term: ``|f - f'| <= Delta = max(p, q - p)``
(:func:`sensitivity`). The release is ``f + Z``, ``Z ~ DLap(Delta / epsilon0)`` from dpsql's discrete
Laplace sampler (the geometric mechanism: pmf ``prop. to exp(-|z| epsilon0 / Delta)``, so a shift by at
most Delta changes every probability by at most ``e^epsilon0``: epsilon0-DP exactly); the choice is
``greedy_update`` iff ``f + Z >= 0`` (:func:`noisy_pick`), the default otherwise.

**Composition.** The choice is pure epsilon0-DP; the chosen method runs at ``(epsilon - epsilon0,
delta)``. Basic sequential composition (valid for an adaptively chosen second mechanism) gives
``(epsilon, delta)``.

**Simulation, exact in distribution.** The statistic's noise is independent of the methods' noise, so
per (point, setting) and run the default and ``greedy_update`` run once at ``epsilon (1 - share)`` for
each share, and a variant's released count is the count of the method it picks. Its mean over the
choice's noise is ``P G + (1 - P) S`` (G, S: the two methods' means over runs at that budget;
``P = P[f + Z >= 0]`` from the discrete Laplace tail, :func:`prob_greedy`; the exact f is computed only
to evaluate P). Each run also draws one Z per variant from a seeded dpsql source independent of the
connection's, as a check (the "simulated" column).

**Variants** (``variants()``): D in {1, 2, 3, 5}, c in {0.5, 0.7, 0.9}, share in {0.02, 0.05}:
``choice_D<D>_c<c>_e<share>``. **Reference**: the best of ``greedy_update`` at the full budget (run
fresh, label ``greedy_full``) and ``policy_laplace`` / ``policy_gaussian`` from the robustness grid's
results table in benchmarks/README.md (5 runs each there). **Rule** (declared in benchmarks/README.md
before the tuning run): the variant maximising the smallest ratio of its expected count to the best
sequential mean over the tuning pairs; ties (3 decimals) by the geometric mean, then the smaller share,
D, c.

Findings (2026-11-28, benchmarks/README.md, "Robustness grid", "A private choice between the default
and greedy_update"): the rule picks ``choice_D5_c0.5_e0.02``, which picks ``greedy_update`` on every grid
point and the default on every shared dataset; smallest ratio to the best sequential method 0.956
(tuning) / 0.906 (report grid) / 0.990 (shared), geometric means 0.985 / 0.988 / 1.616. The 2 % of
epsilon costs the picked method 1-3 % of its items; the wrong picks (20 of 86 pairs, where the default
is ahead on flat geometric / heavy-tailed shapes) are systematic, not noise: a degree statistic sees
neither the items' popularity nor epsilon.

    python benchmarks/bench_grid_choice.py --part tuning --runs 5 --json choice_tuning.json
    python benchmarks/bench_grid_choice.py --table choice_tuning.json            # the rule's scores
    python benchmarks/bench_grid_choice.py --part report --sizes 1000,10000,100000 --runs 5 --json choice_report.json
    python benchmarks/bench_grid_choice.py --shared-only --runs 5 --json choice_report.json
    python benchmarks/bench_grid_choice.py --table choice_tuning.json choice_report.json --variant choice_D3_c0.7_e0.02

``--shares``, ``--degree-bounds`` and ``--cuts`` replace the family (the study of ``auto``'s share, 2026-11-29:
``--shares 0.01,0.02 --degree-bounds 5 --cuts 0.5``, for the runs and for ``--table`` alike).
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
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_grid as grid  # noqa: E402  (the grid, its split, its data, its harness)

DEGREE_BOUNDS = (1, 2, 3, 5)
CUTS = ("0.5", "0.7", "0.9")
SHARES = ("0.02", "0.05")
GREEDY, DEFAULT = "greedy_update", grid.DEFAULT
POLICIES = ("policy_laplace", "policy_gaussian")


@dataclass(frozen=True)
class Choice:
    """One variant: degree bound ``D``, cut ``c`` (a decimal string, exact as a fraction), share of epsilon."""

    D: int
    c: str
    share: str

    @property
    def label(self) -> str:
        return f"choice_D{self.D}_c{self.c}_e{self.share}"

    @property
    def cut(self) -> Fraction:
        return Fraction(self.c)


def variants() -> list[Choice]:
    return [Choice(D, c, s) for s in SHARES for D in DEGREE_BOUNDS for c in CUTS]


def sensitivity(cut: Fraction) -> int:
    """``max(p, q - p)`` for ``cut = p/q`` in lowest terms: one user's term ``q [d <= D] - p`` lies in
    ``{q - p, -p}``, and adding or removing the user adds or removes that term only."""
    if not 0 < cut < 1:
        raise ValueError("cut must be in (0, 1)")
    return max(cut.numerator, cut.denominator - cut.numerator)


def statistic(degrees: Sequence[int], D: int, cut: Fraction) -> int:
    """``f = q #{d <= D} - p #{users}`` over the users' numbers of distinct items ``degrees``."""
    low = sum(1 for d in degrees if d <= D)
    return statistic_from_counts(low, len(degrees), cut)


def statistic_from_counts(low: int, users: int, cut: Fraction) -> int:
    """``f`` from the number of users with ``d <= D`` (``low``) and the number of users."""
    return cut.denominator * int(low) - cut.numerator * int(users)


def noise_steps(cut: Fraction, epsilon0: float) -> float:
    """``t = Delta / epsilon0``: the discrete Laplace ``DLap(t)`` (pmf prop. to ``exp(-|z|/t)``) that makes
    ``f + Z`` epsilon0-DP, Delta = :func:`sensitivity`."""
    if not epsilon0 > 0:
        raise ValueError("epsilon0 must be > 0")
    return sensitivity(cut) / epsilon0


def prob_greedy(f: int, cut: Fraction, epsilon0: float) -> float:
    """``P[f + Z >= 0] = P[Z >= -f]``, ``Z ~ DLap(t)``: with ``a = exp(-1/t)``, ``P[Z >= m] = a^m / (1 + a)``
    for ``m >= 1`` and ``1 - a^(1-m) / (1 + a)`` for ``m <= 0``."""
    t = noise_steps(cut, epsilon0)
    a = math.exp(-1.0 / t)
    m = -int(f)
    if m >= 1:
        return math.exp(m * (-1.0 / t) - math.log1p(a))
    return -math.expm1((1 - m) * (-1.0 / t) - math.log1p(a))


def noisy_pick(source, f: int, cut: Fraction, epsilon0: float) -> bool:
    """True (``greedy_update``) iff ``f + Z >= 0``, Z from the source's discrete Laplace sampler."""
    z = int(source.discrete_laplace(np.array([noise_steps(cut, epsilon0)]))[0])
    return int(f) + z >= 0


def degree_counts(con, table: str = "t") -> dict:
    """Users, and users with at most D distinct items for every D of the family (exact; benchmark only)."""
    cols = ", ".join(f"count(*) FILTER (WHERE d <= {D})" for D in DEGREE_BOUNDS)
    row = con.execute(f"SELECT count(*), {cols} FROM (SELECT user_id, count(DISTINCT item) AS d "
                      f"FROM {table} GROUP BY user_id)").fetchone()
    return {"users": int(row[0]), **{str(D): int(v) for D, v in zip(DEGREE_BOUNDS, row[1:])}}


def release_labels() -> list[tuple[str, str, float]]:
    """(label, method, budget factor): both methods at each share's budget, and greedy at the full one."""
    out = [(f"{m}@{s}", m, 1.0 - float(s)) for s in SHARES for m in (DEFAULT, GREEDY)]
    return out + [("greedy_full", GREEDY, 1.0)]


def run_point(point: grid.Point, settings: list[str], runs: int, threads: int, cache: Path, max_seconds: float,
              log: Callable[[str], None], first_run: int = 0) -> list[dict]:
    import dpsql.core.noise as noise

    path = grid.table_path(point, cache)
    rows = []
    for setting in settings:
        epsilon, delta, max_items = grid.SETTINGS[setting]
        labels = release_labels()
        counts: dict[str, list[int]] = {k: [] for k, _, _ in labels}
        seconds: dict[str, list[float]] = {k: [] for k, _, _ in labels}
        stopped = {k: False for k, _, _ in labels}
        picks: dict[str, list[bool]] = {v.label: [] for v in variants()}
        degrees: dict = {}
        load = []
        for run in range(first_run, first_run + runs):
            load.append(os.getloadavg()[0])
            con = grid._open(path, 1000 + run, threads)
            try:
                if not degrees:
                    degrees = degree_counts(con)
                for label, method, factor in labels:
                    if stopped[label]:
                        continue
                    t0 = time.perf_counter()
                    counts[label].append(len(grid._release(con, "t", method, {}, epsilon * factor, delta, max_items)))
                    seconds[label].append(time.perf_counter() - t0)
                    stopped[label] = seconds[label][-1] > max_seconds
            finally:
                con.close()
            # the choice's own noise: a seeded source independent of the connection's (simulation only)
            source = noise.NoiseSource(7000 + run)
            for v in variants():
                f = statistic_from_counts(degrees[str(v.D)], degrees["users"], v.cut)
                picks[v.label].append(noisy_pick(source, f, v.cut, epsilon * float(v.share)))
        row = {"point": point.name, "shape": point.shape, "exponent": point.exponent, "users": point.users,
               "part": point.part, "setting": setting, "degrees": degrees, "counts": counts, "seconds": seconds,
               "picks": picks, "load": load, "runs": runs}
        rows.append(row)
        log(json.dumps({"point": point.name, "setting": setting, "degrees": degrees,
                        "means": {k: (statistics.mean(v) if v else None) for k, v in counts.items()},
                        "s": {k: round(sum(v), 1) for k, v in seconds.items()}}))
    return rows


@dataclass
class Scored:
    """One (pair, variant): the reduced-budget means, the reference, P[greedy] and the expectation."""

    name: str
    part: str
    default: float
    greedy: float
    best: float
    best_label: str
    p: float
    expected: float
    simulated: float

    @property
    def ratio(self) -> float:
        return self.expected / self.best

    @property
    def wrong(self) -> float:
        """Probability of picking the method with the lower mean at this budget (0 on a tie)."""
        if self.greedy == self.default:
            return 0.0
        return 1.0 - self.p if self.greedy > self.default else self.p

    @property
    def oracle(self) -> float:
        return max(self.greedy, self.default)


def _part(r: dict) -> str:
    return "tuning" if r["part"] == "tuning" else ("report (shared)" if r["users"] == 0 else "report (grid)")


def score(rows: list[dict], v: Choice, reference: dict) -> list[Scored]:
    out = []
    for r in rows:
        c = r["counts"]
        s_counts, g_counts = c.get(f"{DEFAULT}@{v.share}"), c.get(f"{GREEDY}@{v.share}")
        if not s_counts or not g_counts:
            continue
        epsilon = grid.SETTINGS[r["setting"]][0]
        seq = dict(reference.get((r["point"], r["setting"]), {}))
        seq = {k: x for k, x in seq.items() if k in POLICIES}
        if c.get("greedy_full"):
            seq["greedy_update (full)"] = statistics.mean(c["greedy_full"])
        if not seq or max(seq.values()) <= 0:
            continue
        best_label = max(seq, key=lambda k: seq[k])
        f = statistic_from_counts(r["degrees"][str(v.D)], r["degrees"]["users"], v.cut)
        p = prob_greedy(f, v.cut, epsilon * float(v.share))
        s_mean, g_mean = statistics.mean(s_counts), statistics.mean(g_counts)
        n = min(len(s_counts), len(g_counts), len(r["picks"][v.label]))
        sim = statistics.mean(g_counts[k] if r["picks"][v.label][k] else s_counts[k] for k in range(n))
        out.append(Scored(f"{r['point']} ({r['setting']})", _part(r), s_mean, g_mean, seq[best_label], best_label,
                          p, p * g_mean + (1 - p) * s_mean, sim))
    return out


def rule_key(v: Choice, scored: list[Scored]) -> tuple:
    """The declared rule, as a sort key (smallest first = best): smallest ratio, geometric mean (3 decimals,
    larger first), then the smaller share, D, c."""
    rs = [x.ratio for x in scored]
    return (-round(min(rs), 3), -round(_geo(rs), 3), float(v.share), v.D, float(v.c))


def _geo(xs: list[float]) -> float:
    return math.exp(statistics.mean(math.log(max(x, 1e-9)) for x in xs))


def summary(scored: list[Scored]) -> str:
    rs = [x.ratio for x in scored]
    low = min(scored, key=lambda x: x.ratio)
    high = max(scored, key=lambda x: x.ratio)
    return (f">= best sequential on {sum(r >= 1 for r in rs)}/{len(rs)}, >= 0.95 on {sum(r >= 0.95 for r in rs)}; "
            f"ratio {low.ratio:.3f} (lowest, {low.name}) to {high.ratio:.3f} ({high.name}); geometric mean "
            f"{_geo(rs):.3f}; oracle at this budget: lowest {min(x.oracle / x.best for x in scored):.3f}, "
            f"geometric mean {_geo([x.oracle / x.best for x in scored]):.3f}; wrong picks: mean rate "
            f"{statistics.mean(x.wrong for x in scored):.3f}, pairs above 5 %: {sum(x.wrong > 0.05 for x in scored)}")


def markdown(scored: list[Scored], rows: list[dict], v: Choice) -> str:
    by_name = {f"{r['point']} ({r['setting']})": r for r in rows}
    head = ["point", "part", "set", "share d <= D", f"default @{v.share}", f"greedy_update @{v.share}", "best seq.",
            "P[greedy]", f"{v.label} (expected)", "simulated", "ratio", "oracle @share / best"]
    out = ["| " + " | ".join(head) + " |", "|---|---|---|" + "---:|" * (len(head) - 3)]
    for x in scored:
        r = by_name[x.name]
        share = r["degrees"][str(v.D)] / r["degrees"]["users"]
        part = "**T**" if r["part"] == "tuning" else "R"
        out.append(f"| {r['point']} | {part} | {r['setting']} | {share:.3f} | {x.default:,.1f} | {x.greedy:,.1f} | "
                   f"{x.best:,.1f} ({x.best_label.replace(' (full)', '')}) | {x.p:.3f} | {x.expected:,.1f} | "
                   f"{x.simulated:,.1f} | {x.ratio:.3f} | {x.oracle / x.best:.3f} |")
    return "\n".join(out)


def merge_runs(rows: list[dict]) -> list[dict]:
    """Rows of the same (point, setting) from several invocations (``--first-run``): their runs
    concatenated (counts, seconds, picks, load), in the order of the files."""
    merged: dict[tuple[str, str], dict] = {}
    for r in rows:
        key = (r["point"], r["setting"])
        if key not in merged:
            merged[key] = json.loads(json.dumps(r))
            continue
        m = merged[key]
        for field in ("counts", "seconds", "picks"):
            for k, v in r[field].items():
                m[field][k] = m[field].get(k, []) + v
        m["load"] += r["load"]
        m["runs"] += r["runs"]
    return list(merged.values())


def overview(scores: dict[Choice, list[Scored]], order: list[Choice]) -> str:
    """Markdown: per variant (in the rule's order) and part, the smallest ratio, the geometric mean and the
    pairs at or above the best sequential method; the mean wrong-pick rate over every pair."""
    parts = ("tuning", "report (grid)", "report (shared)")
    head = ["variant"] + [f"{p}: min / geo. mean / >= 1" for p in parts] + ["wrong picks (all pairs)"]
    out = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for v in order:
        cells = []
        for p in parts:
            rs = [x.ratio for x in scores[v] if x.part == p]
            cells.append(f"{min(rs):.3f} / {_geo(rs):.3f} / {sum(r >= 1 for r in rs)} of {len(rs)}" if rs else "-")
        wrong = statistics.mean(x.wrong for x in scores[v])
        out.append(f"| {v.label} | " + " | ".join(cells) + f" | {wrong:.3f} |")
    return "\n".join(out)


def main(argv=None) -> None:
    global SHARES, DEGREE_BOUNDS, CUTS  # --shares, --degree-bounds, --cuts replace the family
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="Variants: choice_D<D>_c<c>_e<share>, D in %s, c in %s, share in %s. "
                                 "Each run releases the default and greedy_update at epsilon (1 - share) for "
                                 "every share, and greedy_update at the full epsilon (the reference); a variant's "
                                 "count is the expectation over its choice's noise (module docstring)."
                                 % (DEGREE_BOUNDS, CUTS, SHARES))
    ap.add_argument("--part", choices=["tuning", "report", "all"], default="all")
    ap.add_argument("--points", help="comma-separated point names (default: every point of --part)")
    ap.add_argument("--sizes", help="comma-separated numbers of users to keep (e.g. 1000,10000)")
    ap.add_argument("--shared", action="store_true", help="also the shared datasets (report part)")
    ap.add_argument("--shared-only", action="store_true")
    ap.add_argument("--settings", default="a,b")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--first-run", type=int, default=0, help="number of the first run (seeds 1000 + run and, for "
                    "the choice's draws, 7000 + run): more runs of pairs already run, merged by --table")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-seconds", type=float, default=120.0)
    ap.add_argument("--cache", default=tempfile.gettempdir())
    ap.add_argument("--json", help="append the results (one JSON line per point and setting) to this file")
    ap.add_argument("--table", nargs="+", help="score the variants by the declared rule on the tuning rows of these "
                    "JSON files, print the summaries and the chosen variant's table, then stop")
    ap.add_argument("--variant", help="with --table: the variant whose table is printed (default: the rule's choice)")
    ap.add_argument("--shares", help="comma-separated shares of epsilon in place of the family's (releases and "
                    "variants), e.g. 0.01,0.02")
    ap.add_argument("--degree-bounds", help="comma-separated degree bounds D in place of the family's")
    ap.add_argument("--cuts", help="comma-separated cuts c in place of the family's")
    args = ap.parse_args(argv)
    if args.shares:
        SHARES = tuple(args.shares.split(","))
    if args.degree_bounds:
        DEGREE_BOUNDS = tuple(int(x) for x in args.degree_bounds.split(","))
    if args.cuts:
        CUTS = tuple(args.cuts.split(","))
    if args.table:
        rows = merge_runs([json.loads(line) for f in args.table for line in Path(f).read_text().splitlines()
                           if line.strip()])
        reference = grid.readme_sequential()
        scores = {v: score(rows, v, reference) for v in variants()}
        tuning = {v: [x for x in s if x.part == "tuning"] for v, s in scores.items()}
        ranked = sorted((v for v in variants() if tuning[v]), key=lambda v: rule_key(v, tuning[v]))
        for v in ranked:
            rs = [x.ratio for x in tuning[v]]
            print(f"{v.label}: min ratio {min(rs):.3f}, geometric mean {_geo(rs):.3f} over {len(rs)} tuning pairs")
        chosen = next(v for v in variants() if v.label == args.variant) if args.variant else ranked[0]
        print(f"\nchosen: {chosen.label}")
        for v in [chosen] + [u for u in variants() if u != chosen]:
            for part in ("tuning", "report (grid)", "report (shared)"):
                sc = [x for x in scores[v] if x.part == part]
                if sc:
                    print(f"{part}, {v.label}: {summary(sc)}")
        print()
        print(overview(scores, [v for v in ranked]))
        print()
        print(markdown(scores[chosen], rows, chosen))
        return
    points = [] if args.shared_only else grid.grid_points()
    if args.part != "all":
        points = [p for p in points if p.part == args.part]
    if args.points:
        wanted = args.points.split(",")
        points = [p for p in grid.grid_points() + grid.shared_points() if p.name in wanted]
    if args.sizes:
        sizes = {int(float(x)) for x in args.sizes.split(",")}
        points = [p for p in points if p.users in sizes]
    if args.shared or args.shared_only:
        points += grid.shared_points()
    warnings.simplefilter("ignore")
    print(f"load {os.getloadavg()[0]:.1f}; runs {args.runs}; {len(points)} points", flush=True)
    cache = Path(args.cache)
    for p in points:
        rows = run_point(p, args.settings.split(","), args.runs, args.threads, cache, args.max_seconds,
                         lambda s: print(s, flush=True), args.first_run)
        if args.json:
            with open(args.json, "a") as fh:
                for r in rows:
                    fh.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
