"""Noise sources and the vectorised noise UDFs.

Privacy argument: every noise value a mechanism adds must be fresh and
unpredictable to whoever runs SQL on the connection. Therefore

* noise is never drawn with SQL ``random()`` (any SQL user can ``setseed()``
  it); it comes from a :class:`NoiseSource` wrapping a numpy ``Generator`` on
  the ChaCha20 stream cipher (``randomgen.ChaCha``, 20 rounds) keyed with 256
  bits from the OS CSPRNG. Its output is computationally indistinguishable from
  uniform bits, so the values a release reveals (e.g. which items passed a
  threshold) do not help predict any other draw. A statistical generator such
  as numpy's Philox makes no such claim;
* the per-query secret salts (``dp__secret_salt()``, the hash keys of the
  contribution cap and of the sampling macros) come straight from the OS
  CSPRNG (:mod:`secrets`), not from the noise stream. ``dp__secret_salt()`` is
  callable from SQL, so a user can read salts: each call returns a fresh,
  independent 64-bit value, the one a macro uses is drawn inside that macro's
  query and never leaves it, and so reading salts tells nothing about another
  query's salt or about the noise;
* there is one secure source per process, re-keyed in a forked child (a child
  that inherited its parent's state would repeat the parent's noise);
* the UDFs are registered with ``side_effects=True`` so DuckDB evaluates them per
  row instead of constant-folding one value for every row, and as Arrow UDFs so
  a call draws a whole vector at once.

A seeded source exists only for tests and reproducibility, through
``dpsql.connect(..., seed=N)``: the same ChaCha20 generator keyed from the
seed, salts included. Its output is a deterministic function of the seed and
is **not private**.

Floating point, and which UDFs may feed released numbers: textbook float noise
leaks through the low-order bits of its outputs (Mironov 2012: the set of
floats ``x + Lap`` can produce depends on ``x``). A number a mechanism
releases must therefore come from the granular samplers
(``dp_granular_laplace_noise``, ``dp_granular_gaussian_noise``): the value is
rounded to a grid ``g = 2^-k`` and integer noise times ``g`` is added, so every
output is an exact multiple of ``g`` and the pmf ratio between neighbours is
the one the calibration (:mod:`dpsql.core.calibration`,
``discrete_laplace_scale``, ``discrete_gaussian_sigma``) accounts for; there is
no other noise mode (``NOISE_MODES``). The float UDFs ``dp_laplace_noise``,
``dp_gaussian_noise``, ``dp_gumbel_noise``, ``dp_exponential_noise`` (and the
float methods of :class:`NoiseSource`) may only feed comparisons -- a
threshold, an argmax, an order -- whose outcome, never the noisy value, is
released: the set-union macros release the items whose noisy weight passes a
threshold, the top-k macros the items with the largest noisy scores.
"""
from __future__ import annotations

import os
import secrets
import threading
import warnings
from typing import Callable, Optional, Union

from numpy.typing import ArrayLike

import numpy as np
import pyarrow as pa
from duckdb.sqltypes import BIGINT, BOOLEAN, DOUBLE, VARCHAR
from randomgen import ChaCha

from dpsql.core.calibration import check_granularity
from dpsql.core.udf import Udf
from dpsql.core.validation import DPParameterError

__all__ = ["NoiseSource", "secure_source", "NOT_PRIVATE_WARNING", "NOISE_MODES", "check_noise_mode", "round_to_grid",
           "sample_discrete_laplace", "sample_discrete_gaussian", "CHACHA_ROUNDS"]

NOT_PRIVATE_WARNING = (
    "dpsql: this connection uses a fixed seed; its noise, salts and releases are reproducible "
    "and therefore NOT differentially private. Use seeds only for tests and demos.")


# ChaCha20: the standard round count (RFC 8439). Fewer rounds would be faster and, by current
# cryptanalysis, still unbroken at 8 -- but 20 is what the standard and the test vectors cover.
CHACHA_ROUNDS = 20


