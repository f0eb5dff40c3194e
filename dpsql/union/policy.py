"""Sequential update policies: Policy Laplace, Policy Gaussian, GreedyUpdate.

[DPSU] (Gopi et al., ICML 2020) Alg. 1: users are visited one at a time in a
data-independent order; each user spends a budget of 1 on the weights of its
(capped) items through an update policy ``phi``; at the end every item of the
histogram's support gets noise and is released if it exceeds a threshold.

* ``policy_laplace``: l1-descent (Alg. 3, 4): water-filling of the user's items
  towards the cutoff ``Gamma`` with total l1 change 1.
* ``policy_gaussian``: l2-descent (Alg. 5, 6): a step of l2 length 1 from the
  user's items towards ``(Gamma, ..., Gamma)``.
* ``greedy_update`` (Carvalho et al. 2022, as used by [MAD] and [MM]): the user
  fills its items one after another in a fixed order (most frequent in the
  user's own rows first, then one global order of the items, the same for every
  user: the items of a public ``order_tbl`` first, by ``order_col``, then a keyed
  hash of the item) up to ``Gamma`` with l1 budget 1. No ``max_items`` cap.
  Released with the windowed rule of point 5, not the support rule of point 4.

Privacy argument (user-level add/remove, [DPSU] Thm 1.1, 4.1, 5.1):

1. The visiting order is a keyed hash of the user id alone (secret per-query
   salt): adding or removing a user does not change the relative order of the
   others (greedy_update visits users by their number of distinct items first,
   a function of each user's own rows: the others' relative order is still
   unchanged). Which items a user keeps (the uniform ``max_items`` sample of
   ``dp__capped_user_items``) and the order greedy_update fills them in depend
   only on that user's rows (the fill order ranks them by a public order_tbl
   and a keyed hash of the item alone: one global order, fixed before the data
   is read). The order salt is a separate draw from the cap salt (secrecy is
   not needed for privacy, only data independence; a fresh salt per query makes
   runs differ like the paper's shuffles). Equal hashes are ordered by the user
   id, so two users are never merged into one.
2. Each policy is contractive: l1-descent and greedy_update for the invariant
   set ``{(G1, G2): G1 >= G2, ||G1 - G2||_1 <= 1}`` ([DPSU] Lemma 4.1; for
   greedy_update the fill order does not depend on the histogram, so with
   ``G1 >= G2`` every gap of G1 is smaller and its remaining budget never
   smaller at any item: ``G1' >= G2'``, and G1 spends at most what G2 spends,
   so the l1 distance does not grow); l2-descent for all pairs at l2 distance
   <= 1 ([DPSU] Lemma 5.1, 5.2). Hence the final histogram has l1 (resp. l2)
   sensitivity <= 1 ([DPSU] Lemma 4.2). With ``passes = P`` every pass spends
   ``1/P`` (l1 budget, or l2 step length), so by contraction and the triangle
   inequality the P passes together still move the histogram by at most 1
   (docs/proofs/policy_laplace.md).
3. l1- and l2-descent give every item of a capped set a positive weight, so
   the support of H is the union of the capped sets and the items that are
   positive only with the added user are its novel items (held by no one
   else): at most ``max_items`` of them, each with the same weight ``<= 1/t``
   (l1-descent) resp. ``<= 1/sqrt(t)`` (l2-descent).
4. Support rule (policy_laplace, policy_gaussian): ``Lap(1/eps)`` resp.
   ``N(0, sigma(eps, delta/2)^2)`` noise on the support and the thresholds of
   :mod:`dpsql.core.calibration` (``h(t) = 1/t``, ``1/sqrt(t)``) bound the
   probability that a novel item is released by ``delta`` resp. ``delta/2``;
   on the common support the Laplace/Gaussian mechanism gives the rest.
5. GreedyUpdate leaves most union items at weight 0, and an added user can
   turn MANY of them positive: the budget it frees cascades through later
   users, each of which may spill onto one more zero item (``t`` items of
   weight ``1/t`` each, ``t`` unbounded without a cap). Under the support rule
   these act like novel items: with ``rho = 1 + ln(1/(2 delta))/eps``,
   ``P[some is released] ~ t delta e^{-eps(1-1/t)}``, and no fixed threshold
   bounds it for every t. GreedyUpdate therefore uses the windowed
   rule (:func:`release` with ``window=True``): item ``i`` is released iff
   ``rho - H[i] < L_i <= rho``, ``L_i ~ Lap(1/eps)``. Its release probability
   ``q(w) = P[rho - w < L <= rho]`` is continuous with ``q(0) = 0`` (drawing
   noise for the support only is the rule run on the whole universe), and for
   ``0 <= w <= w + d``,
   ``d <= 1``: ``q(w + d) <= e^{eps d} q(w) + P[rho - d < L <= rho]`` and
   ``1 - q(w) <= e^{eps d} (1 - q(w + d))`` (shift the Laplace density by d),
   with ``P[rho - d < L <= rho] = e^{-eps rho} (e^{eps d} - 1) / 2
   <= d e^{-eps rho} (e^eps - 1) / 2 <= d delta`` (convexity; ``rho >= 1``) at
   ``rho = max(1, ln((e^eps - 1) / (2 delta)) / eps)``. Each item is thus
   ``(eps d_i, delta d_i)``-indistinguishable, the items are independent, and
   ``sum d_i = ||H' - H||_1 <= 1`` (point 2): ``(eps, delta)``-DP by basic
   composition. ``Gamma >= 1`` is not needed for this (``Gamma > rho >= 1``
   holds anyway). Full argument: docs/proofs/greedy_update.md.

The cutoff Gamma does not affect privacy, only utility. The histogram and the
noisy values never leave :func:`release`: the UDF returns only released dense
ids, which the macro joins back to items in the engine.
"""
from __future__ import annotations

