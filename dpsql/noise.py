"""Noise sources and the vectorised noise UDFs.

Privacy argument: every noise value a mechanism adds must be fresh and
unpredictable to whoever runs SQL on the connection. Therefore

* noise is never drawn with SQL ``random()`` (any SQL user can ``setseed()``
  it); it comes from a :class:`NoiseSource` wrapping a numpy ``Generator`` on a
  Philox bit generator keyed with 256 bits from the OS CSPRNG
  (``secrets.randbits``);
* there is one secure source per process, re-keyed in a forked child (a child
  that inherited its parent's state would repeat the parent's noise);
* the UDFs are registered with ``side_effects=True`` so DuckDB evaluates them per
  row instead of constant-folding one value for every row, and as Arrow UDFs so
  a call draws a whole vector at once.

A seeded source exists only for tests and reproducibility, through
``dpsql.connect(..., seed=N)``; its output is a deterministic function of the
seed and is **not private**. Floating-point side channels of textbook noise
sampling are out of scope here (see the noise-hardening issue).
"""
from __future__ import annotations

import os
import secrets
import threading
import warnings
from typing import Optional

import numpy as np
import pyarrow as pa
from duckdb.sqltypes import BIGINT, DOUBLE

from dpsql.udf import Udf

__all__ = ["NoiseSource", "secure_source", "NOT_PRIVATE_WARNING"]

NOT_PRIVATE_WARNING = (
    "dpsql: this connection uses a fixed seed; its noise, salts and releases are reproducible "
    "and therefore NOT differentially private. Use seeds only for tests and demos.")


class NoiseSource:
    """A lock-protected numpy Generator plus a count of the values it has drawn.

    ``seed=None`` keys the generator from the OS CSPRNG (private). An integer
    seed makes every draw reproducible and the releases NOT private.
    """

    def __init__(self, seed: Optional[int] = None):
        self.seeded = seed is not None
        self._seed = seed
        self._lock = threading.Lock()
        self.samples_drawn = 0
        self._rng = self._new_generator()

    def _new_generator(self) -> np.random.Generator:
        if self._seed is not None:
            return np.random.Generator(np.random.Philox(np.random.SeedSequence(self._seed)))
        return np.random.Generator(np.random.Philox(np.random.SeedSequence(secrets.randbits(256))))

    def rekey(self) -> None:
        """Draw a fresh key from the OS CSPRNG (no-op for a seeded source)."""
        if self._seed is None:
            with self._lock:
                self._rng = self._new_generator()

    def _draw(self, n: int, fn) -> np.ndarray:
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

    def uniform(self, n: int) -> np.ndarray:
        """``n`` independent ``U[0, 1)`` draws (per-key Bernoulli/categorical decisions)."""
        return self._draw(int(n), lambda g, k: g.random(k))

    def salt(self) -> int:
        """A uniformly random signed 64-bit integer (per-query secret salt for hashing)."""
        return int(self._draw(1, lambda g, n: g.integers(-(2 ** 63), 2 ** 63 - 1, size=n, dtype=np.int64))[0])


def _positive_vector(name: str, values) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if not np.all(np.isfinite(arr) & (arr > 0)):
        bad = arr[~(np.isfinite(arr) & (arr > 0))]
        raise ValueError(f"{name} must be a finite number > 0 (got {bad[0]!r})")
    return arr


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
        raise ValueError(f"seed must be an integer (got {seed!r})")
    warnings.warn(NOT_PRIVATE_WARNING, stacklevel=3)
    return NoiseSource(int(seed))


# --------------------------------------------------------------------------
# Arrow UDF bodies
# --------------------------------------------------------------------------

def _arrow_noise(source: NoiseSource, method: str, param_name: str):
    draw = getattr(source, method)

    def udf(param: pa.Array) -> pa.Array:
        if param.null_count:
            raise ValueError(f"{param_name} must not be NULL")
        values = param.to_numpy(zero_copy_only=False)
        return pa.array(draw(values), type=pa.float64())

    udf.__name__ = f"dp_{method}_noise"
    return udf


def udfs(source: NoiseSource) -> list[Udf]:
    """The noise UDFs and the per-query secret salt, all drawing from ``source`` (side effects: never folded)."""

    def secret_salt() -> pa.Array:
        return pa.array([source.salt()], type=pa.int64())

    noise_udfs = [Udf(f"dp_{kind}_noise", _arrow_noise(source, kind, param), (DOUBLE,), DOUBLE, side_effects=True)
                  for kind, param in (("gaussian", "sigma"), ("laplace", "scale"), ("gumbel", "scale"),
                                      ("exponential", "rate"))]
    return noise_udfs + [Udf("dp__secret_salt", secret_salt, (), BIGINT, side_effects=True)]
