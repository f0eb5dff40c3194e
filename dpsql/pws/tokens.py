"""Frequency tokens: the probabilities ``pi_{i,j}`` of reporting a key of frequency ``i`` with token ``j``
([PWS] Alg. 4, App. B construction, with the set-form lower bounds that keep it private for sampled ``q``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Optional, Sequence

import numpy as np

from dpsql.pws.keys import KeyTable, L_value, _first_q_one, key_table
from dpsql.pws.params import MAX_FREQUENCY_CELLS, MAX_FREQUENCY_ROWS, check_pws_parameters
from dpsql.core.validation import DPParameterError


def frequency_rows_reference(epsilon: float, delta: float, pi: Sequence[float]) -> list[list[float]]:
    """The App. B construction exactly as printed (prefix lower bounds), scalar and dense; tests only.

    Correct for ``q = 1`` but NOT differentially private for some sampled ``q`` (see :func:`_next_row`).

    Row ``i`` is ``[pi_{i,0}, ..., pi_{i,i}]`` with ``pi_{i,0} = 1 - pi_i``.
    """
    ee, em = math.exp(epsilon), math.exp(-epsilon)
    rows = [[1.0]]
    for i in range(1, len(pi)):
        prev = rows[-1] + [0.0]
        row = [0.0] * (i + 1)
        row[0] = 1.0 - pi[i]
        D = [0.0] * (i + 1)
        for j in range(1, i):
            D[j] = max(0.0, em * (sum(prev[:j + 1]) - delta) - (row[0] + sum(D[1:j])))
        R = pi[i] - sum(D[1:i])
        for j in range(i, 0, -1):
            U = ee * sum(prev[j:i]) + delta - sum(row[j + 1:])
            if R == 0:
                row[j] = D[j]
            elif U - D[j] <= R:
                row[j] = U
                R -= U - D[j]
            else:
                row[j] = D[j] + R
                R = 0.0
        rows.append(row)
    return rows


@dataclass
class FrequencyTable:
    """``pi_{i,j}`` rows in band form: row ``i`` holds ``pi_{i,lo_i}..pi_{i,i}`` (other ``j >= 1`` are 0).

    Rows beyond ``m`` exist only when ``steady``: then row ``i > m`` is row ``m`` shifted by ``i - m``.
    """

    keys: KeyTable
    lo: list = field(default_factory=list)
    vals: list = field(default_factory=list)
    steady: bool = False
    _cum: Optional[np.ndarray] = None
    _draw: Optional[tuple] = None

    @property
    def m(self) -> int:
        return len(self.vals) - 1

    def row(self, i: int) -> tuple[int, np.ndarray]:
        """``(lo, values)`` of row ``i``: ``pi_{i,lo+k} = values[k]``."""
        if i <= self.m:
            return self.lo[i], self.vals[i]
        if not self.steady:
            raise DPParameterError(f"a frequency is beyond the computed pi_(i,j) table (rows 0..{self.m})")
        return self.lo[self.m] + (i - self.m), self.vals[self.m]

    def entry(self, i: int, j: int) -> float:
        if j == 0:
            return 1.0 - float(self.keys.reporting([i])[0])
        lo, v = self.row(i)
        return float(v[j - lo]) if lo <= j < lo + len(v) else 0.0

    def draw_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(cum, lo, width)`` for drawing tokens: :meth:`cumulative` padded with +inf to a power-of-two
        width (for a branch-free binary search), and per row the first token and the band width."""
        if self._draw is None:
            cum = self.cumulative()
            width = 1 << max(0, int(cum.shape[1] - 1).bit_length())
            padded = np.full((cum.shape[0], width), np.inf)
            padded[:, :cum.shape[1]] = cum
            self._draw = (padded, np.asarray(self.lo, dtype=np.int64),
                          np.array([len(v) for v in self.vals], dtype=np.int64))
        return self._draw

    def cumulative(self) -> np.ndarray:
        """Per row: ``[pi_{i,0}, pi_{i,0} + pi_{i,lo}, ...]``, padded with +inf (for drawing tokens)."""
        if self._cum is None:
            width = max(len(v) for v in self.vals) + 1
            cum = np.full((self.m + 1, width), np.inf)
            pis = self.keys.reporting(np.arange(self.m + 1))
            for i, v in enumerate(self.vals):
                cum[i, 0] = 1.0 - pis[i]
                cum[i, 1:len(v) + 1] = cum[i, 0] + np.cumsum(v)
            self._cum = cum
        return self._cum


