"""examples/pws_figures.py: its data functions (analytic vs Monte-Carlo of the SQL sanitizers) on a tiny setting."""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "pws_figures.py"


@pytest.fixture(scope="module")
def figures():
    if not SCRIPT.is_file():
        pytest.skip("examples/pws_figures.py is not next to the tests folder")
    spec = importlib.util.spec_from_file_location("pws_figures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["pws_figures"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def within_binomial(count: int, n: int, p: float, z: float = 4.5) -> bool:
    """|count - n p| <= z sd + 1/2 (about 7e-6 two-sided per check at z = 4.5 under the normal approximation)."""
    return abs(count - n * p) <= z * math.sqrt(n * p * (1 - p)) + 0.5


@pytest.mark.parametrize("tau", [None, 0.02])
def test_monte_carlo_matches_analytic_reporting_probabilities(figures, tau):
    n = 1500
    check = figures.reporting_curve(0.1, 0.01, np.arange(1, 80), [1, 8, 16, 24, 32, 48, 70], n, seed=4242, tau=tau)
    for m in ("pws", "sbh"):
        for f, c, p in zip(check.mc_freqs, check.mc_counts[m], check.mc_expected[m]):
            assert within_binomial(int(c), n, float(p)), (m, int(f), int(c), n * float(p))
    # the analytic grid is the library's: pi*_1 = delta without sampling, PWS >= SbH everywhere
    if tau is None:
        assert check.analytic["pws"][0] == pytest.approx(0.01)
        assert check.analytic["sbh"][0] == pytest.approx(0.005)
    assert np.all(check.analytic["pws"] >= check.analytic["sbh"] - 1e-12)
    # and the simulation sees the gap: at frequency 16 PWS reports far more keys than SbH
    k = list(check.mc_freqs).index(16)
    assert check.mc_counts["pws"][k] > 2 * check.mc_counts["sbh"][k] + 50


def test_zipf_fractions_monte_carlo_and_definition(figures):
    freqs = figures.zipf_frequencies(1.0, n_keys=2000, n_elements=20000, seed=7)
    assert freqs.min() >= 1 and freqs.sum() == 20000 and len(freqs) <= 2000
    assert np.array_equal(freqs, figures.zipf_frequencies(1.0, n_keys=2000, n_elements=20000, seed=7))
    sweep = figures.fraction_sweep(freqs, 0.1, [0.01], [None, 0.01], [(0.01, None), (0.01, 0.01)], seed=99)
    n = len(freqs)
    values, counts = np.unique(freqs, return_counts=True)
    for key in [(0.01, None), (0.01, 0.01)]:
        exp = sweep["analytic"][key]
        assert exp["pws"] > exp["sbh"] and exp["q"] >= exp["pws"]
        # reported keys are a sum of independent Bernoullis: variance sum p(1-p) over keys
        probs = figures.analytic_reporting(values, 0.1, 0.01, key[1])
        for m in ("pws", "sbh"):
            var = float(np.dot(counts, probs[m] * (1 - probs[m])))
            got = sweep["mc"][key][m] * n
            assert abs(got - exp[m] * n) <= 4.5 * math.sqrt(var) + 0.5, (key, m, got, exp[m] * n)


def test_script_writes_four_pngs(figures, tmp_path):
    pytest.importorskip("matplotlib")
    assert figures.main([str(tmp_path), "--quick", "--keys-per-frequency", "200"]) == 0
    names = sorted(p.name for p in tmp_path.glob("*.png"))
    assert names == ["pws_fig1_reporting.png", "pws_fig2_zipf_delta.png", "pws_fig3_sampling.png",
                     "pws_fig4_zipf_tau.png"]
    assert all((tmp_path / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in names)
