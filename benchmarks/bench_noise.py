"""Benchmark: noise throughput per bit generator and noise UDF, numpy path and through the SQL UDFs.

Bit generators (all keyed from the OS CSPRNG, as the private source is):

* ``philox``: numpy's Philox-4x64 (a statistical counter-based generator; the noise source before ChaCha20);
* ``chacha20``: ``randomgen.ChaCha``, 20 rounds -- the private :class:`dpsql.core.noise.NoiseSource` as shipped;
* ``aes-ctr``: ``randomgen.AESCounter`` (AES-128 in counter mode; fast only with AES-NI).

UDFs: granular Laplace / Gaussian (``dp_granular_laplace_noise``, ``dp_granular_gaussian_noise``, the only ones
that may produce released numbers; default grid, 2^16..2^17 steps per unit of scale) and the float Laplace /
Gaussian used only for thresholds (``dp_laplace_noise``, ``dp_gaussian_noise``). The numpy path is the body of
each UDF without Arrow (parameter checks, the draw, the scaling by the grid). The SQL path runs
``SELECT sum(<udf>(...)) FROM range(N)`` on a connection with only the noise UDFs registered, one connection per
bit generator (``range`` + ``sum`` alone is reported as the floor). In every repetition each UDF runs once per
bit generator, the generators in rotating order (A B C, B C A, ...). Reported: median rates and the median of the
per-repetition time ratios to ``philox``, in wall time and in CPU time of this process (all its threads; on a
machine shared with other jobs the better estimate of an idle machine), with the load (``uptime``) before and
after. ``--no-accel`` switches off randomgen's SSE code for ChaCha and AES-NI for AES-CTR (as on a CPU without
them), to see what the generators cost where the hardware does not help. Run by hand:

    python benchmarks/bench_noise.py [--rows 10000000] [--reps 7] [--no-accel]
"""
from __future__ import annotations

import argparse
import os
import platform
import secrets
import statistics
import subprocess
import time
from typing import Callable

import duckdb
import duckdb.func
import numpy as np
from randomgen import AESCounter

from dpsql.core import calibration, noise

SCALE = 1.0  # Laplace b and Gaussian sigma, in value units


class _OtherSource(noise.NoiseSource):
    """A private-style source on another bit generator, for comparison only."""

    def __init__(self, make_bit_generator: Callable[[], np.random.BitGenerator]):
        self._make = make_bit_generator
        super().__init__()

    def _new_generator(self) -> np.random.Generator:
        return np.random.Generator(self._make())


def sources(accelerated: bool = True) -> dict[str, noise.NoiseSource]:
    """The sources compared; ratios are to the first."""
    srcs = {
        "philox": _OtherSource(lambda: np.random.Philox(np.random.SeedSequence(secrets.randbits(256)))),
        "chacha20": noise.NoiseSource(),  # as shipped
        "aes-ctr": _OtherSource(lambda: AESCounter(key=secrets.randbits(128))),
    }
    if not accelerated:
        srcs["chacha20"]._rng.bit_generator.use_simd = False
        srcs["aes-ctr"]._rng.bit_generator.use_aesni = False
    return srcs


def numpy_paths(src: noise.NoiseSource, n: int) -> dict[str, Callable[[], np.ndarray]]:
    """One callable per UDF drawing n samples the way the UDF bodies do."""
    param = np.full(n, SCALE)
    g = calibration.default_granularity(SCALE)

    def granular(method: str) -> Callable[[], np.ndarray]:
        draw = getattr(src, method)

        def run() -> np.ndarray:
            p = noise._positive_vector("scale", param)
            grid = noise._granularity_vector(g, p.shape)
            return draw(p / grid) * grid

        return run

    return {
        "granular Laplace": granular("discrete_laplace"),
        "granular Gaussian": granular("discrete_gaussian"),
        "threshold Laplace": lambda: src.laplace(param),
        "threshold Gaussian": lambda: src.gaussian(param),
    }


