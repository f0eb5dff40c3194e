"""The private weighted sample ([PWS] Alg. 2-4, sampling and sanitizing fused): the ``weighted_sample`` mechanism.

Mechanism (``dp_weighted_sample``, sql/70_pws/pws.sql). Data: keys ``x`` with frequencies ``w_x >= 1``. A key
of frequency ``i`` is reported with probability ``pi_i`` (keys only, :mod:`dpsql.pws.keys`) or with token
``j in 1..i`` with probability ``pi_{i,j}`` (:mod:`dpsql.pws.tokens`, ``sum_j pi_{i,j} = pi_i``). One
uniform per key from the connection's noise source picks the output: the same law as threshold sampling
with ``q`` followed by sanitizing with ``p = pi / q`` ([PWS] Alg. 2), with the sample's randomness kept
secret (a hash-coordinated sample whose salt is known is not).

Privacy (element level: neighbours differ in one row). The release is a product over keys of independent
outputs whose law depends only on the key's frequency; neighbours change one frequency from ``i-1`` to
``i`` (a new key: ``pi_0 = 0``, absent = not reported). So it is (epsilon, delta)-DP iff for every ``i``
and every set ``J`` of outputs ``P_i(J) <= e^eps P_{i-1}(J) + delta`` and vice versa. Keys only these are
constraints (17), (18) of [PWS] App. A, kept by construction; for tokens the worst ``J`` is
``{j : P_i(j) > e^eps P_{i-1}(j)}``, i.e. ``sum_j (pi_{i,j} - e^eps pi_{i-1,j})_+ <= delta`` (and
symmetric), which the construction keeps ([PWS] Lemma 4.1; checked row by row in the tests). Full
argument: ``docs/proofs/weighted_sample.md``.

Before the charge, :func:`sanitizer_spec` validates every parameter and :func:`check_frequency_range`
refuses a setting whose tables could not serve every frequency, so nothing fails after the charge.
"""
from __future__ import annotations

import math
import threading
from functools import lru_cache
from typing import Optional, cast

import numpy as np

from dpsql.pws.keys import KeyTable, L_value, _first_q_one, key_table
from dpsql.pws.params import MAX_FREQUENCY_ROWS, MAX_KEY_CHECK, MAX_PI_LOOKUP, check_pws_parameters
from dpsql.pws.tokens import FrequencyTable
from dpsql.core.validation import DPParameterError


# Kernel of the sanitizers: "auto" (numba when installed), "numba" or "numpy". For benchmarks and tests; all
# three return the same outputs for the same uniforms.
SANITIZER_KERNELS = ("auto", "numba", "numpy")
SANITIZER_KERNEL = "auto"  # the one the SQL sanitizer uses
_NUMBA_KERNELS: Optional[tuple] = None
_NUMBA_LOCK = threading.Lock()


def _numba_kernels() -> Optional[tuple]:
    """``(keys, tokens)`` compiled once, lazily (importing numba costs a second); None without numba."""
    global _NUMBA_KERNELS
    with _NUMBA_LOCK:
        if _NUMBA_KERNELS is None:
            try:
                import numba
            except ImportError:
                _NUMBA_KERNELS = ()  # remembered: the import is not retried per vector
                return None

            @numba.njit(cache=True, nogil=True)
            def keys(w, u, pi):  # pragma: no cover (compiled)
                # 1 iff u < pi_w; -1 where w is beyond the table (the caller evaluates q there)
                m = len(pi) - 1
                out = np.zeros(len(w), np.int64)
                for k in range(len(w)):
                    x = w[k]
                    if x > m:
                        out[k] = -1
                    elif x > 0 and u[k] < pi[x]:
                        out[k] = 1
                return out

            @numba.njit(cache=True, nogil=True)
            def tokens(w, u, cum, lo, width, m):  # pragma: no cover (compiled)
                # same search as _tokens_numpy: passed = number of cumulative thresholds <= u in row min(w, m)
                P = cum.shape[1]
                out = np.zeros(len(w), np.int64)
                for k in range(len(w)):
                    x = w[k]
                    if x <= 0:
                        continue
                    r = x if x < m else m
                    uk = u[k]
                    if uk < cum[r, 0]:
                        continue
                    a, b = 1, P
                    while a < b:  # first column a >= 1 with cum[r, a] > u (rows non-decreasing, +inf padded)
                        mid = (a + b) >> 1
                        if cum[r, mid] <= uk:
                            a = mid + 1
                        else:
                            b = mid
                    out[k] = lo[r] + (x - r) + min(a - 1, width[r] - 1)
                return out

            _NUMBA_KERNELS = (keys, tokens)
        return _NUMBA_KERNELS or None


def numba_available() -> bool:
    """True when the compiled sanitizer kernels can be used (numba, the ``fast`` extra, is installed)."""
    return _numba_kernels() is not None


