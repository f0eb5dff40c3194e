"""Tight composition of multi-round releases (dpsql.core.accounting), recomputed independently with scipy."""
from __future__ import annotations

import math

import pytest
from scipy import special, stats
from scipy.optimize import brentq, minimize_scalar

from dpsql.core import accounting, calibration


def analytic_gaussian_delta(mu: float, eps: float) -> float:
    """delta(eps) of the Gaussian mechanism with sensitivity/sigma = mu ([BW18] Thm 8, [GDP] Cor. 2.13)."""
    # log space (scipy's log_ndtr): deltas down to 1e-15 keep their relative precision
    la = special.log_ndtr(-eps / mu + mu / 2)
    lb = eps + special.log_ndtr(-eps / mu - mu / 2)
    return math.exp(la) * -math.expm1(lb - la)


def zcdp_delta_continuous(rho: float, eps: float) -> float:
    """[CKS20] Prop. 12 for a rho-zCDP curve, minimised over all orders alpha > 1 (not a grid)."""
    f = lambda a: (a - 1) * (a * rho - eps + math.log1p(-1 / a)) - math.log(a)  # noqa: E731
    return math.exp(minimize_scalar(f, bounds=(1.0001, 1e5), method="bounded", options={"xatol": 1e-10}).fun)


CASES = [(1.0, 1e-5), (3.0, math.exp(-10)), (0.3, 1e-7), (0.01, 1e-10), (20.0, 1e-15)]


@pytest.mark.parametrize("eps, delta", CASES)
@pytest.mark.parametrize("split", [(0.1, 0.9), (0.05, 0.15, 0.8), (0.3, 0.3, 0.4 + 1e-10)])
def test_gaussian_rounds_compose_to_the_target(eps, delta, split):
    sigmas = accounting.gaussian_rounds_sigmas(eps, delta, split)
    total = math.fsum(split)
    # round r gets the share w_r = f_r / sum(f) of mu^2
    mu = accounting.gaussian_mu(sigmas)
    assert [s ** -2 / mu ** 2 for s in sigmas] == pytest.approx([f / total for f in split], rel=1e-12)
    # mu is the root of the analytic curve at delta (to the float margin), recomputed with scipy
    mu_ref = brentq(lambda m: analytic_gaussian_delta(m, eps) - delta, 1e-4, 100, xtol=1e-15, rtol=1e-15)
    assert mu == pytest.approx(mu_ref, rel=1e-7)
    assert mu <= mu_ref * (1 + 1e-12)
    assert accounting.composed_gaussian_sigma(sigmas) == pytest.approx(1 / mu_ref, rel=1e-7)


@pytest.mark.parametrize("eps, delta", CASES)
def test_account_gaussian_rounds_is_within_the_charge(eps, delta):
    sigmas = accounting.gaussian_rounds_sigmas(eps, delta / 2, (0.1, 0.9))
    acc = accounting.account_gaussian_rounds(sigmas, delta / 2, eps, delta)
    import dp_accounting
    from dp_accounting.pld import privacy_loss_mechanism
    assert acc.accountant == accounting.GAUSSIAN
    mu = accounting.gaussian_mu(sigmas)
    assert acc.mechanism_delta == pytest.approx(analytic_gaussian_delta(mu, eps), rel=1e-9)
    # dp-accounting's analytic Gaussian (not in log space: loose at tiny delta) and its exact epsilon
    assert acc.mechanism_delta == pytest.approx(
        privacy_loss_mechanism.GaussianPrivacyLoss(1 / mu).get_delta_for_epsilon(eps), rel=1e-6, abs=1e-17)
    assert acc.epsilon == pytest.approx(dp_accounting.get_epsilon_gaussian(1 / mu, delta / 2), rel=1e-9)
    assert acc.delta == acc.mechanism_delta + delta / 2
    assert acc.delta <= delta and acc.epsilon <= eps
    assert acc.delta == pytest.approx(delta, rel=1e-6) and acc.epsilon == pytest.approx(eps, rel=1e-6)


def test_a_gaussian_round_is_the_zcdp_event_of_its_rho():
    """The top-k accounting replaces a Gaussian step by ZCDpEvent(1/(2 sigma^2)): same Renyi curve."""
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant
    for sigma in (0.7, 3.0, 40.0):
        g = rdp_privacy_accountant.RdpAccountant(orders=accounting.RDP_ORDERS)
        g.compose(dp_accounting.GaussianDpEvent(sigma))
        z = rdp_privacy_accountant.RdpAccountant(orders=accounting.RDP_ORDERS)
        z.compose(dp_accounting.ZCDpEvent(1 / (2 * sigma ** 2)))
        assert g.get_delta(1.0) == pytest.approx(z.get_delta(1.0), rel=1e-9)


@pytest.mark.parametrize("eps, delta", CASES)
def test_zcdp_conversion_is_valid_and_near_optimal(eps, delta):
    rho = accounting.zcdp_budget(eps, delta)
    d = accounting.zcdp_delta(rho, eps)
    assert d <= delta
    # the accountant's conversion is an upper bound on [CKS20] Prop. 12 over all orders, and tight
    assert zcdp_delta_continuous(rho, eps) <= d * (1 + 1e-9)
    assert d <= zcdp_delta_continuous(rho, eps) * 1.01
    # the largest rho: slightly more misses the target
    assert accounting.zcdp_delta(rho * (1 + 1e-6), eps) > delta * (1 - accounting.FLOAT_MARGIN)
    assert accounting.zcdp_epsilon(rho, delta) <= eps * (1 + 1e-9)
    acc = accounting.account_zcdp(rho, delta / 3, eps, delta + delta / 3)
    assert acc.accountant == accounting.ZCDP and acc.delta == pytest.approx(d + delta / 3)


def test_zcdp_conversion_gives_no_guarantee_where_its_arithmetic_fails():
    # exp(-rho * alpha) rounds to 1: dp-accounting raises; 1 is a true (vacuous) bound, basic composition is used
    assert accounting.zcdp_delta(1e-300, 1.0) == 1.0
    assert accounting.zcdp_budget(1e-250, 1e-10) <= 1e-250
