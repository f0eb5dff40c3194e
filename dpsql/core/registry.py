"""Every mechanism dpsql ships, collected from the declarations beside their code.

Front ends derive from this list: the CLI, the Spark backend, the audit's coverage check and the
tests that enumerate mechanisms (``tests/test_mechanisms.py`` checks each declaration against the
registered SQL macro, its proof note, and every front end). The set-union methods, which the
``dp_set_union`` dispatcher and the top-k domain step choose among, are :data:`dpsql.union.METHODS`.
"""
from __future__ import annotations

from functools import lru_cache
from types import ModuleType

from dpsql import groupby, optimize, pws, topk, union
from dpsql.core.mechanism import Mechanism

__all__ = ["FAMILY_MODULES", "all_mechanisms", "set_union_methods", "by_macro", "families"]

# The modules declaring the other families' mechanisms (``MECHANISMS``); registration also registers
# their ``udfs``. The set-union modules are :data:`dpsql.union.FAMILY_MODULES`.
FAMILY_MODULES: tuple[ModuleType, ...] = (topk, pws, optimize, groupby)


def set_union_methods() -> dict[str, Mechanism]:
    """Set-union method name -> declaration, in the order front ends list them."""
    return dict(union.METHODS)


@lru_cache(maxsize=1)
def _all() -> tuple[Mechanism, ...]:
    found = tuple(union.METHODS.values()) + tuple(m for mod in FAMILY_MODULES for m in mod.MECHANISMS)
    names = [m.name for m in found]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise TypeError(f"dpsql: mechanisms declared twice: {dupes}")
    return found


def all_mechanisms() -> dict[str, Mechanism]:
    """Mechanism name -> declaration, for every releasing mechanism."""
    return {m.name: m for m in _all()}


def by_macro() -> dict[str, Mechanism]:
    """SQL macro name -> declaration."""
    return {m.macro: m for m in _all()}


def families() -> dict[str, tuple[Mechanism, ...]]:
    """Family -> its mechanisms."""
    out: dict[str, list[Mechanism]] = {}
    for m in _all():
        out.setdefault(m.family, []).append(m)
    return {k: tuple(v) for k, v in out.items()}
