"""Released items of parallel set-union configurations on every shared dataset, both settings.

Issue 17: a parallel method becomes the default once it releases at least as many items as every
sequential method on every dataset, at both settings. This script counts the released items of
named configurations (a method and its options, e.g. a MAD2R split) so they can be compared with
the sequential reference numbers (``SEQUENTIAL_BEST``, means of 5 runs of the best sequential
policy per dataset and setting, measured with ``bench_policy_utility.py``).

Settings: (a) epsilon=1, delta=1e-5, max_items=100; (b) epsilon=3, delta=e^-10, max_items=100
(a configuration may override max_items). The pseudo-method ``sim_sips`` simulates DP-SIPS variants in
numpy (``simulated_sips``: a measurement of a candidate release rule, not a release). Datasets: the Parquet files of the shared data folder
(``DPSQL_SHARED_DATA``, or ``../shared/data`` next to the repository) and ``zipf200k``: the first
200,000 users of ``zipf_data.generate`` (default parameters, 4M rows), generated once into
``--cache``. Runs are interleaved: run i of every configuration uses seed ``1000 + i`` before run
i + 1 of any. ``--users P`` keeps a public pseudo-random P% of the users (a hash of the user id)
for quick runs; the sequential reference numbers are for the full data, so compare subsampled
configurations only with each other.

Findings (2026-11-24, 2 cores shared, load 2-4.5, 3 seeded runs, full data; the table is in the
report of the change that added this script): no configuration of MAD2R or DP-SIPS reaches the
sequential numbers on every dataset -- health tweets at (b) stays at 0.87 of them (DP-SIPS
[0.05, 0.15, 0.8]) and zipf200k at 0.71. MAD2R's [0.2, 0.8] releases at least as many as [0.1, 0.9]
everywhere. max_items = 100 is best or tied for every method and dataset tried ({50, 100, 200, 300}).
The cumulative rule of ``simulated_sips`` (geometric splits, 6 rounds) releases 8-13 % more than
the best per-round DP-SIPS split (AskReddit bigrams: within noise) but still 0.95 of the sequential
number on health tweets (b) and 0.71 on zipf200k. It is now the release method ``sips_cumulative``
(its numbers agree with the simulation); its table is in benchmarks/README.md, "Utility".
Dropping the hopeless items with a bounded boost (``prune``, ``max_boost`` below) and the tilt
(``tilt``, ``tilt_norm``) were simulated next and are now ``sips_cumulative``'s defaults
(``drop_margin``, ``max_boost``, ``tilt``) and the default method; ``sips_cumulative_no_drop`` is the
rule without them.

    python benchmarks/bench_parallel_default.py --runs 3
    python benchmarks/bench_parallel_default.py --datasets tweets,debian --settings a --users 25 \\
        --config 'r10=mad2r:{"split":[0.1,0.9]}' --config 'r30=mad2r:{"split":[0.3,0.7]}'
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_policy import shared_data  # noqa: E402  (the shared datasets' folder: one rule for every benchmark)

FILES = {
    "askreddit_unigrams": "reddit_askreddit_1pct/unigrams.parquet",
    "askreddit_bigrams": "reddit_askreddit_1pct/bigrams.parquet",
    "tweets": "health_news_tweets/tweet_tokens.parquet",
    "debian": "debian_bookworm_descriptions/package_description_tokens.parquet",
}
DATASETS = list(FILES) + ["zipf200k"]
SETTINGS = {"a": (1.0, 1e-5, 100), "b": (3.0, math.exp(-10), 100)}
ZIPF_USERS, ZIPF_ROWS = 200_000, 4_000_000
# Best sequential policy per dataset and setting (means of 5 runs, full data, max_items = 100).
SEQUENTIAL_BEST = {
    ("askreddit_unigrams", "a"): 121, ("askreddit_unigrams", "b"): 368,
    ("askreddit_bigrams", "a"): 15, ("askreddit_bigrams", "b"): 111,
    ("tweets", "a"): 2133, ("tweets", "b"): 6354,
    ("debian", "a"): 3447, ("debian", "b"): 7937,
    ("zipf200k", "a"): 3395, ("zipf200k", "b"): 10228,
}
DEFAULT_CONFIGS = ["mad2r=mad2r:{}", "sips=sips:{}", "sips_cumulative=sips_cumulative:{}",
                   'sips_cumulative_no_drop=sips_cumulative:{"drop_margin": null}']


def dataset_path(name: str, cache: Path) -> Path | None:
    """The Parquet file (user_id, item) of a dataset, None if absent; zipf200k is generated once into ``cache``."""
    if name == "zipf200k":
        out = cache / "zipf200k.parquet"
        if not out.is_file():
            import duckdb

            from zipf_data import generate

            con = duckdb.connect()
            try:
                generate(con, "z", ZIPF_ROWS)
                con.execute(f"COPY (SELECT user_id, item FROM z WHERE user_id < {ZIPF_USERS}) TO '{out}' "
                            "(FORMAT parquet)")
            finally:
                con.close()
        return out
    root = shared_data()
    if root is None or not (root / FILES[name]).is_file():
        return None
    return root / FILES[name]


def parse_config(text: str) -> tuple[str, str, dict]:
    """``label=method:{json options}`` (options may be omitted: ``label=method``)."""
    label, _, rest = text.partition("=")
    method, _, options = rest.partition(":")
    if not label or not method:
        raise SystemExit(f"--config must look like label=method:{{...}} (got {text!r})")
    return label, method, json.loads(options) if options else {}


def _capped_pairs(path: Path, users: float, max_items: int, rng) -> tuple:
    """Dense (user, item) codes of the pairs, each user cut to a random ``max_items`` of its items."""
    import duckdb
    import numpy as np

    keep = "" if users >= 100 else f"WHERE hash(user_id) % 10000 < {int(users * 100)}"
    # sorted: DISTINCT's order depends on the threads, and the seeded cap must not
    con = duckdb.connect()
    try:
        cols = con.execute(f"SELECT DISTINCT user_id, item FROM read_parquet('{path}') {keep} ORDER BY ALL").fetchnumpy()
    finally:
        con.close()
    u = np.unique(cols["user_id"], return_inverse=True)[1].astype(np.int64)
    i = np.unique(cols["item"], return_inverse=True)[1].astype(np.int64)
    order = np.lexsort((rng.random(len(u)), u))
    u, i = u[order], i[order]
    start = np.r_[0, np.flatnonzero(np.diff(u)) + 1]
    rank = np.arange(len(u)) - np.repeat(start, np.diff(np.r_[start, len(u)]))
    return u[rank < max_items], i[rank < max_items]


def simulated_sips(path: Path, users: float, seed: int, options: dict, epsilon: float, delta: float,
                   max_items: int) -> int:
    """Items a DP-SIPS variant would release, simulated in numpy (a measurement, not a release).

    Rounds and calibration as ``dp_set_union_sips`` (Basic on the capped sets minus the items released
    earlier; ``sigma_r`` from ``multi_round_noise``; novel-item delta ``f_r delta/2``). ``rule``:
    ``"round"`` releases when round r's noisy weight ``y_r >= rho_r`` (the macro's rule);
    ``"cumulative"`` releases when the precision-weighted mean of the item's noisy weights so far,
    ``z_r = sum_{k<=r} f_k y_k / F_r`` (``F_r = sum_{k<=r} f_k``, noise ``s/sqrt(F_r)``), reaches
    ``rho_r = gaussian_threshold(s/sqrt(F_r), f_r delta/2, max_items)``. Every item not yet released is
    in every round, so ``z_r`` is a post-processing of the composed Gaussian rounds, and a novel item's
    weight stays ``<= 1/sqrt(t)`` in every round until one passes. ``first`` = m > 0 gives each user's
    weight (``1/sqrt(min(d, m))``) only to its first m items not yet released in one global random
    order of the items (a stand-in for a keyed hash). A user then weights at most m items per round,
    so the thresholds take ``t <= m``: in every round a novel item's weight is ``1/sqrt(t')`` on at
    most ``t' <= m`` novel items, and ``-sum_j log Phi((rho - a_j)/sigma)`` is convex in the weights,
    so a running mean (a convex combination of the rounds' vectors) passes no more often than one
    round's vector would.

    ``prune`` = c > 0 drops, after each round but the last, the items not released whose running mean
    is hopeless, ``z_r/F_r + c s/sqrt(F_r) < rho_R``: they leave the users' sets (each user's weight
    goes to fewer items) and are never released. Which items are dropped depends on their own noise,
    so a novel item's weight is no longer ``<= 1/sqrt(t)``: ``max_boost`` = b caps every weight at
    ``b/sqrt(e_u)``, ``e_u`` = the user's items not released (dropped ones included, so ``e_u >= t``
    for the added user), and the thresholds take ``h(t) = min(1, b/sqrt(t))``: the mean of a novel
    item is ``<= h(t)`` plus its Gaussian noise whatever was dropped, and a union bound over its t
    novel items and the rounds gives the delta (``gaussian_threshold``'s product form differs from the
    union bound's ``delta/t`` by less than 1e-9 relative: a simulation, not a release).
    Without ``max_boost``, ``prune`` takes ``h(t) = 1``. Both may be one number per round
    (``c_r``, ``b_r``); round r's threshold then takes the running mean's bound
    ``sum_{k<=r} f_k min(1, b_k/sqrt(t)) / F_r``.

    ``tilt`` = "z" (with ``kappa``, ``zlo``, ``zhi``) spreads each user's weight unevenly within its
    cap: ``x_uj = min(cap_u, lam_u p_j)`` with ``sum_j x_uj^2 = 1`` (bisection on lam_u), ``cap_u =
    min(1, b/sqrt(e_u))`` and ``p_j = exp(kappa clip((z_j/F_{r-1} - rho_R) / sd_{r-1}, zlo, zhi))``, a
    function of the earlier noisy outputs (kappa < 0: less weight to items already safely above the
    last threshold). Sensitivity and the novelty bound ``min(1, b/sqrt(t))`` are unchanged.
    ``tilt_norm``: ``x_uj = min(cap_u, p_j / sqrt(sum_k p_k^2))`` instead (no bisection; what the
    release method ``sips_cumulative`` does).
    ``novel_fraction`` / ``novel_weights`` (above) set q and the rounds' shares of ``q delta``.
    """
    import numpy as np

    from dpsql.core import accounting, calibration
    from dpsql.union import adaptive

    rng = np.random.default_rng(seed)
    u, i = _capped_pairs(path, users, max_items, rng)
    n_users, n_items = int(u.max()) + 1, int(i.max()) + 1
    split = adaptive.check_split(options.get("split", (0.1, 0.9)), max_rounds=64)
    rule = options.get("rule", "round")
    # novel_fraction: the share of delta for the novel-item events (the macros: 1/2); novel_weights:
    # how those are shared over the rounds (the macros: like the split)
    q = float(options.get("novel_fraction", 0.5))
    shares = options.get("novel_weights", split)
    sigmas = accounting.gaussian_rounds_sigmas(epsilon, (1.0 - q) * delta, split)
    novel = [x / math.fsum(shares) * q * delta for x in shares]
    s = calibration.gaussian_sigma(epsilon, (1.0 - q) * delta)
    n_rounds = len(split)
    first = int(options.get("first", 0))
    prune = options.get("prune")
    boost = options.get("max_boost")
    if (prune is not None or boost is not None) and (first or rule != "cumulative"):
        raise SystemExit("prune/max_boost need rule 'cumulative' and no 'first'")

    def per_round(value, name):  # a number, or one number per round
        if value is None:
            return None
        if isinstance(value, (int, float)):
            return [float(value)] * n_rounds
        if len(value) != n_rounds:
            raise SystemExit(f"{name} needs {n_rounds} entries (got {value!r})")
        return [math.inf if v is None else float(v) for v in value]

    prunes = per_round(prune, "prune")
    boosts = per_round(boost, "max_boost")
    if boosts is None and prunes is not None:
        boosts = [math.inf] * n_rounds
    cums = [math.fsum(split[:r + 1]) for r in range(n_rounds)]
    means = [s / math.sqrt(c) for c in cums]
    if boosts is not None:
        # h_r(t): bound on the running mean of a novel item after round r (a convex combination of
        # the rounds' bounds min(1, b_k / sqrt(t)), each valid whatever was dropped)
        def hbar(r):
            return lambda t: math.fsum(f * min(1.0, b / math.sqrt(t)) for f, b in zip(split[:r + 1], boosts[:r + 1])) / cums[r]
        hs = [hbar(r) for r in range(n_rounds)]
    else:
        hs = [calibration.inv_sqrt] * n_rounds
    mi = min(first, max_items) if first else max_items
    rhos = [calibration.gaussian_threshold(means[r], novel[r], mi, h=hs[r], union_bound=prunes is not None)
            for r in range(n_rounds)]
    if first:  # pairs sorted by user, then by the global order, so a user's rank is a running count
        order = np.lexsort((rng.permutation(n_items)[i], u))
        u, i = u[order], i[order]
        start = np.r_[0, np.flatnonzero(np.diff(u)) + 1]
        seg = np.repeat(start, np.diff(np.r_[start, len(u)]))
    tilt = options.get("tilt")
    kappa = float(options.get("kappa", 1.0))
    zlo, zhi = float(options.get("zlo", -3.0)), float(options.get("zhi", 0.0))
    if tilt is not None and (tilt != "z" or first or rule != "cumulative"):
        raise SystemExit("tilt must be 'z', with rule 'cumulative' and no 'first'")
    released = np.zeros(n_items, bool)
    dropped = np.zeros(n_items, bool)
    z = np.zeros(n_items)
    cumulative = 0.0
    for r, (f, sigma, delta_novel) in enumerate(zip(split, sigmas, novel)):
        kept = ~(released[i] | dropped[i])
        d = np.bincount(u[kept], minlength=n_users)
        if first:
            c = np.cumsum(kept)
            rank = c - np.where(seg > 0, c[seg - 1], 0)  # 1-based rank among the user's kept items
            kept &= rank <= first
            d = np.minimum(d, first)
        x = 1.0 / np.sqrt(np.maximum(d, 1))
        if boosts is not None and math.isfinite(boosts[r]):
            e = np.bincount(u[~released[i]], minlength=n_users)
            x = np.minimum(x, boosts[r] / np.sqrt(np.maximum(e, 1)))
        if tilt is not None:
            # non-uniform weights within the cap: x_uj = min(cap_u, lam_u p_j), sum_j x_uj^2 <= 1,
            # p_j = exp(kappa clip((mean_j - rho_R) / sd, zlo, zhi)) from the earlier noisy outputs
            cap = np.ones(n_users) if boosts is None or not math.isfinite(boosts[r]) else \
                np.minimum(1.0, boosts[r] / np.sqrt(np.maximum(np.bincount(u[~released[i]], minlength=n_users), 1)))
            score = (z / cumulative - rhos[-1]) / means[r - 1] if r > 0 else np.zeros(n_items)
            p = np.exp(kappa * np.clip(score, zlo, zhi))
            uk, ik = u[kept], i[kept]
            pk = p[ik]
            if options.get("tilt_norm"):  # x_uj = min(cap_u, p_j / sqrt(sum_k p_k^2)): the release method's
                norm2 = np.bincount(uk, weights=pk * pk, minlength=n_users)
                xk = np.minimum(cap[uk], pk / np.sqrt(np.maximum(norm2[uk], 1e-300)))
            else:  # water-filling: bisection on log lam per user
                lo = np.full(n_users, -60.0)
                hi = np.full(n_users, 60.0)
                for _ in range(60):
                    mid = 0.5 * (lo + hi)
                    xk = np.minimum(cap[uk], np.exp(mid[uk]) * pk)
                    norm = np.bincount(uk, weights=xk * xk, minlength=n_users)
                    over = norm > 1.0
                    hi = np.where(over, mid, hi)
                    lo = np.where(over, lo, mid)
                xk = np.minimum(cap[uk], np.exp(lo[uk]) * pk)
            w = np.bincount(ik, weights=xk, minlength=n_items)
        else:
            w = np.bincount(i[kept], weights=x[u[kept]], minlength=n_items)
        y = w + rng.standard_normal(n_items) * sigma
        cumulative += f
        z += f * y
        if rule == "cumulative":
            rho = rhos[r]
            new = (z / cumulative >= rho) & ~dropped & ~released
            released |= new
            if prunes is not None and r < n_rounds - 1:
                dropped |= ~released & (z / cumulative + prunes[r] * means[r] < rhos[-1])
        elif rule == "round":
            released |= y >= calibration.gaussian_threshold(sigma, delta_novel, mi)
        else:
            raise SystemExit(f"rule must be 'round' or 'cumulative' (got {rule!r})")
    return int(released.sum())


def released(path: Path, users: float, seed: int, threads: int, method: str, options: dict,
             epsilon: float, delta: float, max_items: int) -> int:
    """Items released by one seeded run of ``method`` on the (subsampled) dataset."""
    import dpsql
    import dpsql.core.registry

    if method == "sim_sips":
        return simulated_sips(path, users, seed, options, epsilon, delta, int(options.get("max_items", max_items)))
    con = dpsql.connect(seed=seed)
    try:
        con.execute(f"SET threads = {threads}")
        keep = "" if users >= 100 else f"WHERE hash(user_id) % 10000 < {int(users * 100)}"
        con.execute(f"CREATE VIEW t AS SELECT user_id, item FROM read_parquet('{path}') {keep}")
        declared = {param.name for param in dpsql.core.registry.set_union_methods()[method].params}
        opts = {"max_items": max_items, **options} if "max_items" in declared else dict(options)
        return dpsql.set_union(con, "t", method, epsilon=epsilon, delta=delta, **opts).num_rows
    finally:
        con.close()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--settings", default="a,b")
    ap.add_argument("--config", action="append", help="label=method:{json options}; repeatable "
                    f"(default: {' '.join(DEFAULT_CONFIGS)})")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--users", type=float, default=100.0, help="percentage of users kept (public hash subsample)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", default=tempfile.gettempdir(), help="folder for the generated zipf200k Parquet file")
    ap.add_argument("--json", help="append one JSON line per (dataset, setting) to this file")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    configs = [parse_config(c) for c in (args.config or DEFAULT_CONFIGS)]
    labels = [label for label, _, _ in configs]
    print(f"load {os.getloadavg()[0]:.1f}; runs {args.runs}; users {args.users:g}%", flush=True)
    print("| dataset | setting | " + " | ".join(labels) + " | sequential best | best / sequential |")
    print("|---|---|" + "---:|" * (len(labels) + 2), flush=True)
    for name in args.datasets.split(","):
        path = dataset_path(name, Path(args.cache))
        if path is None:
            print(f"{name}: absent, skipped", file=sys.stderr)
            continue
        for setting in args.settings.split(","):
            epsilon, delta, max_items = SETTINGS[setting]
            counts: dict[str, list[int]] = {label: [] for label in labels}
            seconds = {label: 0.0 for label in labels}
            load = []
            for run in range(args.runs):
                load.append(os.getloadavg()[0])
                for label, method, options in configs:
                    t0 = time.perf_counter()
                    counts[label].append(released(path, args.users, 1000 + run, args.threads, method, options,
                                                  epsilon, delta, max_items))
                    seconds[label] += time.perf_counter() - t0
            means = {label: statistics.mean(v) for label, v in counts.items()}
            ref = SEQUENTIAL_BEST.get((name, setting)) if args.users >= 100 else None
            best = max(means.values())
            cells = " | ".join(f"{means[label]:,.1f}" for label in labels)
            ratio = f"{best / ref:.3f}" if ref else "-"
            print(f"| {name} | {setting} | {cells} | {ref if ref else '-'} | {ratio} |", flush=True)
            if args.json:
                with open(args.json, "a") as fh:
                    fh.write(json.dumps({"dataset": name, "setting": setting, "users": args.users, "counts": counts,
                                         "seconds": seconds, "load": load, "configs": configs,
                                         "sequential_best": ref}) + "\n")


if __name__ == "__main__":
    main()