import math
import threading
import warnings
from array import array
from functools import lru_cache
from typing import Callable, Optional

import duckdb
import numpy as np
import pyarrow as pa
from duckdb.sqltypes import BIGINT, DOUBLE, VARCHAR

from dpsql.core import progress as progress_steps
from dpsql.core.errors import InputError, ParameterError
from dpsql.union import basic
from dpsql.core.calibration import SetUnionCalibration
from dpsql.core.noise import NoiseSource
from dpsql.core.mechanism import (EXAMPLE_PUBLIC_ORDER, EXAMPLE_USER_ITEMS, AuditCase, Mechanism, Param,
                                  user_item_example, user_item_params)
from dpsql.core.udf import Udf, scalar
from dpsql.core.validation import (DPParameterError, check_column_pair, check_delta, check_epsilon, check_identifier,
                              check_max_items, check_table_name, user_budget)

__all__ = [
    "MECHANISMS",
    "POLICIES", "MAX_PASSES", "check_alpha", "check_passes",
    "policy_laplace_calibration", "policy_gaussian_calibration", "greedy_update_threshold",
    "greedy_update_calibration",
    "policy_cutoff", "calibrate", "csr_from_keys", "fill_order", "run_policy", "release", "numba_available",
    "reporting", "ProgressRelay", "udfs",
]

# Update policy of each method (kernel codes are shared by both kernels).
L1_DESCENT, L2_DESCENT, GREEDY_FILL = 0, 1, 2
POLICIES = {"policy_laplace": L1_DESCENT, "policy_gaussian": L2_DESCENT, "greedy_update": GREEDY_FILL}
DEFAULT_ALPHA = {"policy_laplace": 5.0, "policy_gaussian": 5.0, "greedy_update": 3.0}
MAX_PASSES = 1000

# Kernel the macros use: "auto" (numba when installed), "numba" or "python". For benchmarks and tests.
KERNEL = "auto"

# Entries handed to one kernel call; progress is reported between calls.
_CHUNK_ENTRIES = 1 << 20


# --------------------------------------------------------------------------
# Validation and calibration (pure)
# --------------------------------------------------------------------------

def check_policy(method: object) -> str:
    if not isinstance(method, str) or method not in POLICIES:
        raise DPParameterError(f"method must be one of {', '.join(sorted(POLICIES))} (got {method!r})")
    return method


def check_alpha(alpha: object) -> float:
    """The cutoff multiplier: a finite number > 0 (recommended 2..6, [DPSU] Sec. 4, 5)."""
    if alpha is None or isinstance(alpha, bool):
        raise DPParameterError(f"alpha must be a finite number > 0, e.g. alpha := 5 (got {alpha!r})")
    try:
        value = float(alpha)  # type: ignore[arg-type]  # any value: float() rejects a non-number, caught below
    except (TypeError, ValueError):
        raise DPParameterError(f"alpha must be a finite number > 0, e.g. alpha := 5 (got {alpha!r})") from None
    if not (math.isfinite(value) and value > 0):
        raise DPParameterError(f"alpha must be a finite number > 0, e.g. alpha := 5 (got {alpha!r})")
    return value


def check_passes(passes: object) -> int:
    """The number of passes over the users: an integer 1..MAX_PASSES."""
    msg = f"passes must be an integer between 1 and {MAX_PASSES}, e.g. passes := 1 (got {passes!r})"
    if passes is None or isinstance(passes, bool):
        raise DPParameterError(msg)
    try:
        value = float(passes)  # type: ignore[arg-type]  # any value: float() rejects a non-number, caught below
    except (TypeError, ValueError):
        raise DPParameterError(msg) from None
    if not (math.isfinite(value) and value == int(value) and 1 <= value <= MAX_PASSES):
        raise DPParameterError(msg)
    return int(value)


