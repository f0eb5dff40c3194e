"""Every mechanism dpsql knows, discovered from the declarations beside their code.

**Discovery.** Every subpackage of ``dpsql`` but ``core``, ``frontends`` and ``tools`` is a family:
on first use the registry imports it and its member modules (``pkgutil`` and ``importlib``, by the
names it finds: the core imports no family by name) and collects from each module

* ``MECHANISMS``: its declarations (:class:`dpsql.core.mechanism.Mechanism`);
* ``udfs(source) -> list[Udf]``: the UDFs its SQL calls (:mod:`dpsql.core.registration` registers them);
* ``generated_sql() -> str``: SQL generated from its declarations beyond the releasing macros, created
  after them (the set-union family's ``dp_set_union``).

A family from outside the package goes through the same hook as dpsql's own: :func:`add_family`
(its modules, and the folder of its proof notes); :func:`remove_family` takes it out again. Its
declarations name their SQL body files by absolute path; registration loads them after the package's.

**Order.** Mechanisms are listed in the order of their body's SQL file (``Mechanism.sql``: the SQL
load order, e.g. ``30_union/10_basic.sql`` before ``30_union/20_adaptive.sql``), then of their
module's ``MECHANISMS``; the families added from outside follow, in the order they were added. Front
ends list them in this order (the set-union methods: basic, adaptive, cumulative, policy).

Front ends derive from this registry: the CLI, the Spark backend, the audit's cases and the tests that
enumerate mechanisms (``tests/conformance/test_mechanisms.py`` checks each declaration against the registered SQL
macro, its proof note, and every front end). The set-union methods, which the ``dp_set_union``
dispatcher and the top-k domain step choose among, are :data:`dpsql.union.METHODS`.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Optional, Sequence, Union

from dpsql.core.mechanism import Mechanism

__all__ = ["Family", "package_modules", "declared_in", "add_family", "remove_family", "registered_families",
           "family_of", "all_mechanisms", "set_union_methods", "by_macro", "families", "udf_providers",
           "generated_sql", "sql_files"]

# Subpackages of dpsql that are not families: the shared machinery, the front ends, the tools.
NOT_FAMILIES = frozenset({"core", "frontends", "tools"})


@dataclass(frozen=True)
class Family:
    """A family as registered: the modules it was collected from and what they declare.

    ``name`` is its entry module's name (e.g. ``dpsql.union``); ``proofs`` the folder of its proof
    notes (``None``: dpsql's ``docs/proofs``).
    """

    name: str
    modules: tuple[ModuleType, ...]
    mechanisms: tuple[Mechanism, ...]
    udfs: tuple[Callable[[Any], list], ...]
    generated: tuple[Callable[[], str], ...]
    proofs: Optional[Path] = None
    discovered: bool = False  # one of dpsql's own subpackages


def package_modules(package: str) -> tuple[ModuleType, ...]:
    """``package`` and its member modules (imported by name, in name order), the package first.

    A family's entry module may call this while it is being imported (``dpsql.union`` collects its
    methods so): its members are imported then, and the entry module is returned as it stands.
    """
    pkg = importlib.import_module(package)
    members = sorted(info.name for info in pkgutil.iter_modules(getattr(pkg, "__path__", [])))
    return (pkg,) + tuple(importlib.import_module(f"{package}.{name}") for name in members)


def _sql_key(mech: Mechanism) -> tuple[bool, str]:
    return (Path(mech.sql).is_absolute(), mech.sql)


def declared_in(modules: Sequence[ModuleType]) -> tuple[Mechanism, ...]:
    """The declarations (``MECHANISMS``) of ``modules``, each once, in the order of their SQL files."""
    found: list[Mechanism] = []
    seen: set[int] = set()
    for module in modules:
        for mech in getattr(module, "MECHANISMS", ()):
            if id(mech) not in seen:
                seen.add(id(mech))
                found.append(mech)
    return tuple(sorted(found, key=_sql_key))  # stable: a module's order within one file


def _functions(modules: Sequence[ModuleType], name: str) -> tuple[Callable, ...]:
    """Each module's function ``name``, each function once (a module may re-export another's)."""
    out: list[Callable] = []
    for module in modules:
        fn = getattr(module, name, None)
        if inspect.isfunction(fn) and fn not in out:
            out.append(fn)
    return tuple(out)


_lock = threading.RLock()
_families: Optional[dict[str, Family]] = None  # None until discovered
_cache: dict[str, Any] = {}


def _check_unique(mechanisms: Sequence[Mechanism]) -> None:
    for what in ("name", "macro"):
        values = [getattr(m, what) for m in mechanisms]
        dupes = sorted({v for v in values if values.count(v) > 1})
        if dupes:
            raise TypeError(f"dpsql: mechanisms declared twice ({what}): {dupes}")


def _add(registry: dict[str, Family], modules: Sequence[ModuleType], proofs: Optional[Path],
         name: Optional[str], discovered: bool = False) -> Family:
    if not modules:
        raise TypeError("dpsql: add_family needs at least one module")
    family = Family(name or modules[0].__name__, tuple(modules), declared_in(modules), _functions(modules, "udfs"),
                    _functions(modules, "generated_sql"), proofs, discovered)
    if family.name in registry:
        raise TypeError(f"dpsql: a family {family.name!r} is registered already; remove_family it first")
    _check_unique([m for f in registry.values() for m in f.mechanisms] + list(family.mechanisms))
    registry[family.name] = family
    _cache.clear()
    return family


def _registry() -> dict[str, Family]:
    """The registered families, dpsql's own discovered on first use."""
    global _families
    with _lock:
        if _families is None:
            import dpsql  # the package is initialised by now: the registry is first used after its import

            found: dict[str, Family] = {}
            for info in sorted(pkgutil.iter_modules(dpsql.__path__), key=lambda i: i.name):
                if info.ispkg and info.name not in NOT_FAMILIES:
                    _add(found, package_modules(f"dpsql.{info.name}"), None, None, discovered=True)
            _families = found
        return _families