def sql_queries(n: int) -> dict[str, str]:
    g = repr(calibration.default_granularity(SCALE))
    return {
        "granular Laplace": f"SELECT sum(dp_granular_laplace_noise({SCALE}, {g})) FROM range({n})",
        "granular Gaussian": f"SELECT sum(dp_granular_gaussian_noise({SCALE}, {g})) FROM range({n})",
        "threshold Laplace": f"SELECT sum(dp_laplace_noise({SCALE})) FROM range({n})",
        "threshold Gaussian": f"SELECT sum(dp_gaussian_noise({SCALE})) FROM range({n})",
        "floor (range + sum)": f"SELECT sum(i::DOUBLE) FROM range({n}) r(i)",
    }


def noise_connection(src: noise.NoiseSource) -> duckdb.DuckDBPyConnection:
    """A connection with only the noise UDFs, registered the way dpsql registers them."""
    con = duckdb.connect()
    for udf in noise.udfs(src):
        con.create_function(udf.name, udf.fn, list(udf.params), udf.returns, type=duckdb.func.ARROW,
                            null_handling=duckdb.func.SPECIAL, side_effects=udf.side_effects)
    return con


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"load average: {os.getloadavg()}"


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process)."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def report(title: str, unit: str, n: int, times: dict[str, dict[str, list[tuple[float, float]]]],
           base: str) -> None:
    gens = list(next(iter(times.values())))
    for i, clock in enumerate(("wall", "CPU")):
        print(f"{title}, {unit} per {clock} second (median of reps); in parentheses: median of the per-rep "
              f"{clock}-time ratios to {base}")
        print(f"  {'':22s}" + "".join(f"{g:>22s}" for g in gens))
        for k, per_gen in times.items():
            cells = []
            for gname in gens:
                rate = n / max(statistics.median(t[i] for t in per_gen[gname]), 1e-9) / 1e6
                ratio = statistics.median(t[i] / max(b[i], 1e-9) for t, b in zip(per_gen[gname], per_gen[base]))
                cells.append(f"{rate:9.2f} ({ratio:4.2f}x time)")
            print(f"  {k:22s}" + "".join(f"{c:>22s}" for c in cells))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--no-accel", action="store_true", help="no SIMD for ChaCha, no AES-NI for AES-CTR")
    args = ap.parse_args()
    n = args.rows
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, {platform.python_implementation()} "
          f"{platform.python_version()}, numpy {np.__version__}, duckdb {duckdb.__version__}; rows={n:,}"
          + ("; randomgen acceleration OFF" if args.no_accel else ""))
    print(f"before: {uptime()}")

    srcs = sources(accelerated=not args.no_accel)
    paths = {gname: numpy_paths(src, n) for gname, src in srcs.items()}
    cons = {gname: noise_connection(src) for gname, src in srcs.items()}
    queries = sql_queries(n)
    gens = list(srcs)
    for gname in gens:  # warm-up
        for fn in paths[gname].values():
            fn()
        for q in queries.values():
            cons[gname].execute(q).fetchall()

    np_times = {k: {g: [] for g in gens} for k in paths[gens[0]]}
    sql_times = {k: {g: [] for g in gens} for k in queries}
    for rep in range(args.reps):
        order = gens[rep % len(gens):] + gens[:rep % len(gens)]
        for k in np_times:
            for gname in order:
                np_times[k][gname].append(timed(paths[gname][k]))
        for k, q in queries.items():
            for gname in order:
                sql_times[k][gname].append(timed(lambda: cons[gname].execute(q).fetchall()))
    print(f"after:  {uptime()}")
    report("numpy path", "M samples/s", n, np_times, gens[0])
    report("SQL UDF, SELECT sum(noise) FROM range(N)", "M rows/s", n, sql_times, gens[0])


if __name__ == "__main__":
    main()
