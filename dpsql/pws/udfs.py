"""The PWS family's DuckDB UDFs (the macros of sql/70_pws/pws.sql call them)."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pyarrow as pa
from duckdb.sqltypes import BIGINT, BOOLEAN, DOUBLE, VARCHAR

from dpsql.pws import sanitizer
from dpsql.pws.estimators import _coefficients
from dpsql.pws.keys import L_value, key_table, sampling_probabilities
from dpsql.pws.params import _check_estimator, _check_g, check_power, check_pws_parameters, check_scheme, check_tau
from dpsql.pws.sanitizer import _draw_tokens, _grown, _report_keys, _spec_params, sanitizer_spec
from dpsql.pws.sbh import sbh_granularity, sbh_noisy_values, sbh_threshold
from dpsql.pws.tokens import frequency_table
from dpsql.core.udf import Udf, scalar
from dpsql.core.validation import DPParameterError


def _const(arr: pa.Array, name: str):
    """The (constant) value of a parameter column; parameters are per-call constants in the macros."""
    return arr[0].as_py() if len(arr) else None


def _params(eps, delta, tau, scheme, power):
    return _checked_params(_const(eps, "epsilon"), _const(delta, "delta"), _const(tau, "tau"),
                           _const(scheme, "scheme"), _const(power, "power"))


@lru_cache(maxsize=256)
def _checked_params(epsilon, delta, tau, scheme, power):
    """check_pws_parameters, memoised: the sanitizer UDF sees the same constants in every vector."""
    return check_pws_parameters(epsilon, delta, tau, scheme, power)




def _freqs(arr: pa.Array, name: str = "frequency") -> np.ndarray:
    if arr.null_count:
        raise DPParameterError(f"{name} must not be NULL")
    return arr.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def udfs(source) -> list[Udf]:
    """PWS UDFs. Pure: probability tables, estimates, checks. Side effects: the sanitizers (uniforms from ``source``)."""

    def check(epsilon, delta, tau, scheme, power):
        check_pws_parameters(epsilon, delta, tau, scheme, power)
        return True

    def check_estimate(g, estimator):
        _check_g(g)
        _check_estimator(estimator)
        return True

    def check_sampling(tau, scheme, power):
        if tau is None:
            raise DPParameterError("tau must be a finite number > 0 (the sampling threshold), got NULL")
        check_tau(tau), check_scheme(scheme), check_power(power)
        return True

    def q_udf(freq, tau, scheme, power):
        t, s, p = check_tau(_const(tau, "tau")), check_scheme(_const(scheme, "scheme")), check_power(_const(power, "power"))
        if freq.null_count:
            raise DPParameterError("frequency must not be NULL")
        w = freq.to_numpy(zero_copy_only=False).astype(np.float64)
        return pa.array(sampling_probabilities(w, t, s, p), type=pa.float64())

    def pi_udf(freq, eps, delta, tau, scheme, power):
        w = _freqs(freq)
        table = key_table(*_params(eps, delta, tau, scheme, power), n=int(w.max()) if len(w) else 1)
        return pa.array(table.reporting(w), type=pa.float64())

    def pi_ij_udf(freq, token, eps, delta, tau, scheme, power):
        w, j = _freqs(freq), _freqs(token, "token")
        table = frequency_table(*_params(eps, delta, tau, scheme, power), n=max(1, int(w.max()) if len(w) else 1))
        return pa.array([table.entry(int(a), int(b)) if 0 <= b <= a else 0.0 for a, b in zip(w, j)],
                        type=pa.float64())

    def spec_udf(epsilon, delta, tau, scheme, power, with_frequencies):
        return sanitizer_spec(epsilon, delta, tau, scheme, power, with_frequencies)

    def sbh_granularity_udf(epsilon, delta, tau, scheme, power, noise, granularity):
        return sbh_granularity(epsilon, delta, tau, scheme, power, noise, granularity)

    def sanitize_udf(freq, spec):
        """One uniform per key. Keys only: 1 = reported, 0 = not; with frequencies: the token (0 = not reported).

        ``spec`` is the handle of the validated parameters (:func:`sanitizer_spec`): DuckDB converts every
        argument vector of an Arrow UDF per call, and six constant columns cost 4x the sanitizer itself. The
        tables depend only on the public parameters and are valid up to the vector's largest frequency (no
        data-dependent state crosses vectors)."""
        w = _freqs(freq)
        *spec_params, with_frequencies = _spec_params(_const(spec, "spec"))
        params = tuple(spec_params)
        wmax = int(w.max()) if len(w) else 1
        u = source.uniform(len(w))
        if with_frequencies:
            out = _draw_tokens(w, u, _grown(frequency_table, params, wmax), wmax, sanitizer.SANITIZER_KERNEL)
        else:
            out = _report_keys(w, u, _grown(key_table, params, wmax), wmax, sanitizer.SANITIZER_KERNEL)
        return pa.array(out, type=pa.int64())

    def estimate_udf(token, eps, delta, tau, scheme, power, g, estimator):
        j = token.to_numpy(zero_copy_only=False) if token.null_count == 0 else None
        if j is None:
            raise DPParameterError("token is NULL: estimates need a sample drawn with with_frequencies := true")
        coeffs = _coefficients(*_params(eps, delta, tau, scheme, power), _check_g(_const(g, "g")),
                               _check_estimator(_const(estimator, "estimator")), int(j.max()) if len(j) else 0)
        j = j.astype(np.int64)
        if len(j) and j.min() < 0:
            raise DPParameterError("token must be >= 0")
        return pa.array(coeffs[j], type=pa.float64())

    def sbh_noisy_udf(freq, noise, granularity):
        g = _const(granularity, "granularity")
        return pa.array(sbh_noisy_values(_freqs(freq), noise.to_numpy(zero_copy_only=False), g), type=pa.float64())

    def bernoulli_udf(p):
        pr = p.to_numpy(zero_copy_only=False).astype(np.float64)
        return pa.array(source.uniform(len(pr)) < pr, type=pa.bool_())

    d, v, b = DOUBLE, VARCHAR, BIGINT
    return [
        Udf("dp__pws_check", scalar(check), (d, d, d, v, d), BOOLEAN),
        Udf("dp__pws_check_estimate", scalar(check_estimate), (v, v), BOOLEAN),
        Udf("dp__pws_check_sampling", scalar(check_sampling), (d, v, d), BOOLEAN),
        Udf("dp__pws_L", scalar(L_value), (d, d), d),
        Udf("dp__sbh_threshold", scalar(sbh_threshold), (d, d), d),
        Udf("dp__sbh_granularity", scalar(sbh_granularity_udf), (d, d, d, v, d, v, d), d),
        Udf("dp__sbh_noisy", sbh_noisy_udf, (b, d, d), d),
        Udf("dp__pws_q", q_udf, (d, d, v, d), d),
        Udf("dp__pws_pi", pi_udf, (b, d, d, d, v, d), d),
        Udf("dp__pws_pi_ij", pi_ij_udf, (b, b, d, d, d, v, d), d),
        Udf("dp__pws_estimate", estimate_udf, (b, d, d, d, v, d, v, v), d),
        Udf("dp__pws_spec", scalar(spec_udf), (d, d, d, v, d, BOOLEAN), b),
        Udf("dp__pws_sanitize", sanitize_udf, (b, b), b, side_effects=True),
        Udf("dp__bernoulli", bernoulli_udf, (d,), BOOLEAN, side_effects=True),
    ]