def add_family(*modules: ModuleType, proofs: Union[None, str, Path] = None, name: Optional[str] = None) -> Family:
    """Register the family declared by ``modules`` (each one's ``MECHANISMS``, ``udfs``, ``generated_sql``).

    The hook dpsql's own families go through when they are discovered, for a family from outside the
    package: connections registered afterwards get its UDFs, its SQL files and its releasing macros,
    and every front end that derives from the registry lists it. ``proofs``: the folder of its proof
    notes. Refused when a name or macro is declared already.
    """
    with _lock:
        return _add(_registry(), modules, None if proofs is None else Path(proofs), name)


def remove_family(family: Union[Family, str]) -> None:
    """Take a family added by :func:`add_family` out of the registry. Connections registered afterwards
    lack it; on those registered before, its releasing macros remain but refuse to run (their check
    no longer finds the declaration), before anything is read or charged."""
    with _lock:
        registry = _registry()
        key = family.name if isinstance(family, Family) else family
        if key not in registry:
            raise KeyError(f"dpsql: no family {key!r} is registered")
        del registry[key]
        _cache.clear()


def registered_families() -> tuple[Family, ...]:
    """Every registered family, dpsql's own first (in discovery order), then those added."""
    return tuple(_registry().values())


def _all() -> tuple[Mechanism, ...]:
    with _lock:
        families = list(_registry().values())  # discovery first: it clears the cache
        if "all" not in _cache:
            own = [m for f in families if f.discovered for m in f.mechanisms]
            added = [m for f in families if not f.discovered for m in f.mechanisms]
            # dpsql's own by their SQL files across families; the added ones after them, as added
            _cache["all"] = tuple(sorted(own, key=_sql_key)) + tuple(added)
        return _cache["all"]


def family_of(mech: Union[Mechanism, str]) -> Family:
    """The registered family that declares ``mech`` (a declaration or its name)."""
    name = mech.name if isinstance(mech, Mechanism) else mech
    for family in _registry().values():
        if any(m.name == name for m in family.mechanisms):
            return family
    raise KeyError(f"dpsql: no registered family declares {name!r}")


def all_mechanisms() -> dict[str, Mechanism]:
    """Mechanism name -> declaration, for every releasing mechanism, in the registry's order."""
    return {m.name: m for m in _all()}


def set_union_methods() -> dict[str, Mechanism]:
    """Set-union method name -> declaration, in the order front ends list them."""
    return {m.name: m for m in _all() if m.family == "set_union"}


def by_macro() -> dict[str, Mechanism]:
    """SQL macro name -> declaration."""
    return {m.macro: m for m in _all()}


def families() -> dict[str, tuple[Mechanism, ...]]:
    """Family (``Mechanism.family``) -> its mechanisms."""
    out: dict[str, list[Mechanism]] = {}
    for m in _all():
        out.setdefault(m.family, []).append(m)
    return {k: tuple(v) for k, v in out.items()}


def udf_providers() -> tuple[Callable[[Any], list], ...]:
    """Every family's ``udfs(source)``, each once, in the order of the registered families."""
    out: list[Callable[[Any], list]] = []
    for family in _registry().values():
        out += [fn for fn in family.udfs if fn not in out]
    return tuple(out)


def generated_sql() -> list[str]:
    """The SQL every family generates from its declarations, created after the releasing macros."""
    return [make() for family in _registry().values() for make in family.generated]


def sql_files() -> list[Path]:
    """The SQL files of the families added from outside the package (absolute ``Mechanism.sql``), each once,
    in the registry's order; the package's own files are in its sql folder."""
    out: list[Path] = []
    for m in _all():
        path = Path(m.sql)
        if path.is_absolute() and path not in out:
            out.append(path)
    return out