def _use_numba(kernel: str) -> bool:
    if kernel not in SANITIZER_KERNELS:
        raise DPParameterError(f"kernel must be one of {', '.join(SANITIZER_KERNELS)} (got {kernel!r})")
    if kernel == "numpy":
        return False
    if _numba_kernels() is None:
        if kernel == "numba":
            raise ImportError("kernel='numba' needs numba: pip install '.[fast]' in dpsql's checkout")
        return False
    return True


def sanitize_keys(freqs, uniforms, table: KeyTable, kernel: str = "auto") -> np.ndarray:
    """Report mask: a key of frequency ``w`` is reported iff ``u < pi_w`` (sampling and Alg. 2 fused).

    One uniform per key: ``P[reported] = pi_w`` exactly (up to the 2^-53 grid of ``u``).
    """
    w = np.asarray(freqs, dtype=np.int64)
    return _report_keys(w, np.asarray(uniforms, dtype=np.float64), table, int(w.max()) if len(w) else 0,
                        kernel).astype(bool)


def _report_keys(w: np.ndarray, u: np.ndarray, table: KeyTable, wmax: int, kernel: str) -> np.ndarray:
    """:func:`sanitize_keys` as int64 0/1 (the UDF's output type); ``wmax = max(w)``."""
    if not _use_numba(kernel):
        return (u < table.reporting(w)).astype(np.int64)
    pi = table.pi if wmax <= table.m else _pi_lookup(table.epsilon, table.delta, table.tau, table.scheme,
                                                      table.power, min(MAX_PI_LOOKUP, 1 << wmax.bit_length()))
    out = cast(tuple, _numba_kernels())[0](w, u, pi)  # not None: _use_numba(kernel) was True
    if wmax >= len(pi):  # pi_w = q_w beyond the lookup array (marked -1 by the kernel)
        beyond = np.nonzero(out < 0)[0]
        out[beyond] = u[beyond] < table.q(w[beyond])
    return out


@lru_cache(maxsize=32)
def _pi_lookup(epsilon: float, delta: float, tau: Optional[float], scheme: str, power: float, n: int) -> np.ndarray:
    """``pi_0..pi_n`` as one array (``q`` evaluated once per frequency, not once per key)."""
    return key_table(epsilon, delta, tau, scheme, power, n=n).reporting(np.arange(n + 1))


def sanitize_tokens(freqs, uniforms, table: FrequencyTable, kernel: str = "auto") -> np.ndarray:
    """Token per key (0 = not reported): ``j`` with probability ``pi_{w,j}`` (inverse CDF of the row).

    One uniform per key: token ``j`` iff ``u`` falls in ``[C_{w,j-1}, C_{w,j})`` of the row's cumulative sums
    (``C_{w,0} = pi_{w,0} = 1 - pi_w``), an interval of length ``pi_{w,j}``. Rows beyond ``m`` are shifts of
    row ``m`` (steady tables only).
    """
    w = np.asarray(freqs, dtype=np.int64)
    return _draw_tokens(w, np.asarray(uniforms, dtype=np.float64), table, int(w.max()) if len(w) else 0, kernel)


def _draw_tokens(w: np.ndarray, u: np.ndarray, table: FrequencyTable, wmax: int, kernel: str) -> np.ndarray:
    """:func:`sanitize_tokens` with ``wmax = max(w)`` known."""
    if wmax > table.m and not table.steady:
        # after the charge: the message must not contain the frequency
        raise DPParameterError(f"a frequency is beyond the pi_(i,j) table (rows 0..{table.m}) at tau={table.keys.tau}, "
                               f"power={table.keys.power}; use a larger tau or report keys only")
    cum, lo_rows, width_rows = table.draw_arrays()
    if _use_numba(kernel):
        return cast(tuple, _numba_kernels())[1](w, u, cum, lo_rows, width_rows, table.m)  # not None: _use_numba
    return _tokens_numpy(w, u, np.clip(w, 0, table.m), cum, lo_rows, width_rows)


def _tokens_numpy(w: np.ndarray, u: np.ndarray, r: np.ndarray, cum: np.ndarray, lo_rows: np.ndarray,
                  width_rows: np.ndarray) -> np.ndarray:
    """The inverse-CDF search of :func:`sanitize_tokens` in numpy (kernel without numba)."""
    # passed = number of cumulative thresholds <= u in row r. The rows are non-decreasing (+inf padded to a
    # power-of-two width P), so a branch-free binary search over the flat array finds it in log2(P) gathers.
    # Most keys are not reported (u < pi_{w,0} = cum[r, 0]): search only the others.
    flat, P = cum.ravel(), cum.shape[1]
    out = np.zeros(len(w), dtype=np.int64)
    hit = np.nonzero((w > 0) & (flat[r * P] <= u))[0]
    if len(hit) == 0:
        return out
    r, uh, wh = r[hit], u[hit], w[hit]
    base = r * P - 1
    passed = np.ones(len(hit), dtype=np.int64)  # cum[r, 0] <= u
    step = P >> 1
    while step:
        cand = passed + step
        ok = cand <= P
        idx = np.where(ok, base + cand, 0)
        passed = np.where(ok & (flat[idx] <= uh), cand, passed)
        step >>= 1
    out[hit] = lo_rows[r] + (wh - r) + np.minimum(passed - 1, width_rows[r] - 1)
    return out



