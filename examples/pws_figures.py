"""Reproduce the shapes of Figures 1-4 of Cohen et al., "Differentially Private Weighted Sampling" (PWS).

    python examples/pws_figures.py [OUTDIR] [--seed N] [--keys-per-frequency K] [--quick]

Writes pws_fig1_reporting.png, pws_fig2_zipf_delta.png, pws_fig3_sampling.png and pws_fig4_zipf_tau.png
into OUTDIR (default: the current directory). Every panel shows the ANALYTIC curves from :mod:`dpsql.pws`
(PWS: ``pi_i`` of Alg. 3, ``pi*_i`` without sampling; SbH: ``phi_i``, App. E eqs. 41/43) as lines and a
MONTE-CARLO CHECK as markers: the actual sanitizers (the SQL macros ``dp_weighted_sample`` and
``dp_sbh_histogram``) run on simulated keys on a SEEDED connection ``dpsql.connect(seed=N)``. Seeded runs are
reproducible and therefore NOT private; they only check that the sanitizer's output frequencies follow
the analytic probabilities. Privacy unit of every mechanism here: one element (not one user).
``dp_sbh_histogram`` adds granular noise (discrete Laplace on a grid of about scale/2^16, threshold on that
grid; the paper's floating-point Laplace leaks through its low bits): without sampling its reporting
probability differs from the continuous ``phi_i`` by at most 4.4e-6 at the settings of Figures 1 and 3.

Figures (settings of the paper, Sec. 6.2-6.3):

1. Reporting probability per frequency, PWS (``pi*_i``) vs SbH (``phi_i``), no sampling, at
   (eps, delta) = (0.1, 0.01) and (0.01, 1e-6).
2. Expected fraction of keys reported by PWS and SbH on Zipf[alpha] data, alpha = 1, 2, eps = 0.1, delta
   swept from 0.9 down to 1e-8 (dpsql refuses delta >= 1; the paper's delta = 1 point is the limit where
   PWS reports every key), and the ratio PWS / SbH.
3. Reporting probability per frequency with ppswor sampling (q, PWS ``pi_i``, sampled-SbH), eps = 0.1,
   delta = 0.001, several thresholds tau.
4. Fraction of keys reported vs tau (threshold ppswor q, sampled-SbH, PWS) on Zipf[alpha], alpha = 0.5, 1,
   2, eps = 0.1, delta = 0.001, with the gain PWS / sampled-SbH - 1.

DEFINITION of Zipf[alpha] (the paper leaves it undefined): a dataset of ``m`` elements whose keys are drawn
i.i.d. from a Zipf law over ``n`` keys, ``P(rank r) = r^-alpha / H(n, alpha)``, r = 1..n; the frequency of a
key is its number of elements and keys that receive no element do not exist (sparse histogram). Defaults
n = 100,000 keys and m = 1,000,000 elements (10 per key on average), drawn once with numpy (seed 2026;
data simulation, not noise). Rank-frequency is the reading consistent with the paper's ordering of gains
(largest for alpha = 0.5): a small alpha puts almost all keys at low-to-medium frequencies, where PWS gains
most, a large alpha gives a heavy frequency tail of always-reported keys. Results are qualitative only.

Needs matplotlib (pip install ".[plot]" in the checkout).
"""
from __future__ import annotations

import argparse
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pyarrow as pa

import dpsql
from dpsql import pws

FIG1_SETTINGS = ((0.1, 0.01), (0.01, 1e-6))
FIG2_DELTAS = (0.9, 0.5, 0.2, 0.1, 0.03, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8)
FIG3_TAUS = (0.1, 0.01, 0.001)
FIG4_TAUS = tuple(float(t) for t in np.logspace(-4, 1, 21))
FIG4_MC_TAUS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)
ZIPF_KEYS, ZIPF_ELEMENTS, ZIPF_SEED = 100_000, 1_000_000, 2026


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------


def zipf_frequencies(alpha: float, n_keys: int = ZIPF_KEYS, n_elements: int = ZIPF_ELEMENTS,
                     seed: int = ZIPF_SEED) -> np.ndarray:
    """Frequencies (>= 1) of the keys of a Zipf[alpha] dataset (see the module docstring), by rank."""
    p = np.arange(1, n_keys + 1, dtype=np.float64) ** -float(alpha)
    counts = np.random.default_rng(seed).multinomial(n_elements, p / p.sum())
    return counts[counts > 0].astype(np.int64)