def _next_row(prev_lo: int, prev_vals: np.ndarray, prev_pi: float, pi_i: float, i: int,
              ee: float, em: float, delta: float) -> tuple[int, np.ndarray]:
    """Row ``i`` of the App. B construction from row ``i-1`` (vectorised over the band)."""
    s = min(prev_lo, i)
    prev = np.zeros(i - s + 1)  # pi_{i-1,j} for j = s..i (pi_{i-1,i} = 0)
    prev[prev_lo - s:prev_lo - s + len(prev_vals)] = prev_vals
    p0_prev, p0 = 1.0 - prev_pi, 1.0 - pi_i
    # Lower bounds. ERRATUM: App. B bounds prefixes J = {0..j} (constraint (31)), which lets the slack of
    # token 0 lower the other tokens; but the binding set of the DP constraint is
    # J = {j : pi_{i-1,j} > e^eps pi_{i,j}}, which need not contain 0 (sampled q: eps=0.5, delta=1e-3,
    # ppswor tau=0.05 violates it by 0.024 from row 11 to 12). We enforce the set form directly:
    # sum_j (pi_{i-1,j} - e^eps pi_{i,j})_+ <= delta. Token 0 uses c_0 of the budget; the rest lowers the
    # lowest tokens first (those keep their minimum), D_j = e^-eps (pi_{i-1,j} - b_j), sum b_j = delta - c_0.
    # For q = 1 this coincides with App. B (Lemma 4.2 rows are reproduced exactly).
    budget = max(0.0, delta - max(0.0, p0_prev - ee * p0))
    before = np.concatenate(([0.0], np.cumsum(prev)[:-1]))
    b = np.clip(budget - before, 0.0, prev)
    D = em * (prev - b)
    D[-1] = 0.0
    R = pi_i - float(D.sum())
    # Right-to-left allocation (29): while the suffix bound is tight, U_i = delta and U_j = e^eps pi_{i-1,j}.
    U = ee * prev
    U[-1] = delta
    excess = (U - D)[::-1]
    cum = np.cumsum(excess)
    row = D.copy()[::-1]
    if R > 0:
        full = int(np.searchsorted(cum, R, side="right"))  # entries taking U entirely (cum <= R)
        row[:full] = U[::-1][:full]
        if full < len(row):
            row[full] = D[::-1][full] + (R - (cum[full - 1] if full else 0.0))
    row = row[::-1]
    nz = np.nonzero(row)[0]
    if len(nz) == 0:
        return i, np.zeros(0)
    return s + int(nz[0]), row[nz[0]:].copy()


@lru_cache(maxsize=16)
def frequency_table(epsilon: float, delta: float, tau: Optional[float] = None, scheme: str = "ppswor",
                    power: float = 1.0, n: int = 1) -> FrequencyTable:
    """``pi_{i,j}`` of [PWS] Alg. 4 (App. B construction) for every frequency ``<= n``.

    Stops early once the rows are shifts of each other (``pi = q = 1``: every later row repeats the shift).
    """
    epsilon, delta, tau, scheme, power = check_pws_parameters(epsilon, delta, tau, scheme, power)
    n = max(1, int(n))
    q1 = _first_q_one(tau, scheme, power)
    keys = key_table(epsilon, delta, tau, scheme, power, n=n)
    table = FrequencyTable(keys, lo=[1], vals=[np.zeros(0)])
    ee, em = math.exp(epsilon), math.exp(-epsilon)
    limit = n if q1 is None else min(n, q1 + 4 * math.ceil(L_value(epsilon, delta)) + 8)
    if limit > MAX_FREQUENCY_ROWS:
        # limit can be the data's largest frequency (n): the message names only the parameters
        raise DPParameterError(
            f"with_frequencies at tau={tau}, power={power} needs pi_(i,j) rows beyond frequency {MAX_FREQUENCY_ROWS}; "
            f"use a larger tau or report keys only")
    pis = keys.reporting(np.arange(limit + 1))
    cells = 0
    for i in range(1, limit + 1):
        lo, v = _next_row(table.lo[-1], table.vals[-1], float(pis[i - 1]), float(pis[i]), i, ee, em, delta)
        table.lo.append(lo)
        table.vals.append(v)
        cells += len(v)
        if cells > MAX_FREQUENCY_CELLS:
            raise DPParameterError(f"with_frequencies at tau={tau}, power={power}: the pi_(i,j) table is too large "
                                   f"(more than {MAX_FREQUENCY_CELLS} entries); use a larger tau or report keys only")
        # Once pi = q = 1 the construction maps a row to its shift (up to rounding, ~1e-16): later rows are
        # shifts of this one, and the pair (row, shifted row) satisfies the DP inequalities like (row-1, row).
        if pis[i] == 1.0 and pis[i - 1] == 1.0 and lo == table.lo[-2] + 1 and len(v) == len(table.vals[-2]) \
                and np.max(np.abs(v - table.vals[-2])) <= 1e-14:
            table.steady = True
            table.lo.pop()
            table.vals.pop()
            break
    return table


def optimal_frequency_probability(epsilon: float, delta: float, i: int, j: int) -> float:
    """``pi*_{i,j}`` for ``q = 1`` and integral L: [PWS] Lemma 4.2 CORRECTED.

    ERRATUM (printed form off by one): ``pi*_{i,j} = pi*_{i-j+1} - pi*_{i-j}`` =
    ``delta e^{(i-j) eps}`` for ``i-j in [0, L]`` and ``delta e^{(2L-(i-j)) eps}`` for ``i-j in [L, 2L]``,
    non-zero for ``j >= max(1, i-2L)``.
    """
    L = round(L_value(epsilon, delta))
    k = i - j
    if j < 1 or k < 0 or k > 2 * L:
        return 0.0
    return delta * math.exp((k if k <= L else 2 * L - k) * epsilon)