# Sanitizer parameter sets, validated, by handle (process-wide; a handle is an index into _SPEC_PARAMS).
_SPEC_LOCK = threading.Lock()
_SPEC_HANDLES: dict[tuple, int] = {}
_SPEC_PARAMS: list[tuple] = []


def sanitizer_spec(epsilon, delta, tau, scheme, power, with_frequencies) -> int:
    """The sanitizer's parameters, validated, as a BIGINT handle (see :func:`_spec_params`).

    DuckDB converts every argument vector of an Arrow UDF on each call (2048 rows): a constant string of
    the parameters cost 40% of a no-op UDF call, a BIGINT handle costs almost nothing. Only validated
    parameter sets get a handle, so the sanitizer cannot run with unchecked parameters."""
    epsilon, delta, tau, scheme, power = check_pws_parameters(epsilon, delta, tau, scheme, power)
    if not isinstance(with_frequencies, (bool, np.bool_)):
        raise DPParameterError(f"with_frequencies must be true or false (got {with_frequencies!r})")
    check_frequency_range(epsilon, delta, tau, scheme, power, bool(with_frequencies))
    params = (epsilon, delta, tau, scheme, power, bool(with_frequencies))
    with _SPEC_LOCK:
        handle = _SPEC_HANDLES.get(params)
        if handle is None:
            handle = _SPEC_HANDLES[params] = len(_SPEC_PARAMS)
            _SPEC_PARAMS.append(params)
    return handle


@lru_cache(maxsize=256)
def check_frequency_range(epsilon: float, delta: float, tau: Optional[float], scheme: str, power: float,
                          with_frequencies: bool) -> None:
    """Refuse, from the parameters alone, a setting whose tables cannot serve every frequency up to 2^63.

    Keys only, :func:`key_table` verifies ``pi_i = q_i`` up to q's first 1.0 (``<= MAX_KEY_CHECK``); with
    frequencies, :func:`frequency_table` needs the rows up to ``4 ceil(L) + 8`` past it (``<= MAX_FREQUENCY_ROWS``)
    before they are shifts of each other. Beyond these limits (or when q never reaches 1) the sanitizer would
    fail on a large enough frequency, i.e. depending on the data after the charge; this check fails before it.
    """
    q1: Optional[int]
    if tau is None or (power == 0 and not with_frequencies):
        q1 = 1  # q is constant for i >= 1: key_table checks two rows
    else:
        q1 = _first_q_one(tau, scheme, power)
    if with_frequencies:
        rows = None if q1 is None else q1 + 4 * math.ceil(L_value(epsilon, delta)) + 8
        if rows is None or rows > MAX_FREQUENCY_ROWS:
            raise DPParameterError(
                f"with_frequencies := true at epsilon={epsilon!r}, delta={delta!r}, tau={tau!r}, power={power!r} "
                f"needs pi_(i,j) rows beyond frequency {MAX_FREQUENCY_ROWS} (q_i must reach 1 early enough); use a "
                f"larger tau (or power), a larger epsilon, or report keys only (with_frequencies := false)")
    elif q1 is None or q1 > MAX_KEY_CHECK:
        raise DPParameterError(
            f"tau={tau!r} with power={power!r}: q_i reaches 1 only beyond frequency {MAX_KEY_CHECK}; use a larger tau")


def _spec_params(handle: object) -> tuple:
    """``(eps, delta, tau, scheme, power, with_frequencies)`` of a handle from :func:`sanitizer_spec`."""
    if not isinstance(handle, (int, np.integer)) or isinstance(handle, bool) or not 0 <= handle < len(_SPEC_PARAMS):
        raise DPParameterError(f"unknown sanitizer spec {handle!r}: pass dp__pws_spec(epsilon, delta, tau, scheme, "
                               f"power, with_frequencies)")
    return _SPEC_PARAMS[handle]


def _grown(build, params: tuple, wmax: int):
    """``build(*params, n=...)`` valid up to frequency ``wmax``: ``n`` is rounded up to a power of two so that
    the vectors of one query share a few cached tables (rows ``<= n`` do not depend on ``n``); falls back to
    ``n = wmax`` when the rounded size is refused by a size limit."""
    wmax = max(1, int(wmax))
    n = 1 << (wmax - 1).bit_length()
    if n == wmax:
        return build(*params, n=n)
    try:
        return build(*params, n=n)
    except DPParameterError:
        return build(*params, n=wmax)