@user_budget
def policy_laplace_calibration(epsilon: float, delta: float, max_items: int) -> SetUnionCalibration:
    """Policy Laplace ([DPSU] Alg. 4, Thm 4.1): ``Lap(1/eps)``, ``rho_Lap`` with ``h(t) = 1/t``.

    Same noise and threshold as Weighted Laplace: the l1-descent histogram has
    l1 sensitivity 1 and novel items get ``<= 1/t``.
    """
    return basic.weighted_laplace_calibration(epsilon, delta, max_items)


@user_budget
def policy_gaussian_calibration(epsilon: float, delta: float, max_items: int) -> SetUnionCalibration:
    """Policy Gaussian ([DPSU] Alg. 6, Thm 5.1): ``sigma(eps, delta/2)``, ``rho_Gauss`` with ``h(t) = 1/sqrt(t)``."""
    return basic.weighted_gaussian_calibration(epsilon, delta, max_items)


def greedy_update_threshold(epsilon: float, delta: float) -> float:
    """``rho = max(1, ln((e^eps - 1) / (2 delta)) / eps)`` of GreedyUpdate's windowed release.

    The smallest ``rho >= 1`` with ``P[rho - 1 < Lap(1/eps) <= rho] =
    e^{-eps rho} (e^eps - 1) / 2 <= delta`` (point 5 of the module docstring).
    Computed as ``1 + max(0, ln((1 - e^-eps) / (2 delta))) / eps`` (no overflow).
    Example: eps = 1, delta = 1e-5 gives 11.3611 (the support rule's
    ``1 + ln(1/(2 delta))/eps`` = 11.8198 is not private for GreedyUpdate).
    """
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    return 1.0 + max(0.0, math.log(-math.expm1(-epsilon) / (2.0 * delta))) / epsilon


@user_budget
def greedy_update_calibration(epsilon: float, delta: float, max_items: Optional[int] = None) -> SetUnionCalibration:
    """GreedyUpdate: ``Lap(1/eps)`` and :func:`greedy_update_threshold`, for the windowed release.

    The threshold is only valid with ``release(..., window=True)`` (items whose
    noise alone exceeds it are never released). ``max_items`` is ignored
    (GreedyUpdate has no cap).
    """
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    return SetUnionCalibration("laplace", 1.0 / epsilon, greedy_update_threshold(epsilon, delta))


_CALIBRATIONS: dict[str, Callable[[float, float, int], SetUnionCalibration]] = {
    "policy_laplace": policy_laplace_calibration, "policy_gaussian": policy_gaussian_calibration,
    "greedy_update": greedy_update_calibration}


@lru_cache(maxsize=256)
def _cutoff(method: str, epsilon: float, delta: float, max_items: int, alpha: float) -> float:
    cal = _CALIBRATIONS[method](epsilon, delta, max_items)
    gamma = cal.threshold + alpha * cal.scale
    return max(gamma, 1.0) if method == "greedy_update" else gamma


def policy_cutoff(method: str, epsilon: float, delta: float, max_items: int, alpha: float) -> float:
    """The cutoff Gamma of a sequential policy; no weight ever exceeds it.

    * policy_laplace: ``Gamma = rho_Lap + alpha / eps`` ([DPSU] Alg. 4);
    * policy_gaussian: ``Gamma = rho_Gauss + alpha * sigma`` ([DPSU] Sec. 5.2;
      Alg. 6 prints rho_Lap, an erratum);
    * greedy_update: ``Gamma = max(rho + alpha / eps, 1)`` (docs/proofs/greedy_update.md:
      alpha counts Laplace scales; ``rho >= 1``, so ``Gamma > 1`` always).

    Example ([DPSU] setting eps=3, delta=e^-10, max_items=100, alpha=5):
    13.4876 (Gaussian), 6.3140 (Laplace).
    """
    method = check_policy(method)
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    max_items = 1 if method == "greedy_update" else check_max_items(max_items)
    return _cutoff(method, epsilon, delta, max_items, check_alpha(alpha))


def calibrate(method: str, epsilon: float, delta: float, max_items: int) -> SetUnionCalibration:
    """Noise and threshold of a sequential policy method."""
    return _CALIBRATIONS[check_policy(method)](epsilon, delta, max_items)


# --------------------------------------------------------------------------
# CSR
# --------------------------------------------------------------------------