class NoiseSource:
    """A lock-protected numpy Generator on ChaCha20 plus a count of the values it has handed out.

    ``seed=None`` keys the generator with 256 bits from the OS CSPRNG and draws
    every salt from the OS CSPRNG (private). An integer seed derives the key
    from the seed and draws the salts from the same generator: every draw is
    reproducible and the releases are NOT private.
    """

    def __init__(self, seed: Optional[int] = None):
        self.seeded = seed is not None
        self._seed = seed
        self._lock = threading.Lock()
        self.samples_drawn = 0
        self._rng = self._new_generator()

    def _new_generator(self) -> np.random.Generator:
        if self._seed is not None:
            return np.random.Generator(ChaCha(seed=np.random.SeedSequence(self._seed), rounds=CHACHA_ROUNDS))
        # the key is used as drawn (no seed expansion): 256 uniform bits are already a ChaCha20 key
        return np.random.Generator(ChaCha(key=secrets.randbits(256), rounds=CHACHA_ROUNDS))

    def rekey(self) -> None:
        """Draw a fresh key from the OS CSPRNG (no-op for a seeded source)."""
        if self._seed is None:
            with self._lock:
                self._rng = self._new_generator()

    def _draw(self, n: int, fn: Callable[[np.random.Generator, int], np.ndarray]) -> np.ndarray:
        with self._lock:
            self.samples_drawn += n
            return fn(self._rng, n)

    def gaussian(self, sigma: np.ndarray) -> np.ndarray:
        """``N(0, sigma^2)`` per entry (sigma = standard deviation)."""
        sigma = _positive_vector("sigma", sigma)
        return self._draw(len(sigma), lambda g, n: g.standard_normal(n)) * sigma

    def laplace(self, scale: np.ndarray) -> np.ndarray:
        """``Lap(b)`` per entry, density ``exp(-|x|/b)/(2b)``."""
        scale = _positive_vector("scale", scale)
        return self._draw(len(scale), lambda g, n: g.laplace(0.0, 1.0, n)) * scale

    def gumbel(self, scale: np.ndarray) -> np.ndarray:
        """``Gumbel(lam)`` per entry, CDF ``exp(-exp(-x/lam))``."""
        scale = _positive_vector("scale", scale)
        return self._draw(len(scale), lambda g, n: g.gumbel(0.0, 1.0, n)) * scale

    def exponential(self, rate: np.ndarray) -> np.ndarray:
        """``Exp(r)`` per entry with **rate** r (mean ``1/r``)."""
        rate = _positive_vector("rate", rate)
        return self._draw(len(rate), lambda g, n: g.standard_exponential(n)) / rate

    def discrete_laplace(self, t: np.ndarray) -> np.ndarray:
        """``DLap(t)`` per entry (int64), pmf ``prop. to exp(-|z|/t)``; see :func:`sample_discrete_laplace`."""
        t = _positive_vector("scale", t)
        return self._draw(len(t), lambda g, n: sample_discrete_laplace(g, t))

    def discrete_gaussian(self, s: np.ndarray) -> np.ndarray:
        """``N_Z(0, s^2)`` per entry (int64); see :func:`sample_discrete_gaussian`."""
        s = _positive_vector("sigma", s)
        return self._draw(len(s), lambda g, n: sample_discrete_gaussian(g, s))

    def uniform(self, n: int) -> np.ndarray:
        """``n`` independent ``U[0, 1)`` draws (per-key Bernoulli/categorical decisions)."""
        return self._draw(int(n), lambda g, k: g.random(k))

    def salt(self) -> int:
        """A uniformly random signed 64-bit integer (per-query secret salt for hashing).

        Private source: read from the OS CSPRNG on every call, independent of the
        noise stream and of every other salt. Seeded source: the next draw of its
        generator (reproducible, NOT private).
        """
        if self._seed is not None:
            return int(self._draw(1, lambda g, n: g.integers(-(2 ** 63), 2 ** 63 - 1, size=n, dtype=np.int64,
                                                                endpoint=True))[0])
        with self._lock:
            self.samples_drawn += 1
        return int.from_bytes(secrets.token_bytes(8), "little", signed=True)


def _positive_vector(name: str, values: ArrayLike) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if not np.all(np.isfinite(arr) & (arr > 0)):
        # no value in the message: these UDFs run after the charge, and a per-row parameter may derive from data
        raise DPParameterError(f"{name} must be a finite number > 0 in every row")
    return arr


# --------------------------------------------------------------------------
# Granular (snapped) noise: integer samplers and the grid
# --------------------------------------------------------------------------

# The only noise mode for released numbers. 'continuous' (textbook float noise) was removed: see check_noise_mode.
NOISE_MODES = ("granular",)

# Doubles hold every integer below 2^53: a value is snapped and shifted exactly while
# |value / g| stays below this bound (the noise itself stays far below 2^40 steps).
_MAX_GRID_STEPS = 2.0 ** 52

