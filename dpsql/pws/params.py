"""PWS parameters: the sampling schemes, estimators and table-size limits, and their checks.

Every check raises :class:`~dpsql.core.errors.ParameterError` naming the parameter and the fix; all run
before a table is read or the budget charged.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Union

import numpy as np

from dpsql.core.validation import DPParameterError, check_delta, check_epsilon, check_positive

# Sanitizing with tokens needs the pi_{i,j} rows up to the largest frequency before the rows
# become shifts of each other; beyond these limits the call is refused rather than exhausting memory.
MAX_FREQUENCY_ROWS = 2_000_000
MAX_FREQUENCY_CELLS = 60_000_000
MAX_KEY_CHECK = 200_000_000
# Keys only: pi_w is looked up in one array up to this frequency (8 MB); beyond it q_w is evaluated per key.
MAX_PI_LOOKUP = 1 << 20
# The exact unbiased solve grows its numbers by ~53 bits per token (its time: benchmarks/README.md) and
# its coefficients grow geometrically (1e44 by token 200 at (0.5, 1e-3)): beyond this the estimator is useless.
MAX_UNBIASED_TOKEN = 300

SCHEMES = ("ppswor", "priority")
GS = ("count", "identity")
ESTIMATORS = ("ml", "biased_down", "unbiased")


def check_scheme(scheme: object) -> str:
    if not isinstance(scheme, str) or scheme.lower() not in SCHEMES:
        raise DPParameterError(f"scheme must be one of {', '.join(SCHEMES)} (got {scheme!r})")
    return scheme.lower()


def check_tau(tau: object) -> Optional[float]:
    """tau: None/NULL (no sampling: q = 1) or a finite number > 0."""
    if tau is None:
        return None
    if isinstance(tau, float) and math.isnan(tau):
        raise DPParameterError("tau must be a finite number > 0 or NULL for no sampling (got nan)")
    try:
        return check_positive("tau", tau)
    except DPParameterError:
        raise DPParameterError(
            f"tau must be a finite number > 0 (the sampling threshold), or NULL for no sampling "
            f"(got {tau!r})") from None


def check_power(power: object) -> float:
    if power is None or isinstance(power, bool) or not isinstance(power, (int, float, np.floating, np.integer)) \
            or not math.isfinite(float(power)) or float(power) < 0:
        raise DPParameterError(f"power must be a finite number >= 0 (sampling weight f(i) = i^power), got {power!r}")
    return float(power)


# The probability tables evaluate e^epsilon, which overflows a double above ~709.
EPSILON_MAX = 700.0


def check_pws_epsilon(epsilon: object) -> float:
    """epsilon of a PWS mechanism: finite, > 0 and <= 700 (see :data:`EPSILON_MAX`)."""
    return check_epsilon(epsilon, maximum=EPSILON_MAX)


def check_pws_parameters(epsilon: object, delta: object, tau: object = None, scheme: object = "ppswor",
                         power: object = 1.0) -> tuple[float, float, Optional[float], str, float]:
    """Validated ``(epsilon, delta, tau, scheme, power)`` (tau None = no sampling)."""
    return (check_pws_epsilon(epsilon), check_delta(delta), check_tau(tau), check_scheme(scheme),
            check_power(power))


def _check_g(g: object) -> str:
    if not isinstance(g, str) or g.lower() not in GS:
        raise DPParameterError(f"g must be one of {', '.join(GS)} (got {g!r})")
    return g.lower()


def _check_estimator(estimator: object) -> str:
    if not isinstance(estimator, str) or estimator.lower() not in ESTIMATORS:
        raise DPParameterError(f"estimator must be one of {', '.join(ESTIMATORS)} (got {estimator!r})")
    return estimator.lower()


def _g_fn(g: Union[str, Callable[[int], float]]) -> Callable[[int], float]:
    if callable(g):
        return g
    return (lambda i: 1 if i >= 1 else 0) if _check_g(g) == "count" else (lambda i: i)