_BLOCK = 1 << 20  # entries per block of the CSR builders' temporaries


def csr_from_keys(keys: np.ndarray, *, keep_order: bool) -> tuple[np.ndarray, np.ndarray]:
    """CSR from packed entries ``user_ordinal << 32 | item_id`` (the macro's list).

    With ``keep_order`` the keys must already be grouped by user in visiting
    order (as ``fill_order``'s fallback hands them over); otherwise they are
    sorted (the order within a user does not matter to the descent policies).
    One array the size of the entries is allocated (the sorted copy, masked in
    place into the ids); the rest works in blocks: fresh pages for arrays of
    this size cost more than the sort itself.
    """
    keys = np.asarray(keys, dtype=np.int64)
    if len(keys) == 0:
        return np.zeros(1, np.int64), np.zeros(0, np.int64)
    keys = keys.copy() if keep_order else np.sort(keys)
    last = -1
    for lo in range(0, len(keys), _BLOCK):
        users = keys[lo:lo + _BLOCK] >> 32
        if keep_order and (users[0] < last or bool(np.any(users[1:] < users[:-1]))):
            raise InputError("dpsql: the entries of a greedy_update run must arrive grouped by user")
        last = int(users[-1])
    counts = np.zeros(last + 1, np.int64)
    for lo in range(0, len(keys), _BLOCK):
        counts += np.bincount(keys[lo:lo + _BLOCK] >> 32, minlength=last + 1)
    indptr = np.zeros(last + 2, np.int64)
    np.cumsum(counts, out=indptr[1:])
    keys &= 0xFFFFFFFF
    return indptr, keys