# Grid steps per unit of scale above which the float steps of the sampler (an
# exponential variate scaled by t, resolution ~2^-50 t per step) could distort the pmf
# by more than ~2^-18 relative; the default grid uses 2^16..2^17.
MAX_SCALE_STEPS = 2.0 ** 32


def check_noise_mode(noise: object) -> str:
    """``noise`` must be ``'granular'`` (grid-snapped discrete noise, the only mode)."""
    if noise == "continuous":
        raise DPParameterError(
            "noise := 'continuous' was removed: textbook floating-point noise leaks the exact value through "
            "the low-order bits of the released numbers (Mironov 2012); use noise := 'granular' (the default), "
            "which releases exact multiples of a 2^-k grid")
    if not isinstance(noise, str) or noise not in NOISE_MODES:
        raise DPParameterError(f"noise must be 'granular' (got {noise!r}); pass noise := 'granular' or omit it")
    return noise


def round_to_grid(values: ArrayLike, granularity: ArrayLike) -> np.ndarray:
    """Nearest multiple of ``g = 2^-k`` (ties to even), exact in floating point: ``rint(x / g) * g``.

    Dividing and multiplying by a power of two only changes the exponent, so the
    result is the exact grid point whenever ``|x / g| < 2^52`` (checked).
    """
    x = np.asarray(values, dtype=np.float64)
    g = _granularity_vector(granularity, x.shape)
    steps = x / g
    if not np.all(np.abs(steps) < _MAX_GRID_STEPS):
        raise DPParameterError("value too large (or not finite) for granularity: |value / granularity| must be "
                               "< 2^52; pass a coarser granularity")
    return np.rint(steps) * g


def _granularity_vector(granularity: ArrayLike, shape: tuple[int, ...]) -> Union[float, np.ndarray]:
    """The checked grid: a float when every row has the same one (the usual case), else an array of ``shape``."""
    g = np.asarray(granularity, dtype=np.float64)
    if g.size and g.min() == g.max():  # no sort of the column
        return check_granularity(float(g.flat[0]))
    for v in np.unique(g):
        check_granularity(float(v))
    return np.broadcast_to(g, shape)


