"""NON-PRIVATE evaluation of released item sets: missing mass, top-k missing mass, hits, coverage.

Everything here reads the RAW data and returns exact statistics of it. Nothing
here is differentially private and nothing here may be published; these
functions exist to judge mechanisms on data one is allowed to look at
(tests, benchmarks, demos). The SQL counterparts are the ``dp_eval_*`` macros
of ``sql/60_tools/evaluation.sql``; :func:`evaluate` runs them.

Definitions ([MM] Dick, Joseph & Raman, Sec. 2 and 4). Users hold sets
``W_i``; ``N(x) = #{i : x in W_i}``, ``N = sum_x N(x)``, ``N_(r)`` the r-th
largest ``N(x)``.

* ``MM_p(W, S) = ||(N(x)/N)_{x not in S}||_p``: p = 1 is the missing mass MM,
  p = 0 the number of missed items, p = inf the largest missed share;
* ``MM^k(W, S) = (sum_{i<=k} N_(i) - sum_{x in S} N(x)) / N`` for ``|S| <= k``;
* ``Hits(W, S) = #{i : W_i meets S}``; the non-private greedy
  (:func:`greedy_hitting_set`) is the reference for ``Opt(W, k)``.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Hashable, Iterable, Mapping, Optional, Sequence

import duckdb

from dpsql.core.validation import DPParameterError, check_identifier, check_table_name, sql_string

__all__ = ["item_counts", "missing_mass", "top_k_missing_mass", "hits", "greedy_hitting_set",
           "coverage_by_frequency", "evaluate"]

UserSets = Mapping[Hashable, Iterable[Hashable]]


def item_counts(user_sets: UserSets) -> Counter:
    """``N(x)`` for every item (each user counted once per item). NON-PRIVATE."""
    counts: Counter = Counter()
    for items in user_sets.values():
        counts.update(set(items))
    return counts


def _check_p(p: float) -> float:
    if p is None or isinstance(p, bool) or not isinstance(p, (int, float)) or math.isnan(p) or p < 0:
        raise DPParameterError(f"p must be a number >= 0 or math.inf (got {p!r})")
    return float(p)


def missing_mass(user_sets: UserSets, released: Iterable[Hashable], p: float = 1.0) -> float:
    """``MM_p(W, S)`` (p = 0: number of missed items; p = inf: largest missed share). NON-PRIVATE."""
    p = _check_p(p)
    counts = item_counts(user_sets)
    total = sum(counts.values())
    released = set(released)
    shares = [n / total for x, n in counts.items() if x not in released] if total else []
    if p == 0:
        return float(len(shares))
    if math.isinf(p):
        return max(shares, default=0.0)
    return sum(s ** p for s in shares) ** (1.0 / p) if shares else 0.0


def top_k_missing_mass(user_sets: UserSets, released: Sequence[Hashable], k: int) -> float:
    """``MM^k(W, S)`` for an ordered S of at most k items. NON-PRIVATE."""
    if len(released) > k:
        raise DPParameterError(f"released holds {len(released)} items, more than k = {k}")
    counts = item_counts(user_sets)
    total = sum(counts.values())
    if not total:
        return 0.0
    top = sum(sorted(counts.values(), reverse=True)[:k])
    return (top - sum(counts.get(x, 0) for x in set(released))) / total


def hits(user_sets: UserSets, released: Iterable[Hashable]) -> int:
    """Number of users holding at least one released item. NON-PRIVATE."""
    released = set(released)
    return sum(1 for items in user_sets.values() if released.intersection(items))


def greedy_hitting_set(user_sets: UserSets, k: int, domain: Optional[Iterable[Hashable]] = None) -> list:
    """The NON-PRIVATE greedy k-hitting set (the reference for ``Opt``; (1-1/e)-optimal).

    Each round takes the item of ``domain`` (default: every item) held by the
    most not-yet-hit users; ties go to the smallest item in sort order. Runs
    ``min(k, |domain|)`` rounds, like the private user peeling.
    """
    sets = {u: set(items) for u, items in user_sets.items()}
    remaining = set(item_counts(sets)) if domain is None else set(domain)
    chosen: list = []
    alive = set(sets)
    for _ in range(min(k, len(remaining))):
        gain: Counter = Counter()
        for u in alive:
            gain.update(sets[u] & remaining)
        best = min(remaining, key=lambda x: (-gain.get(x, 0), x))
        chosen.append(best)
        remaining.discard(best)
        alive = {u for u in alive if best not in sets[u]}
    return chosen


def coverage_by_frequency(user_sets: UserSets, released: Iterable[Hashable]) -> list[tuple[int, int, int]]:
    """``(bucket, items, released_items)`` with bucket ``b`` = items with ``2^b <= N(x) < 2^(b+1)``. NON-PRIVATE."""
    released = set(released)
    buckets: dict[int, list[int]] = {}
    for x, n in item_counts(user_sets).items():
        b = buckets.setdefault(n.bit_length() - 1, [0, 0])
        b[0] += 1
        b[1] += x in released
    return [(b, v[0], v[1]) for b, v in sorted(buckets.items())]



def evaluate(con: duckdb.DuckDBPyConnection, table: str, released_table: str, *, k: Optional[int] = None,
             user_col: str = "user_id", item_col: str = "item", released_col: str = "item") -> dict:
    """Run every ``dp_eval_*`` macro on the raw ``table`` against the items in column ``released_col``
    of ``released_table`` (the macros' ``tbl`` and ``released_tbl``). NON-PRIVATE.

    Returns a dict: ``missing_mass`` (p = 1), ``missing_mass_p`` (p = 0, 1, 2,
    inf as keys ``"0"``, ``"1"``, ``"2"``, ``"inf"``), ``hits``, ``users``,
    ``released_items``, ``top_k_missing_mass`` (when ``k`` is given) and
    ``coverage_by_frequency`` (list of dicts).
    """
    table, released_table = check_table_name(table), check_table_name(released_table)
    cols = (f"user_col := {sql_string(check_identifier('user_col', user_col))}, "
            f"item_col := {sql_string(check_identifier('item_col', item_col))}, "
            f"released_col := {sql_string(check_identifier('released_col', released_col))}")
    t, r = sql_string(table), sql_string(released_table)
    mm = {}
    for key, p in (("0", "0"), ("1", "1"), ("2", "2"), ("inf", "'infinity'::DOUBLE")):
        [(_, value)] = con.sql(f"FROM dp_eval_missing_mass({t}, {r}, p := {p}, {cols})").fetchall()
        mm[key] = value
    [(hit, users)] = con.sql(f"FROM dp_eval_hits({t}, {r}, {cols})").fetchall()
    [(n_released,)] = con.sql(f"SELECT count(*) FROM dp__eval_released_items({r}, "
                              f"released_col := {sql_string(released_col)})").fetchall()
    doc: dict = {"missing_mass": mm["1"], "missing_mass_p": mm, "hits": hit, "users": users,
                 "released_items": n_released}
    if k is not None:
        [(_, _, value)] = con.sql(f"FROM dp_eval_top_k_missing_mass({t}, {r}, {float(k)!r}, {cols})").fetchall()
        doc["top_k_missing_mass"] = value
        doc["k"] = int(k)
    rows = con.sql(f"FROM dp_eval_coverage_by_frequency({t}, {r}, {cols})").fetchall()
    doc["coverage_by_frequency"] = [
        {"bucket": b, "min_frequency": lo, "max_frequency": hi, "items": n, "released_items": m}
        for b, lo, hi, n, m in rows]
    return doc