def fill_order(once: np.ndarray, keys: np.ndarray, mults: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GreedyUpdate's CSR from entries ``user_ordinal << 32 | item_id``.

    ``once`` holds the entries of multiplicity 1, ``keys`` the others with
    their multiplicities ``mults`` (most tables repeat few pairs: those
    entries need no multiplicity). Users come in ordinal order; each user's
    items most repeated first, ties by item id (the ids follow the global item
    order). The engine hands the entries over unordered (an ordered list
    aggregate costs more than the rest of the release); when the three fields
    fit in 63 bits one in-place sort of packed integers orders them, otherwise
    an exact (slower) lexicographic sort does.
    """
    once, keys, mults = (np.asarray(a, dtype=np.int64) for a in (once, keys, mults))
    if len(keys) != len(mults):
        raise InputError("dpsql: greedy_update needs one multiplicity per repeated entry")
    parts: list[tuple[np.ndarray, Optional[np.ndarray]]] = [(once, None), (keys, mults)]
    n = len(once) + len(keys)
    if n == 0:
        return np.zeros(1, np.int64), np.zeros(0, np.int64)
    top = int(mults.max()) if len(mults) else 1
    top_user = top_id = 0
    for arr, _ in parts:
        for lo in range(0, len(arr), _BLOCK):
            block = arr[lo:lo + _BLOCK]
            top_user = max(top_user, int(block.max() >> 32))
            top_id = max(top_id, int((block & 0xFFFFFFFF).max()))
    id_bits = top_id.bit_length()
    shift = top.bit_length() + id_bits
    if top_user.bit_length() + shift > 63:
        everything = np.concatenate([once, keys])
        every_m = np.concatenate([np.ones(len(once), np.int64), mults])
        return csr_from_keys(everything[np.lexsort((everything & 0xFFFFFFFF, -every_m, everything >> 32))],
                             keep_order=True)
    # One array of (ordinal << shift | (top - m) << id_bits | id), sorted in place; the temporaries are
    # blocks, since the entries of a whole table are the largest arrays of the release.
    packed = np.empty(n, np.int64)
    counts = np.zeros(top_user + 1, np.int64)
    at = 0
    for arr, ms in parts:
        for lo in range(0, len(arr), _BLOCK):
            block = arr[lo:lo + _BLOCK]
            users = block >> 32
            counts += np.bincount(users, minlength=top_user + 1)
            rank = (top - 1) if ms is None else (top - ms[lo:lo + _BLOCK])
            packed[at:at + len(block)] = (users << shift) | (rank << id_bits) | (block & 0xFFFFFFFF)
            at += len(block)
    packed.sort()
    packed &= (1 << id_bits) - 1
    indptr = np.zeros(top_user + 2, np.int64)
    np.cumsum(counts, out=indptr[1:])
    return indptr, packed


# --------------------------------------------------------------------------
# Kernels. Both do exactly the same floating-point operations in the same order,
# so their histograms are bit-identical (tests check it).
# --------------------------------------------------------------------------

def _python_users(kind: int, indptr: list, idx: list, base: int, H, gamma: float, beta: float) -> None:
    """Pure-Python kernel over the users of one chunk (``idx`` holds their entries from ``base`` on)."""
    for u in range(len(indptr) - 1):
        items = idx[indptr[u] - base:indptr[u + 1] - base]
        if kind == L1_DESCENT:
            hs = [H[i] for i in items]
            gaps = [gamma - h for h in hs if h < gamma]
            if not gaps:
                continue
            k = len(gaps)
            budget = beta
            level = 0.0
            # Usual case: the budget runs out before the smallest gap is filled. This is the first
            # step of the loop below (level = 0 + budget/k), without sorting.
            if min(gaps) * k > budget:
                level = budget / k
            else:
                gaps.sort()
                for g in gaps:
                    need = (g - level) * k
                    if need <= budget:
                        budget -= need
                        level = g
                        k -= 1
                    else:
                        level += budget / k
                        break
            for i, h in zip(items, hs):
                if h < gamma:
                    # An item whose gap is covered lands exactly on Gamma (h + gap may round above it).
                    H[i] = gamma if gamma - h <= level else h + level
        elif kind == L2_DESCENT:
            hs = [H[i] for i in items]
            z2 = 0.0
            for h in hs:
                g = gamma - h
                z2 += g * g  # sequential sum, in the same order as the compiled kernel
            if z2 == 0.0:
                continue
            z = math.sqrt(z2)
            if z < beta:
                for i in items:
                    H[i] = gamma
            else:
                c = beta / z
                for i, h in zip(items, hs):
                    v = h + (gamma - h) * c
                    H[i] = v if v < gamma else gamma
        else:
            budget = beta
            for i in items:
                h = H[i]
                if h < gamma:
                    g = gamma - h
                    if g < budget:
                        H[i] = gamma
                        budget -= g
                    else:
                        H[i] = min(gamma, h + budget)
                        break


def _python_kernel(kind, indptr, indices, H, gamma, beta, start, stop):
    ptr = indptr[start:stop + 1].tolist()
    idx = indices[ptr[0]:ptr[-1]].tolist()
    # array('d') keeps the histogram at 8 bytes per item and hands out Python floats.
    hist = array("d", H.tobytes())
    _python_users(kind, ptr, idx, ptr[0], hist, gamma, beta)
    H[:] = np.frombuffer(hist, dtype=np.float64)


_NUMBA_KERNEL = None
_NUMBA_LOCK = threading.Lock()


def numba_available() -> bool:
    """True when the compiled kernel can be used (numba, the ``fast`` extra, is installed)."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def _numba_kernel():
    """Compile (once, lazily: importing numba costs a second) the kernel; None without numba."""
    global _NUMBA_KERNEL
    with _NUMBA_LOCK:
        if _NUMBA_KERNEL is None and numba_available():
            import numba

            @numba.njit(cache=True, nogil=True)
            def kernel(kind, indptr, indices, H, gamma, beta, start, stop):  # pragma: no cover (compiled)
                width = 1
                for u in range(start, stop):
                    width = max(width, indptr[u + 1] - indptr[u])
                gaps = np.empty(width, np.float64)
                for u in range(start, stop):
                    a = indptr[u]
                    b = indptr[u + 1]
                    if kind == 0:  # L1_DESCENT (1: L2_DESCENT, 2: GREEDY_FILL); same steps as _python_users
                        k = 0
                        gmin = np.inf
                        for j in range(a, b):
                            h = H[indices[j]]
                            if h < gamma:
                                gaps[k] = gamma - h
                                gmin = min(gmin, gaps[k])
                                k += 1
                        if k == 0:
                            continue
                        if gmin * k > beta:
                            level = beta / k
                            for j in range(a, b):
                                i = indices[j]
                                h = H[i]
                                if h < gamma:
                                    H[i] = gamma if gamma - h <= level else h + level
                            continue
                        srt = gaps[:k]
                        if k <= 64:  # insertion sort: no allocation, fastest for the typical capped user
                            for x in range(1, k):
                                v = srt[x]
                                y = x - 1
                                while y >= 0 and srt[y] > v:
                                    srt[y + 1] = srt[y]
                                    y -= 1
                                srt[y + 1] = v
                        else:
                            srt.sort()
                        budget = beta
                        level = 0.0
                        for m in range(srt.shape[0]):
                            g = srt[m]
                            need = (g - level) * k
                            if need <= budget:
                                budget -= need
                                level = g
                                k -= 1
                            else:
                                level += budget / k
                                break
                        for j in range(a, b):
                            i = indices[j]
                            h = H[i]
                            if h < gamma:
                                H[i] = gamma if gamma - h <= level else h + level
                    elif kind == 1:
                        z2 = 0.0
                        for j in range(a, b):
                            g = gamma - H[indices[j]]
                            z2 += g * g
                        if z2 == 0.0:
                            continue
                        z = math.sqrt(z2)
                        if z < beta:
                            for j in range(a, b):
                                H[indices[j]] = gamma
                        else:
                            c = beta / z
                            for j in range(a, b):
                                i = indices[j]
                                h = H[i]
                                H[i] = min(gamma, h + (gamma - h) * c)
                    else:
                        budget = beta
                        for j in range(a, b):
                            i = indices[j]
                            h = H[i]
                            if h < gamma:
                                g = gamma - h
                                if g < budget:
                                    H[i] = gamma
                                    budget -= g
                                else:
                                    H[i] = min(gamma, h + budget)
                                    break

            _NUMBA_KERNEL = kernel
        return _NUMBA_KERNEL


def run_policy(kind: int, indptr: np.ndarray, indices: np.ndarray, n_items: int, gamma: float, passes: int = 1,
               *, kernel: str = "auto", progress: Optional[Callable[[float], None]] = None,
               initial: Optional[np.ndarray] = None) -> np.ndarray:
    """The histogram of ``passes`` passes of policy ``kind`` over the users of a CSR, in order.

    Each pass gives every user the budget ``1/passes``. ``kernel`` is ``"numba"``,
    ``"python"`` or ``"auto"`` (numba when installed). ``progress``, if given, is
    called with the fraction of work done (0..1) between chunks of users.
    ``initial`` (copied) is the histogram to start from instead of zeros.
    NOT a release: the exact histogram (tests and audits use it).
    """
    if kind not in (L1_DESCENT, L2_DESCENT, GREEDY_FILL):
        raise ParameterError(f"unknown policy kind {kind!r}")
    passes = check_passes(passes)
    if not (math.isfinite(gamma) and gamma > 0):
        raise ParameterError(f"gamma must be a finite number > 0 (got {gamma!r})")
    if kernel == "auto":
        kernel = "numba" if numba_available() else "python"
    if kernel == "numba":
        fn = _numba_kernel()
        if fn is None:
            raise ImportError("kernel='numba' needs numba: pip install '.[fast]' in dpsql's checkout")
    elif kernel == "python":
        fn = _python_kernel
    else:
        raise ParameterError(f"kernel must be 'auto', 'numba' or 'python' (got {kernel!r})")
    indptr = np.ascontiguousarray(indptr, dtype=np.int64)
    indices = np.ascontiguousarray(indices, dtype=np.int64)
    if initial is None:
        H = np.zeros(int(n_items), dtype=np.float64)
    else:
        H = np.array(initial, dtype=np.float64)
        if H.shape != (int(n_items),):
            raise ParameterError("initial must have n_items entries")
    beta = 1.0 / passes
    n_users = len(indptr) - 1
    # User boundaries of chunks of about _CHUNK_ENTRIES entries.
    cuts = np.searchsorted(indptr, np.arange(0, int(indptr[-1]), _CHUNK_ENTRIES, dtype=np.int64), side="right") - 1
    bounds = sorted(set(int(c) for c in cuts) | {0, n_users})
    total = passes * max(1, int(indptr[-1]))
    for p in range(passes):
        for start, stop in zip(bounds[:-1], bounds[1:]):
            if stop > start:
                fn(kind, indptr, indices, H, float(gamma), beta, start, stop)
            if progress is not None:
                progress((p * int(indptr[-1]) + int(indptr[stop])) / total)
    if progress is not None:  # done, whatever the work (no users: no chunk above reported)
        progress(1.0)
    return H


# --------------------------------------------------------------------------
# Release
# --------------------------------------------------------------------------

def release(H: np.ndarray, cal: SetUnionCalibration, source: NoiseSource, *, window: bool = False) -> np.ndarray:
    """Dense ids ``i`` with ``H[i] > 0`` and ``H[i] + noise > threshold`` ([DPSU] Alg. 1 step 3).

    Noise is one draw per support item from ``source`` (Laplace or Gaussian of
    ``cal.scale``). Items outside the support are never candidates. With
    ``window`` (GreedyUpdate, Laplace only) an item is released only if also
    ``noise <= threshold``: ``P[release] = P[threshold - H[i] < noise <= threshold]``
    is 0 at ``H[i] = 0`` and continuous, so zero-weight items need no
    separate argument (module docstring, point 5).
    """
    if window and cal.noise != "laplace":
        raise ParameterError("the windowed release is calibrated for Laplace noise only")
    support = np.flatnonzero(H > 0)
    if len(support) == 0:
        return support
    scale = np.full(len(support), cal.scale)
    noise = source.laplace(scale) if cal.noise == "laplace" else source.gaussian(scale)
    keep = H[support] + noise > cal.threshold
    if window:
        keep &= noise <= cal.threshold
    return support[keep]


# --------------------------------------------------------------------------
# Progress: the kernel runs inside the engine and reports the share of its work done, in whole
# twentieths, to the listener on the connection's noise source (dpsql.core.progress.shares;
# dpsql.core.runner.run listens while it runs).
# --------------------------------------------------------------------------

reporting = progress_steps.reporting


# --------------------------------------------------------------------------
# UDFs
# --------------------------------------------------------------------------

# DuckDB evaluates the (pure) calibration UDF once per reference of its CTE: the row is computed once
# per parameter set (failures are not cached: they raise every time).
@lru_cache(maxsize=128)
def _policy_row(method, epsilon, delta, max_items, alpha, passes) -> tuple:
    method = check_policy(method)
    cal = calibrate(method, epsilon, delta, 1 if method == "greedy_update" else max_items)
    gamma = policy_cutoff(method, epsilon, delta, max_items, alpha)
    return (("noise", cal.noise), ("scale", cal.scale), ("threshold", cal.threshold), ("gamma", gamma),
            ("n_passes", check_passes(passes)))


def _calibration_row(method, epsilon, delta, max_items, alpha, passes, user_col, item_col):
    check_column_pair(user_col, item_col)
    row = dict(_policy_row(method, epsilon, delta, max_items, alpha, passes))
    return row


def _list_values(arr: pa.Array) -> Optional[pa.Array]:
    """The values of the single list of a one-row list column; None for no rows (list() of none is NULL)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if len(arr) != 1:
        raise InputError("dpsql: the policy kernel expects one row (the whole table as one list)")
    return None if arr.null_count else arr.values


def _int64(values: Optional[pa.Array]) -> np.ndarray:
    if values is None:
        return np.zeros(0, np.int64)
    return values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _flat(arr: pa.Array) -> np.ndarray:
    """The values of the single list of a one-row list column, as int64 numpy."""
    return _int64(_list_values(arr))


def _flat_entries(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The keys and multiplicities of a one-row list of ``{k, m}`` structs, as int64 numpy."""
    values = _list_values(arr)
    keys, mults = (_int64(None if values is None else values.field(f)) for f in ("k", "m"))
    return keys, mults


def udfs(source: NoiseSource) -> list[Udf]:
    """Calibration (pure) and the release UDF (draws noise: side effects) of the policy macros."""

    def policy_release(method, keys, entries, noise, scale, threshold, gamma, passes):
        method = check_policy(method[0].as_py())
        if method == "greedy_update":
            indptr, indices = fill_order(_flat(keys), *_flat_entries(entries))
        else:
            indptr, indices = csr_from_keys(_flat(keys), keep_order=False)
        cal = SetUnionCalibration(noise[0].as_py(), float(scale[0].as_py()), float(threshold[0].as_py()))
        n_items = int(indices.max()) + 1 if len(indices) else 0
        H = run_policy(POLICIES[method], indptr, indices, n_items, float(gamma[0].as_py()), int(passes[0].as_py()),
                       kernel=KERNEL, progress=progress_steps.shares(source))
        released = release(H, cal, source, window=method == "greedy_update")
        del H  # the exact histogram never leaves this function
        return pa.array([released], type=pa.list_(pa.int64()))

    def cutoff(method, epsilon, delta, max_items, alpha):
        return policy_cutoff(method, epsilon, delta, max_items, alpha)

    d = DOUBLE
    return [
        Udf("dp__policy_calibration", scalar(_calibration_row), (VARCHAR, d, d, d, d, d, VARCHAR, VARCHAR),
            duckdb.struct_type({"noise": VARCHAR, "scale": DOUBLE, "threshold": DOUBLE, "gamma": DOUBLE,
                                "n_passes": BIGINT})),
        Udf("dp__policy_cutoff", scalar(cutoff), (VARCHAR, d, d, d, d), DOUBLE),
        Udf("dp__policy_release", policy_release,
            (VARCHAR, duckdb.list_type(BIGINT), duckdb.list_type(duckdb.struct_type({"k": BIGINT, "m": BIGINT})),
             VARCHAR, d, d, d, BIGINT),
            duckdb.list_type(BIGINT), side_effects=True),
    ]


class ProgressRelay:
    """Merge the engine's percentage and the kernel's fraction into one non-decreasing percentage.

    The engine reports while it scans and joins; the kernel then reports the
    share of users processed, mapped onto what remains below 100 %.
    """

    def __init__(self, progress: Callable[[float], None]):
        self._progress: Optional[Callable[[float], None]] = progress
        self._lock = threading.Lock()
        self._last = -1.0
        self._kernel_base: Optional[float] = None

    def _emit(self, pct: float) -> None:
        with self._lock:
            if pct <= self._last or self._progress is None:
                return
            self._last = pct
        try:
            self._progress(pct)
        except Exception as exc:
            # The kernel runs after the charge: a failing callback must not lose the release.
            warnings.warn(f"dpsql: the progress callback failed ({type(exc).__name__}); progress is no longer "
                          f"reported, the release goes on", RuntimeWarning, stacklevel=2)
            self._progress = None

    def engine(self, pct: float) -> None:
        if self._kernel_base is None or pct >= 100:
            self._emit(pct)

    def kernel(self, fraction: float) -> None:
        with self._lock:
            if self._kernel_base is None:
                self._kernel_base = max(self._last, 0.0)
            base = self._kernel_base
        self._emit(base + (99.0 - base) * min(max(fraction, 0.0), 1.0))


# -- declarations (dpsql.core.mechanism) ------------------------------------------------------------------

def _alpha(method: str) -> Param:
    return Param("alpha", "DOUBLE", DEFAULT_ALPHA[method], check_alpha, "cutoff multiplier")


_PASSES = Param("passes", "DOUBLE", 1, check_passes, "passes over the users")


def check_order_tbl(value: object) -> Optional[str]:
    """None, or the name of a PUBLIC table of items (e.g. an earlier DP release) greedy_update fills first."""
    return None if value is None else check_table_name(value)


def check_order_col(value: object) -> Optional[str]:
    """None, or the column of ``order_tbl`` whose ascending values order its items (e.g. ``rank``)."""
    return None if value is None else check_identifier("order_col", value)


_ORDER = (Param("order_tbl", "VARCHAR", None, check_order_tbl,
                "public table of items filled first (not the private table)"),
          Param("order_col", "VARCHAR", None, check_order_col, "column of order_tbl: fill its items by ascending value"))

# Audit cases (dpsql.tools.audit): users holding one item each, weights at least 1 below the cutoff (the
# same weights in every visiting order), and the row-order attack.
_ORDER_CASE = AuditCase("order", note="row order, added row stored first")

MECHANISMS: tuple[Mechanism, ...] = (
    Mechanism(
        name="policy_laplace", family="set_union", macro="dp_set_union_policy_laplace", unit="user",
        params=user_item_params(_alpha("policy_laplace"), _PASSES),
        description="sequential l1-descent towards a cutoff, Laplace noise ([DPSU] Alg. 4)",
        proof="policy_laplace", calibrate=policy_laplace_calibration, rounds=1, sql="30_union/40_policy.sql",
        example=user_item_example(alpha="5", passes="1"),
        audit=(AuditCase("policy"),
               AuditCase("order", options=(("max_items", 100), ("threads", 2)),
                         note="row order, added row stored first, 2 threads"))),
    Mechanism(
        name="policy_gaussian", family="set_union", macro="dp_set_union_policy_gaussian", unit="user",
        params=user_item_params(_alpha("policy_gaussian"), _PASSES),
        description="sequential l2-descent towards a cutoff, Gaussian noise ([DPSU] Alg. 6)",
        proof="policy_gaussian", calibrate=policy_gaussian_calibration, rounds=1, sql="30_union/40_policy.sql",
        # the zCDP route of dp_top_k: its single release is the Gaussian of sigma(epsilon, delta/2) per unit
        gaussian_domain=True, example=user_item_example(alpha="5", passes="1"),
        audit=(AuditCase("policy"), _ORDER_CASE)),
    Mechanism(
        name="greedy_update", family="set_union", macro="dp_set_union_greedy_update", unit="user",
        params=user_item_params(_alpha("greedy_update"), *_ORDER, cap=False),
        description="sequential greedy fill, most repeated items first, then one keyed global item order "
                    "(or a public order_tbl), no max_items cap, Laplace noise (Carvalho et al. 2022)",
        proof="greedy_update", calibrate=greedy_update_calibration, rounds=1, sql="30_union/40_policy.sql",
        example=user_item_example(EXAMPLE_USER_ITEMS + "; " + EXAMPLE_PUBLIC_ORDER, max_items=None, alpha="3",
                                  order_tbl="'o'", order_col="'rank'"),
        # where most users hold few items it releases the most of the set-union methods (benchmarks/README.md,
        # "Robustness grid"): the method a choice between methods runs there
        roles=("few_items",),
        audit=(AuditCase("greedy", options=(("alpha", 3.0),)), _ORDER_CASE)),
)