def seeded_connection(seed: int):
    """A reproducible (NOT private) connection; the warning saying so is expected here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return dpsql.connect(seed=seed)


def load_keys(con, freqs: np.ndarray, name: str = "pws_keys") -> None:
    """Table ``name(key BIGINT, frequency BIGINT)``: one row per key (aggregated input)."""
    staged = pa.table({"key": pa.array(np.arange(len(freqs)), pa.int64()),  # noqa: F841 (read by DuckDB)
                       "frequency": pa.array(np.asarray(freqs, dtype=np.int64), pa.int64())})
    con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT key, frequency FROM staged")


def _tau_sql(tau: Optional[float]) -> str:
    return "NULL" if tau is None else repr(float(tau))


def reported_by_frequency(con, epsilon: float, delta: float, tau: Optional[float] = None,
                          name: str = "pws_keys") -> dict[str, dict[int, int]]:
    """Run both sanitizers once on table ``name``; per method, frequency -> number of keys reported."""
    out = {}
    queries = {
        "pws": f"dp_weighted_sample('{name}', {epsilon!r}, {delta!r}, tau := {_tau_sql(tau)}, freq_col := 'frequency')",
        "sbh": f"dp_sbh_histogram('{name}', {epsilon!r}, {delta!r}, tau := {_tau_sql(tau)}, freq_col := 'frequency')",
    }
    for method, macro in queries.items():
        rows = con.execute(f"SELECT k.frequency, count(*) FROM {macro} s JOIN {name} k USING (key) "
                           f"GROUP BY k.frequency").fetchall()
        out[method] = {int(f): int(c) for f, c in rows}
    return out


def analytic_reporting(freqs, epsilon: float, delta: float, tau: Optional[float] = None) -> dict[str, np.ndarray]:
    """Per frequency: ``q`` (sampling), ``pws`` (pi_i, Alg. 3), ``sbh`` (phi_i of (sampled-)SbH, ppswor)."""
    w = np.asarray(freqs, dtype=np.int64)
    n = int(w.max()) if len(w) else 1
    return {"q": pws.sampling_probabilities(w, tau, "ppswor"),
            "pws": pws.key_table(epsilon, delta, tau, "ppswor", 1.0, n=n).reporting(w),
            "sbh": pws.sbh_report_probability(w, epsilon, delta, tau, "ppswor")}


def expected_fractions(freqs: np.ndarray, epsilon: float, delta: float,
                       tau: Optional[float] = None) -> dict[str, float]:
    """Expected fraction of the keys reported (q, PWS, SbH) for keys with frequencies ``freqs``."""
    values, counts = np.unique(np.asarray(freqs, dtype=np.int64), return_counts=True)
    probs = analytic_reporting(values, epsilon, delta, tau)
    return {k: float(np.dot(v, counts) / counts.sum()) for k, v in probs.items()}


@dataclass
class CurveCheck:
    """Analytic reporting probability per frequency, and Monte-Carlo counts at some frequencies."""

    epsilon: float
    delta: float
    tau: Optional[float]
    freqs: np.ndarray          # analytic grid
    analytic: dict             # method -> probabilities on ``freqs``
    mc_freqs: np.ndarray       # frequencies simulated
    keys_per_frequency: int
    mc_counts: dict            # method -> reported keys per ``mc_freqs``
    mc_expected: dict          # method -> analytic probabilities on ``mc_freqs``


def reporting_curve(epsilon: float, delta: float, freqs: Sequence[int], mc_freqs: Sequence[int],
                    keys_per_frequency: int, seed: int, tau: Optional[float] = None) -> CurveCheck:
    """Analytic pi_i / phi_i on ``freqs``; ``keys_per_frequency`` simulated keys at each of ``mc_freqs``."""
    grid = np.asarray(freqs, dtype=np.int64)
    mc = np.asarray(mc_freqs, dtype=np.int64)
    con = seeded_connection(seed)
    try:
        load_keys(con, np.repeat(mc, keys_per_frequency))
        got = reported_by_frequency(con, epsilon, delta, tau)
    finally:
        con.close()
    return CurveCheck(epsilon, delta, tau, grid, analytic_reporting(grid, epsilon, delta, tau), mc,
                      keys_per_frequency, {m: np.array([got[m].get(int(f), 0) for f in mc]) for m in got},
                      analytic_reporting(mc, epsilon, delta, tau))


def fraction_sweep(freqs: np.ndarray, epsilon: float, deltas: Sequence[float], taus: Sequence[Optional[float]],
                   mc_points: Sequence[tuple[float, Optional[float]]], seed: int) -> dict:
    """Expected fractions on every (delta, tau) of ``deltas x taus``; Monte-Carlo fractions on ``mc_points``."""
    analytic = {(d, t): expected_fractions(freqs, epsilon, d, t) for d in deltas for t in taus}
    mc = {}
    if mc_points:
        con = seeded_connection(seed)
        try:
            load_keys(con, freqs)
            for d, t in mc_points:
                got = reported_by_frequency(con, epsilon, d, t)
                mc[(d, t)] = {m: sum(c.values()) / len(freqs) for m, c in got.items()}
        finally:
            con.close()
    return {"n_keys": len(freqs), "analytic": analytic, "mc": mc}


# ---------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------

COLORS = {"pws": "tab:blue", "sbh": "tab:orange", "q": "tab:gray"}
LABELS = {"pws": "PWS (Opt)", "sbh": "SbH", "q": "ppswor q (non-private)"}
MC_NOTE = "markers: Monte-Carlo of the SQL sanitizers (seeded: reproducible, NOT private)"


def _curve_axes(ax, check: CurveCheck, methods=("pws", "sbh"), logx=False):
    for m in methods:
        lab = LABELS[m] if check.tau is None or m != "sbh" else "sampled-SbH"
        ax.plot(check.freqs, check.analytic[m], color=COLORS[m], label=f"{lab} (analytic)")
        if m in check.mc_counts:
            ax.plot(check.mc_freqs, check.mc_counts[m] / check.keys_per_frequency, "o", ms=4, mfc="none",
                    color=COLORS[m], label=f"{lab} (Monte-Carlo)")
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel("frequency i")
    ax.set_ylabel("reporting probability")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)


def figure1(plt, outdir: Path, checks: list[CurveCheck]) -> Path:
    fig, axes = plt.subplots(1, len(checks), figsize=(6 * len(checks), 4.4))
    for ax, c in zip(np.atleast_1d(axes), checks):
        _curve_axes(ax, c)
        ax.set_title(f"eps={c.epsilon:g}, delta={c.delta:g} (no sampling)")
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"Fig. 1: key reporting probability per frequency, PWS pi*_i vs SbH phi_i\n{MC_NOTE}", fontsize=10)
    fig.tight_layout()
    path = outdir / "pws_fig1_reporting.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def figure2(plt, outdir: Path, sweeps: dict, epsilon: float, deltas: Sequence[float]) -> Path:
    fig, (ax_r, ax_f) = plt.subplots(1, 2, figsize=(12, 4.4))
    for alpha, s in sweeps.items():
        pw = np.array([s["analytic"][(d, None)]["pws"] for d in deltas])
        sb = np.array([s["analytic"][(d, None)]["sbh"] for d in deltas])
        line, = ax_f.plot(deltas, pw, "-", label=f"PWS, alpha={alpha:g} ({s['n_keys']:,} keys)")
        ax_f.plot(deltas, sb, "--", color=line.get_color(), label=f"SbH, alpha={alpha:g}")
        ax_r.plot(deltas, pw / sb, "-", color=line.get_color(), label=f"alpha={alpha:g} (analytic)")
        mc_d = [d for d in deltas if (d, None) in s["mc"]]
        if mc_d:
            mp = np.array([s["mc"][(d, None)]["pws"] for d in mc_d])
            ms = np.array([s["mc"][(d, None)]["sbh"] for d in mc_d])
            ax_f.plot(mc_d, mp, "o", mfc="none", ms=5, color=line.get_color())
            ax_f.plot(mc_d, ms, "s", mfc="none", ms=5, color=line.get_color())
            ax_r.plot(mc_d, mp / np.maximum(ms, 1e-12), "o", mfc="none", ms=5, color=line.get_color(),
                      label=f"alpha={alpha:g} (Monte-Carlo)")
    for ax in (ax_r, ax_f):
        ax.set_xscale("log")
        ax.invert_xaxis()
        ax.set_xlabel("delta")
        ax.grid(alpha=0.3, which="both")
    ax_r.set_ylabel("PWS / SbH (keys reported)")
    ax_r.set_title("ratio PWS / SbH")
    ax_r.legend(fontsize=8)
    ax_f.set_yscale("log")
    ax_f.set_ylabel("fraction of keys reported")
    ax_f.set_title("expected fraction reported (o PWS, s SbH: Monte-Carlo)")
    ax_f.legend(fontsize=8, loc="lower left")
    fig.suptitle(f"Fig. 2: Zipf[alpha] keys, eps={epsilon:g}, no sampling, delta swept\n{MC_NOTE}", fontsize=10)
    fig.tight_layout()
    path = outdir / "pws_fig2_zipf_delta.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def figure3(plt, outdir: Path, checks: list[CurveCheck]) -> Path:
    fig, axes = plt.subplots(1, len(checks), figsize=(5.2 * len(checks), 4.4))
    for ax, c in zip(np.atleast_1d(axes), checks):
        _curve_axes(ax, c, methods=("q", "pws", "sbh"), logx=True)
        ax.set_title(f"ppswor tau={c.tau:g}, eps={c.epsilon:g}, delta={c.delta:g}")
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"Fig. 3: reporting probability per frequency with sampling\n{MC_NOTE}", fontsize=10)
    fig.tight_layout()
    path = outdir / "pws_fig3_sampling.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def figure4(plt, outdir: Path, sweeps: dict, epsilon: float, delta: float, taus: Sequence[float]) -> Path:
    fig, axes = plt.subplots(1, len(sweeps), figsize=(5.2 * len(sweeps), 4.4))
    for ax, (alpha, s) in zip(np.atleast_1d(axes), sweeps.items()):
        curves = {m: np.array([s["analytic"][(delta, t)][m] for t in taus]) for m in ("q", "pws", "sbh")}
        for m, y in curves.items():
            ax.plot(taus, y, color=COLORS[m], label=("sampled-SbH" if m == "sbh" else LABELS[m]) + " (analytic)")
        mc_t = sorted(t for (d, t) in s["mc"] if d == delta)
        for m in ("pws", "sbh"):
            ax.plot(mc_t, [s["mc"][(delta, t)][m] for t in mc_t], "o", mfc="none", ms=5, color=COLORS[m])
        gain = curves["pws"] / curves["sbh"] - 1
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("ppswor threshold tau")
        ax.set_ylabel("fraction of keys reported")
        ax.set_title(f"Zipf[{alpha:g}] ({s['n_keys']:,} keys): gain PWS/SbH-1 in "
                     f"[{100 * gain.min():.0f}%, {100 * gain.max():.0f}%]", fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"Fig. 4: fraction of keys reported vs sampling threshold, eps={epsilon:g}, delta={delta:g}\n"
                 f"{MC_NOTE}", fontsize=10)
    fig.tight_layout()
    path = outdir / "pws_fig4_zipf_tau.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def compute_all(seed: int, keys_per_frequency: int, quick: bool) -> dict:
    """All figure data (analytic and Monte-Carlo). ``quick``: fewer points and a smaller Zipf dataset."""
    n_keys, n_elements = (5_000, 50_000) if quick else (ZIPF_KEYS, ZIPF_ELEMENTS)
    fig1 = []
    for eps, delta in FIG1_SETTINGS:
        top = int(2 * pws.L_value(eps, delta)) + 1  # pi* reaches 1 at 2L+1; SbH much later
        imax = int(1.15 * max(top, pws.sbh_threshold(eps, delta) + np.log(1 / (2 * delta)) / eps))
        mc = np.unique(np.linspace(1, imax, 8 if quick else 16).round().astype(np.int64))
        fig1.append(reporting_curve(eps, delta, np.arange(1, imax + 1), mc, keys_per_frequency, seed))
    fig3 = []
    for tau in FIG3_TAUS:
        grid = np.unique(np.logspace(0, np.log10(60 / tau), 400).round().astype(np.int64))
        mc = np.unique(np.logspace(0, np.log10(30 / tau), 8 if quick else 14).round().astype(np.int64))
        fig3.append(reporting_curve(0.1, 0.001, grid, mc, keys_per_frequency, seed + 1, tau))
    deltas = FIG2_DELTAS[::3] if quick else FIG2_DELTAS
    fig2 = {a: fraction_sweep(zipf_frequencies(a, n_keys, n_elements), 0.1, deltas, [None],
                              [(d, None) for d in deltas], seed + 2) for a in (1.0, 2.0)}
    taus = FIG4_TAUS[::4] if quick else FIG4_TAUS
    mc_taus = FIG4_MC_TAUS[::2] if quick else FIG4_MC_TAUS
    fig4 = {a: fraction_sweep(zipf_frequencies(a, n_keys, n_elements), 0.1, [0.001], taus,
                              [(0.001, t) for t in mc_taus], seed + 3) for a in (0.5, 1.0, 2.0)}
    return {"fig1": fig1, "fig2": fig2, "deltas": deltas, "fig3": fig3, "fig4": fig4, "taus": taus}


def summary(data: dict) -> list[str]:
    """The numbers to compare with the paper's claims."""
    lines = []
    for c in data["fig1"]:
        L = pws.L_value(c.epsilon, c.delta)
        first_pws = int(c.freqs[np.argmax(c.analytic["pws"] >= 1.0)])
        first_sbh = int(c.freqs[np.argmax(c.analytic["sbh"] >= 1 - c.delta)]) if (c.analytic["sbh"] >= 1 - c.delta).any() else None
        low = c.freqs <= L
        ratio = c.analytic["pws"][low] / c.analytic["sbh"][low]
        lines.append(f"fig1 eps={c.epsilon:g} delta={c.delta:g}: pi* = 1 from i={first_pws} (2L+1={2 * L + 1:.1f}); "
                     f"phi >= 1-delta from i={first_sbh}; pi*/phi on i<=L in [{ratio.min():.2f}, {ratio.max():.2f}]")
    for alpha, s in data["fig2"].items():
        r = [s["analytic"][(d, None)]["pws"] / s["analytic"][(d, None)]["sbh"] for d in data["deltas"]]
        lines.append(f"fig2 alpha={alpha:g}: PWS/SbH - 1 over delta in [{data['deltas'][-1]:g}, {data['deltas'][0]:g}]: "
                     + ", ".join(f"{d:g}:{100 * (x - 1):.0f}%" for d, x in zip(data["deltas"], r)))
    for alpha, s in data["fig4"].items():
        g = [s["analytic"][(0.001, t)]["pws"] / s["analytic"][(0.001, t)]["sbh"] - 1 for t in data["taus"]]
        lines.append(f"fig4 alpha={alpha:g}: gain PWS/sampled-SbH - 1 min {100 * min(g):.0f}% max {100 * max(g):.0f}% "
                     f"(tau {data['taus'][0]:g}..{data['taus'][-1]:g})")
    return lines


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", nargs="?", default=".", help="folder for the PNG files (default: .)")
    parser.add_argument("--seed", type=int, default=20261122, help="seed of the Monte-Carlo connections")
    parser.add_argument("--keys-per-frequency", type=int, default=2000,
                        help="simulated keys per frequency in Figs. 1 and 3 (default 2000)")
    parser.add_argument("--quick", action="store_true", help="fewer points and a 5,000-key Zipf dataset")
    args = parser.parse_args(argv)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("This example needs matplotlib: pip install \".[plot]\" in dpsql's checkout", file=sys.stderr)
        return 1
    outdir = Path(args.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    data = compute_all(args.seed, args.keys_per_frequency, args.quick)
    paths = [figure1(plt, outdir, data["fig1"]), figure2(plt, outdir, data["fig2"], 0.1, data["deltas"]),
             figure3(plt, outdir, data["fig3"]), figure4(plt, outdir, data["fig4"], 0.1, 0.001, data["taus"])]
    for line in summary(data):
        print(line)
    for p in paths:
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