def _random_signs(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` independent fair bits as a bool array (64 per raw draw of the bit generator)."""
    raw = rng.bit_generator.random_raw((n + 63) // 64)
    return np.unpackbits(np.ascontiguousarray(raw).view(np.uint8), count=n).view(bool)


def _constant_or_array(values: np.ndarray) -> Union[float, np.ndarray]:
    """A float if every entry is equal (scalar arithmetic is cheaper), else the array itself."""
    return float(values[0]) if values.size and values.min() == values.max() else values


def _subset(values: Union[float, np.ndarray], index: np.ndarray, full: bool) -> Union[float, np.ndarray]:
    return values if full or isinstance(values, float) else values[index]


def sample_discrete_laplace(rng: np.random.Generator, t: ArrayLike) -> np.ndarray:
    """``DLap(t)``: pmf ``(1-a)/(1+a) a^|z|`` on the integers, ``a = exp(-1/t)`` (two-sided geometric).

    ``G = floor(t E)`` with ``E ~ Exp(1)`` is geometric on {0, 1, ...}:
    ``P[G = k] = P[k/t <= E < (k+1)/t] = a^k (1 - a)``. With a fair sign ``S`` and
    the pair (S = -, G = 0) rejected and redrawn, ``S G`` has mass ``prop. to a^|z|``
    at every integer, i.e. ``DLap(t)`` ([CKS20] Alg. 2 uses the same sign step;
    rejection probability (1-a)/2 < 1/(2t)). ``E`` comes from numpy's ziggurat
    (resolution ~2^-50 near the bulk), so each integer's mass is exact up to a relative
    ~t 2^-50 -- about 2^-33 at the default grid -- not bit-exact like the rational
    samplers of Canonne, Kamath & Steinke 2020 [CKS20], and the support is a fixed
    grid, unlike the float outputs Mironov 2012 attacks.
    """
    t = np.asarray(t, dtype=np.float64)
    n = t.shape[0]
    tc = _constant_or_array(t)
    out = np.empty(n, dtype=np.int64)
    for lo in range(0, n, _CHUNK):  # chunks keep the temporaries in cache (benchmarks/README.md)
        hi = min(n, lo + _CHUNK)
        _discrete_laplace_chunk(rng, tc if isinstance(tc, float) else tc[lo:hi], out[lo:hi])
    return out


_CHUNK = 1 << 16


def _discrete_laplace_chunk(rng: np.random.Generator, t: Union[float, np.ndarray], out: np.ndarray) -> None:
    pending: Optional[np.ndarray] = None  # None: every row of the chunk
    while True:
        m = int(out.shape[0] if pending is None else pending.size)
        e = rng.standard_exponential(m)
        e *= t if pending is None or isinstance(t, float) else t[pending]
        g = e.astype(np.int64)  # e >= 0: truncation is floor
        neg = _random_signs(rng, m).view(np.int8).astype(np.int64)
        mask = -neg  # 0 or all ones
        g ^= mask
        g -= mask  # two's complement: -g where the sign bit is set
        bad = (g == 0) & (neg == 1)
        if pending is None:
            out[:] = g
            if not bad.any():
                return
            pending = np.flatnonzero(bad)
        else:
            out[pending[~bad]] = g[~bad]
            pending = pending[bad]
        if pending.size == 0:
            return


# At or above this many grid steps per sigma the discrete Gaussian is sampled by rounding
# a continuous Gaussian with an exact rejection step (acceptance exp(-20/s) >= 0.98);
# below it, by [CKS20]'s rejection from the discrete Laplace (measured acceptance 0.58 at s = 0.6,
# 0.73 at s = 2.5, 0.76 for s >= 30).
ROUNDING_MIN_STEPS = 1024.0
_TAIL = 40.0  # |z| <= 40 s; the mass beyond is < exp(-800), i.e. 0 in double precision


def sample_discrete_gaussian(rng: np.random.Generator, s: ArrayLike) -> np.ndarray:
    """``N_Z(0, s^2)``: pmf ``prop. to exp(-z^2 / (2 s^2))`` on the integers.

    * ``s < 1024``: [CKS20] Alg. 3, rejection from ``Y ~ DLap(t)``, ``t = floor(s) + 1``,
      accepted with probability ``exp(-(|Y| - s^2/t)^2 / (2 s^2))``.
    * ``s >= 1024``: ``X ~ N(0, s^2)``, ``Z = rint(X)``, accepted with probability
      ``exp(((X - Z)(X + Z) - c) / (2 s^2))``, ``c = 40 s + 1/4``. On the cell of ``z``
      (``|X - z| <= 1/2``) ``X^2 - z^2 <= |z| + 1/4 <= c`` for ``|z| <= 40 s`` (larger
      ``|z|`` are rejected), and ``P[Z = z, accept] = int_cell phi_s(x) e^{(x^2 - z^2 - c)/(2 s^2)} dx
      = e^{-c/(2s^2)} e^{-z^2/(2 s^2)} / (s sqrt(2 pi))``: the discrete Gaussian (truncated
      at 40 s, mass < e^-800), up to the float resolution of ``X`` (numpy's ziggurat: a
      relative ~s 2^-50 per integer, as for the Laplace sampler). Since ``x^2 - z^2 >= -|z|`` on the cell,
      ``a >= a_min = exp(-c/s^2)``: a uniform below ``a_min`` accepts without evaluating
      ``a`` (all but ~40/s of the rows). The uniform ``U = (K + V) / 2^16`` is drawn in two
      parts: 16 random bits ``K`` for every row, which alone accept when ``K + 1 <= a_min 2^16``
      (then ``U < a_min`` whatever ``V``), and ``V ~ U[0, 1)`` only for the other rows, accepted
      iff ``V < a 2^16 - K`` (i.e. ``U < a``; exact in floating point there, as ``K >= a 2^16 / 2``).
      A quarter of the random bits of a full uniform per row: the generator's cost matters.

    Acceptance probabilities are evaluated in double precision (relative error ~1e-16).
    Vectorised: every round redraws only the rows still rejected.
    """
    s = np.asarray(s, dtype=np.float64)
    n = s.shape[0]
    out = np.empty(n, dtype=np.int64)
    sc = _constant_or_array(s)
    if isinstance(sc, float):  # one sigma for every row: chunks keep the temporaries in cache
        sampler = _rounding_round if sc >= ROUNDING_MIN_STEPS else _cks_round
        for lo in range(0, n, _CHUNK):
            _rejection_fill(rng, sampler, sc, out[lo:lo + _CHUNK])
        return out
    fine = s >= ROUNDING_MIN_STEPS
    for rows, sampler in ((np.flatnonzero(fine), _rounding_round), (np.flatnonzero(~fine), _cks_round)):
        if rows.size:
            part = np.empty(rows.size, dtype=np.int64)
            _rejection_fill(rng, sampler, s[rows], part)
            out[rows] = part
    return out


# One round of a discrete-Gaussian sampler: (rng, sigma in grid steps, rows) -> (candidates, accept flags).
_Sampler = Callable[[np.random.Generator, Union[float, np.ndarray], int], tuple[np.ndarray, np.ndarray]]


def _rejection_fill(rng: np.random.Generator, sampler: _Sampler, s: Union[float, np.ndarray],
                    out: np.ndarray) -> None:
    """Fill ``out`` with accepted candidates of ``sampler``, redrawing only the rejected rows.

    One ``s`` for every row: the accepted candidates are i.i.d. draws of the target, so a
    batch a little larger than needed (by the sampler's expected rejection rate) fills
    ``out`` in one round almost always; the first accepted ones are kept, in order.
    """
    m = out.shape[0]
    if isinstance(s, float):
        oversample = 1.0 / 32 if sampler is _rounding_round else 0.4
        filled = 0
        while filled < m:
            need = m - filled
            z, accept = sampler(rng, s, need + int(need * oversample) + 16)
            got = z[accept][:need]
            out[filled:filled + got.size] = got
            filled += got.size
        return
    z, accept = sampler(rng, s, m)
    out[:] = z
    pending = np.flatnonzero(~accept)
    while pending.size:  # the rejected rows only: few, so the fancy indexing is cheap
        z, accept = sampler(rng, _subset(s, pending, False), pending.size)
        out[pending[accept]] = z[accept]
        pending = pending[~accept]


def _rounding_round(rng: np.random.Generator, s: Union[float, np.ndarray], m: int) -> tuple[np.ndarray, np.ndarray]:
    """One round of the rounding sampler (``s >= 1024``) on ``m`` rows: candidates, accept flags."""
    x = rng.standard_normal(m)
    x *= s
    z = np.rint(x)
    k = rng.integers(0, 1 << 16, size=m, dtype=np.uint16)  # the leading 16 bits of the uniform U
    c = _TAIL * s + 0.25
    a_min = np.exp(-c / (s * s)) * (1.0 - 1e-12)  # margin: a_min must not round above the true bound
    accept = k < np.floor(a_min * 65536.0)  # k + 1 <= a_min 2^16: U < a_min for every remaining bit
    # |z| > 40 s (probability < e^-800) is rejected; two reductions rule it out for the whole batch
    if x.max() > _TAIL * np.min(s) - 1 or x.min() < 1 - _TAIL * np.min(s):
        accept &= np.abs(z) <= _TAIL * s
    slow = np.flatnonzero(~accept)
    if slow.size:
        xs, zs = x[slow], z[slow]
        ss = s if isinstance(s, float) else s[slow]
        cs = c if isinstance(c, float) else c[slow]
        a = np.exp(((xs - zs) * (xs + zs) - cs) / (2.0 * ss * ss))
        v = rng.random(slow.size)  # the remaining bits of U = (k + v) / 2^16
        accept[slow] = (np.abs(zs) <= _TAIL * ss) & (v < a * 65536.0 - k[slow])
    return z.astype(np.int64), accept


def _cks_round(rng: np.random.Generator, s: Union[float, np.ndarray], m: int) -> tuple[np.ndarray, np.ndarray]:
    """One round of [CKS20] Alg. 3 (``s < 1024``) on ``m`` rows: candidates, accept flags."""
    t = np.floor(s) + 1.0
    y = sample_discrete_laplace(rng, np.broadcast_to(t, (m,)))
    d = np.abs(y) - s * s / t
    return y, rng.random(m) < np.exp(-d * d / (2.0 * s * s))


_SECURE: Optional[NoiseSource] = None
_SECURE_LOCK = threading.Lock()


def secure_source() -> NoiseSource:
    """The process-wide secure source (created on first use, re-keyed after fork)."""
    global _SECURE
    with _SECURE_LOCK:
        if _SECURE is None:
            _SECURE = NoiseSource()
        return _SECURE


def _rekey_after_fork() -> None:
    if _SECURE is not None:
        _SECURE.rekey()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_rekey_after_fork)


def seeded_source(seed: int) -> NoiseSource:
    """A reproducible source. NOT PRIVATE: warns every time it is created."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise DPParameterError(f"seed must be an integer (got {seed!r})")
    warnings.warn(NOT_PRIVATE_WARNING, stacklevel=3)
    return NoiseSource(int(seed))


# --------------------------------------------------------------------------
# Arrow UDF bodies
# --------------------------------------------------------------------------

def _arrow_noise(source: NoiseSource, method: str, param_name: str) -> Callable[[pa.Array], pa.Array]:
    draw = getattr(source, method)

    def udf(param: pa.Array) -> pa.Array:
        if param.null_count:
            raise DPParameterError(f"{param_name} must not be NULL; pass a finite number > 0")
        values = param.to_numpy(zero_copy_only=False)
        return pa.array(draw(values), type=pa.float64())

    udf.__name__ = f"dp_{method}_noise"
    return udf


def _granular_noise(source: NoiseSource, method: str, param_name: str) -> Callable[[pa.Array, pa.Array], pa.Array]:
    """Arrow body of ``dp_granular_<kind>_noise(param, granularity)``: ``g * Z``, Z integer in grid steps.

    ``param`` (Laplace scale b, or Gaussian sigma) is in value units; the sampler
    receives ``param / g`` steps. Both may vary per row; every output is an exact
    multiple of its row's ``g``.
    """
    draw = getattr(source, method)

    def udf(param: pa.Array, granularity: pa.Array) -> pa.Array:
        if param.null_count:
            raise DPParameterError(f"{param_name} must not be NULL; pass a finite number > 0")
        if granularity.null_count:
            raise DPParameterError("granularity must not be NULL; pass a power of two such as 2^-16")
        p = _positive_vector(param_name, param.to_numpy(zero_copy_only=False))
        g = _granularity_vector(granularity.to_numpy(zero_copy_only=False), p.shape)
        steps = p / g
        if not np.all(steps <= MAX_SCALE_STEPS):
            raise DPParameterError(f"granularity is too fine for {param_name}: {param_name} / granularity must be "
                                   f"<= 2^32; pass granularity >= {param_name} / 2^32 "
                                   f"(e.g. dp_granularity({param_name}))")
        return pa.array(draw(steps) * g, type=pa.float64())

    udf.__name__ = f"dp_granular_{method}_noise"
    return udf


def _round_to_grid_udf(values: pa.Array, granularity: pa.Array) -> pa.Array:
    if granularity.null_count:
        raise DPParameterError("granularity must not be NULL; pass a power of two such as 2^-16")
    x = values.to_numpy(zero_copy_only=False).astype(np.float64)  # NULL -> nan, kept NULL below
    valid = ~np.isnan(x) if values.null_count else np.ones(len(x), dtype=bool)
    out = np.full(len(x), np.nan)
    g = granularity.to_numpy(zero_copy_only=False)
    out[valid] = round_to_grid(x[valid], np.broadcast_to(g, x.shape)[valid])
    return pa.array(out, type=pa.float64(), mask=~valid)


def _check_noise_udf(mode: pa.Array, granularity: pa.Array) -> pa.Array:
    """``dp__check_noise(noise, granularity)``: true, or an error naming the bad parameter.

    ``granularity`` (NULL: the default grid) is checked by the calibration that uses it.
    """
    for m in mode.to_pylist():
        check_noise_mode(m)
    return pa.array([True] * len(mode), type=pa.bool_())


def udfs(source: NoiseSource) -> list[Udf]:
    """The noise UDFs and the per-query secret salt, all drawing from ``source`` (side effects: never folded).

    Only the granular UDFs may produce a released number (module docstring).
    ``dp__secret_salt()`` returns a fresh independent salt per call (see :meth:`NoiseSource.salt`).
    """

    def secret_salt() -> pa.Array:
        return pa.array([source.salt()], type=pa.int64())

    granular = [
        Udf("dp_granular_laplace_noise", _granular_noise(source, "discrete_laplace", "scale"), (DOUBLE, DOUBLE), DOUBLE,
            side_effects=True),
        Udf("dp_granular_gaussian_noise", _granular_noise(source, "discrete_gaussian", "sigma"), (DOUBLE, DOUBLE),
            DOUBLE, side_effects=True),
        # pure: deterministic functions of their arguments
        Udf("dp_round_to_grid", _round_to_grid_udf, (DOUBLE, DOUBLE), DOUBLE),
        Udf("dp__check_noise", _check_noise_udf, (VARCHAR, DOUBLE), BOOLEAN),
    ]

    noise_udfs = [Udf(f"dp_{kind}_noise", _arrow_noise(source, kind, param), (DOUBLE,), DOUBLE, side_effects=True)
                  for kind, param in (("gaussian", "sigma"), ("laplace", "scale"), ("gumbel", "scale"),
                                      ("exponential", "rate"))]
    return noise_udfs + granular + [Udf("dp__secret_salt", secret_salt, (), BIGINT, side_effects=True)]
