"""The private choice's cut: one for both settings, or one per setting (issue 33; benchmark only).

``bench_grid_choice.py`` chose, by its declared rule, the choice "``greedy_update`` iff at least half of
the users hold at most 5 distinct items" (noisy, at 0.02 epsilon); its wrong picks were systematic. This
script scores other cuts **without releasing anything anew**: the per-pair table that
``bench_grid_choice.py`` committed to benchmarks/README.md holds, for every (point, setting), the means of
the default and of ``greedy_update`` at 0.98 epsilon and the best sequential method. A candidate
(D, c)'s expected count is ``P G + (1 - P) S`` with ``P = P[f + Z >= 0]`` the exact discrete Laplace tail
(:func:`bench_grid_choice.prob_greedy`) at the exact statistic f, recomputed here from the same tables
(the grid's seeded generator; the shared datasets' files) and checked against the table's share column.

Two forms, each chosen by the declared rule (benchmarks/README.md, "The choice's cut, one for both
settings or one per setting"): one (D, c) for both settings on the 24 tuning pairs, and one per
setting on that setting's 12 tuning pairs.

    python benchmarks/bench_grid_cut.py                 # needs the shared datasets (DPSQL_SHARED_DATA)
    python benchmarks/bench_grid_cut.py --markdown      # the README's tables
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_grid as grid  # noqa: E402
import bench_grid_choice as choice  # noqa: E402

DEGREE_BOUNDS = (3, 5)
CUTS = ("0.5", "0.6", "0.65", "0.7", "0.75", "0.8", "0.85", "0.9")
SHARE = 0.02
PARTS = ("tuning", "report (grid)", "report (shared)")


@dataclass(frozen=True)
class Pair:
    """One (point, setting) of the committed per-pair table."""

    point: str
    setting: str
    part: str
    share5: float  # the table's "share d <= D" (D = 5), three decimals
    default: float  # the default's mean at 0.98 epsilon
    greedy: float  # greedy_update's mean at 0.98 epsilon
    best: float  # the best sequential method's mean (full budget)

    @property
    def name(self) -> str:
        return f"{self.point} ({self.setting})"


def committed_pairs(readme: Path = HERE / "README.md") -> list[Pair]:
    """The per-pair table of the section "A private choice between the default and greedy_update"."""
    text = readme.read_text()
    section = text[text.index("### A private choice between the default and greedy_update"):]
    lines = section.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith("| point | part | set | share d <= D |"))
    out = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]

        def num(cell: str) -> float:
            return float(re.sub(r"[,\s]", "", cell.split("(")[0]))

        point = cells[0]
        users = 0 if not re.search(r"-n1e\d$", point) else 1
        part = "tuning" if cells[1] == "**T**" else ("report (grid)" if users else "report (shared)")
        out.append(Pair(point, cells[2], part, num(cells[3]), num(cells[4]), num(cells[5]), num(cells[6])))
    return out


def exact_counts(points: list[str], cache: Path) -> dict[str, dict]:
    """point -> users and users with at most D distinct items (D of the study and of the grid choice)."""
    import duckdb

    by_name = {p.name: p for p in grid.grid_points() + grid.shared_points()}
    out = {}
    for name in points:
        path = grid.table_path(by_name[name], cache)
        con = duckdb.connect()
        try:
            con.execute(f"CREATE VIEW t AS SELECT user_id, item FROM read_parquet('{path}')")
            out[name] = choice.degree_counts(con)
        finally:
            con.close()
    return out


def expected(pair: Pair, counts: dict, D: int, cut: str) -> tuple[float, float]:
    """(P[greedy], expected count) of the candidate (D, cut) at 0.02 epsilon on one pair."""
    epsilon = grid.SETTINGS[pair.setting][0]
    f = choice.statistic_from_counts(counts[str(D)], counts["users"], Fraction(cut))
    p = choice.prob_greedy(f, Fraction(cut), epsilon * SHARE)
    return p, p * pair.greedy + (1 - p) * pair.default


def ratios(pairs: list[Pair], counts: dict, pick) -> list[float]:
    """The ratio to the best sequential method per pair; ``pick(setting) -> (D, cut)``."""
    return [expected(x, counts[x.point], *pick(x.setting))[1] / x.best for x in pairs]


def rule_key(rs: list[float], D: int, cut: str) -> tuple:
    """The declared rule as a sort key (smallest = best)."""
    return (-round(min(rs), 3), -round(choice._geo(rs), 3), D, float(cut))


def choose(pairs: list[Pair], counts: dict) -> tuple[str, str]:
    cands = [(D, c) for D in DEGREE_BOUNDS for c in CUTS]
    return min(cands, key=lambda dc: rule_key(ratios(pairs, counts, lambda s: dc), *dc))


def describe(rs: list[float], names: list[str]) -> str:
    k = min(range(len(rs)), key=rs.__getitem__)
    return (f"{min(rs):.3f} ({names[k]}) / {choice._geo(rs):.3f} / {sum(r >= 1 for r in rs)} of {len(rs)} "
            f"/ {sum(r >= 0.95 for r in rs)} of {len(rs)}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=tempfile.gettempdir(), help="where the grid's tables are generated")
    ap.add_argument("--markdown", action="store_true", help="also print every pair's row")
    args = ap.parse_args(argv)
    pairs = committed_pairs()
    counts = exact_counts(sorted({x.point for x in pairs}), Path(args.cache))
    for x in pairs:  # the recomputed statistic is the one the table was scored with
        share = counts[x.point]["5"] / counts[x.point]["users"]
        if abs(share - x.share5) > 0.0005 + 1e-12:
            raise SystemExit(f"{x.point}: recomputed share {share:.4f} is not the table's {x.share5:.3f}")
    tuning = [x for x in pairs if x.part == "tuning"]
    one = choose(tuning, counts)
    per = {s: choose([x for x in tuning if x.setting == s], counts) for s in ("a", "b")}
    forms = {"choice_D5_c0.5 (the section above)": lambda s: (5, "0.5"),
             f"one cut: D{one[0]}_c{one[1]}": lambda s: one,
             f"per setting: (a) D{per['a'][0]}_c{per['a'][1]}, (b) D{per['b'][0]}_c{per['b'][1]}": lambda s: per[s]}
    print("| form | " + " | ".join(f"{p}: min (where) / geo. mean / >= 1 / >= 0.95" for p in PARTS) + " |")
    print("|---|" + "---|" * len(PARTS))
    for label, pick in forms.items():
        cells = []
        for part in PARTS:
            sub = [x for x in pairs if x.part == part]
            cells.append(describe(ratios(sub, counts, pick), [x.name for x in sub]))
        print(f"| {label} | " + " | ".join(cells) + " |")
    print("\nEvery candidate, one cut for both settings (rule order on the tuning pairs): min / geo. mean")
    cands = sorted(((D, c) for D in DEGREE_BOUNDS for c in CUTS),
                   key=lambda dc: rule_key(ratios(tuning, counts, lambda s: dc), *dc))
    for D, c in cands:
        cells = []
        for part in PARTS:
            rs = ratios([x for x in pairs if x.part == part], counts, lambda s: (D, c))
            cells.append(f"{min(rs):.3f} / {choice._geo(rs):.3f}")
        print(f"| D{D}_c{c} | " + " | ".join(cells) + " |")
    if args.markdown:
        print("\n| point | part | set | share d <= 3 | share d <= 5 | default @0.02 | greedy_update @0.02 | best seq. | "
              + " | ".join(f"P / ratio: {k.split(':')[0]}" for k in forms) + " |")
        print("|---|---|---|" + "---:|" * (5 + len(forms)))
        for x in pairs:
            c = counts[x.point]
            cells = []
            for pick in forms.values():
                p, e = expected(x, c, *pick(x.setting))
                cells.append(f"{p:.3f} / {e / x.best:.3f}")
            part = "**T**" if x.part == "tuning" else "R"
            print(f"| {x.point} | {part} | {x.setting} | {c['3'] / c['users']:.3f} | {c['5'] / c['users']:.3f} | "
                  f"{x.default:,.1f} | {x.greedy:,.1f} | {x.best:,.1f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
