"""The density of a collection's HNSW graph (``m``, ``ef_construction``), chosen for its size when it
has a recall target. Pure functions of a registry row and measured figures.

The bound, from memstore's own cost curves (docs/scale.md, runs C and D, 128-d clustered rows,
recall@10 0.95): the default graph (m 16, ef_construction 64) needs ef_search 10 at 10k rows, 60 at
100k and more than 800 at 1M (0.945 at 800); the denser one (m 32, ef_construction 128) reaches it at
ef 10, 10 and 160. So once the ef a target needs passes ``DENSE_EF_BOUND`` (160: what the denser graph
needs at the largest size measured), the denser graph costs less to search than the default one does:
it asks 2.5 times the build time and 1.24 times the bytes per row, where the default graph at that
size asks five times the ef (p99 182 ms at ef 800 against 13 ms at ef 160). The default graph's ef at
0.95 grows about as rows^1.1 between 100k and 1M (60 to 800), so it passes 160 at about 250,000 rows:
``DENSE_ROWS``, what a bulk load into an empty collection goes by before any ef has been measured.

One step only: the denser graph is the one measured; none denser is chosen (not measured here).

A user's explicit ``hnsw_m`` or ``hnsw_ef_construction`` at creation is kept: the collection records
``hnsw_explicit`` in its options (``memstore.store.collections``). A row from before that option is
taken as explicit when its graph is not the one this server gives new collections.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from memstore.settings import get_settings

if TYPE_CHECKING:
    from memstore.catalog.collections import Collection

# options keys
HNSW_EXPLICIT = "hnsw_explicit"  # the user chose hnsw_m or hnsw_ef_construction at creation
HNSW_DENSITY = "hnsw_density"  # the density the worker or a bulk load chose, with why and when

DEFAULT_M = 16
DEFAULT_EF_CONSTRUCTION = 64
DENSE_M = 32
DENSE_EF_CONSTRUCTION = 128
# The ef a target may need on the default graph before the denser one is chosen (docs/scale.md).
DENSE_EF_BOUND = 160
# The rows from which the default graph needs more than DENSE_EF_BOUND at recall 0.95 (docs/scale.md).
DENSE_ROWS = 250_000
# A build of the denser graph against the default one's, same rows (docs/scale.md: 945 s against 379 s at 1M).
DENSE_BUILD_COST = 2.5
# Targets this low are reached by the default graph at every size measured (0.858 at ef 80 at 1M).
DENSE_MIN_TARGET = 0.9


@dataclass(frozen=True)
class Density:
    m: int
    ef_construction: int

    def __str__(self) -> str:
        return f"m {self.m} / ef_construction {self.ef_construction}"


DEFAULT = Density(DEFAULT_M, DEFAULT_EF_CONSTRUCTION)
DENSE = Density(DENSE_M, DENSE_EF_CONSTRUCTION)


def of(c: Collection) -> Density:
    return Density(c.hnsw_m, c.hnsw_ef_construction)


def explicit(c: Collection, default: Density | None = None) -> bool:
    """The user chose the graph at creation (kept as it is); see the module's docstring. A row from
    before the option is compared with ``default``: the graph new collections get on this server
    (``MEMSTORE_DEFAULT_HNSW_M`` and ``MEMSTORE_DEFAULT_HNSW_EF_CONSTRUCTION``)."""
    flag = c.options.get(HNSW_EXPLICIT)
    if flag is not None:
        return bool(flag)
    if default is None:
        settings = get_settings()
        default = Density(settings.default_hnsw_m, settings.default_hnsw_ef_construction)
    return of(c) != default and c.options.get(HNSW_DENSITY) is None


def denser(current: Density) -> Density | None:
    """The next denser graph, None when ``current`` is as dense (or denser) already."""
    if current.m >= DENSE.m and current.ef_construction >= DENSE.ef_construction:
        return None
    return Density(max(current.m, DENSE.m), max(current.ef_construction, DENSE.ef_construction))


def for_ef(current: Density, ef_needed: int | None, *, reachable: bool = True) -> Density | None:
    """The denser graph when the ef the target needs passes the bound (or no ef reaches it); else None."""
    if ef_needed is None:
        return None
    if reachable and ef_needed <= DENSE_EF_BOUND:
        return None
    return denser(current)


def for_rows(current: Density, rows: int, target: float | None) -> Density | None:
    """The denser graph for a build of ``rows`` rows at ``target`` (a bulk load: no ef measured yet)."""
    if target is None or target < DENSE_MIN_TARGET or rows < DENSE_ROWS:
        return None
    return denser(current)


def plan(c: Collection) -> tuple[Density | None, str]:
    """What the collection's next rebuild should use, from its last tuning: (denser graph or None, why)."""
    target, tuning = c.recall_target, c.recall_tuning
    if target is None or tuning is None or tuning.get("target") != target:
        return None, ""
    ef = tuning.get("ef")
    reachable = bool(tuning.get("reachable"))
    if not reachable and tuning.get("sample_limited"):
        return None, ""  # more queries, not a denser graph, might tell
    if tuning.get("over_bound") is False:
        return None, ""  # the recall at the bound's ef cannot be told below the target (a tuning records it)
    want = for_ef(of(c), None if ef is None else int(ef), reachable=reachable)
    if want is None:
        return None, ""
    if explicit(c):
        return None, f"the target needs ef_search {ef}{'' if reachable else ' (unreached)'}; the graph is the user's"
    need = f"ef_search {ef}" if reachable else f"more than ef_search {ef}"
    return want, f"recall {target:g} needs {need}, over the bound {DENSE_EF_BOUND}"


def describe(c: Collection, index: Density | None = None) -> dict[str, object]:
    """The graph as ``memstore-maint status`` shows it: its density, who chose it, what the target asks
    of it, and what the next rebuild will use. ``index``: what the index itself was built with."""
    chosen = c.options.get(HNSW_DENSITY)
    source = "user" if explicit(c) else (str(chosen.get("by")) if isinstance(chosen, dict) else "default")
    want, why = plan(c)
    if want is None and index is not None and index != of(c) and source != "user":
        want, why = of(c), "the registry's graph, not built on this index yet"
    tuning = c.recall_tuning or {}
    tuned = c.recall_target is not None and tuning.get("target") == c.recall_target
    out: dict[str, object] = {
        "m": c.hnsw_m,
        "ef_construction": c.hnsw_ef_construction,
        "source": source,
        "ef_needed": tuning.get("ef") if tuned else None,
        "reachable": tuning.get("reachable") if tuned else None,
        "next_rebuild": None if want is None else {"m": want.m, "ef_construction": want.ef_construction},
        "why": why or None,
    }
    if index is not None:
        out["index"] = {"m": index.m, "ef_construction": index.ef_construction}
    return out


def cell(info: dict[str, object]) -> str:
    """One status cell: ``m 16/64``, ``m 16/64 user's, ef 800``, ``m 16/64 -> 32/128``."""
    text = f"m {info['m']}/{info['ef_construction']}"
    index = info.get("index")
    if isinstance(index, dict) and (index["m"], index["ef_construction"]) != (info["m"], info["ef_construction"]):
        text = f"m {index['m']}/{index['ef_construction']}"
    nxt = info.get("next_rebuild")
    if isinstance(nxt, dict):
        return f"{text} -> {nxt['m']}/{nxt['ef_construction']}"
    if info["source"] == "user" and info.get("ef_needed") is not None:
        more = "" if info.get("reachable") else ">"
        return f"{text} user's, ef {more}{info['ef_needed']}"
    if info["source"] not in ("default", "user"):
        return f"{text} ({info['source']})"
    return text
