"""The store's searches: checked here, planned and run by ``memstore.search`` (``plan``, ``runner``);
grouped searches, near-duplicates and recommendations on top of them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

from memstore.catalog.collections import (
    Collection,
)
from memstore.catalog.field_paths import split_names
from memstore.errors import (
    InvalidInputError,
    NotFoundError,
)
from memstore.inputs import MAX_K
from memstore.items.vectors import as_vector
from memstore.models import DuplicatePair, SearchResult
from memstore.search import plan as search_plan
from memstore.search import request, runner, statements
from memstore.search.filter_language import CompiledFilter
from memstore.search.plan import SearchPlan
from memstore.search.request import SearchQuery, Weights, check_query
from memstore.search.statements import SearchSettings
from memstore.store.spaces import SpacesPart


def _check_k(k: int) -> int:
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
        raise InvalidInputError(f"k must be an integer between 1 and {MAX_K}, not {k!r}")
    return k


def _is_id(example: Any) -> bool:
    """Whether a recommendation's example is a stored item's id (an integer, numpy's too; not a bool)
    rather than a vector."""
    return isinstance(example, int | np.integer) and not isinstance(example, bool)


class SearchPart(SpacesPart):
    """Searches."""

    def search(
        self,
        *,
        collection: str,
        vector: Any = None,
        text: str | None = None,
        mode: str | None = None,
        k: int = 10,
        filter: dict[str, Any] | None = None,
        ef_search: int | None = None,
        exact: bool = False,
        pool: int | None = None,
        offset: int = 0,
        candidates: int | None = None,
        weights: Weights | dict[str, float] | None = None,
        score_threshold: float | None = None,
        using: str | None = None,
    ) -> list[SearchResult]:
        """The ``k`` best items for a vector, a text or both, best first (``memstore.search.request``).

        ``mode``: ``vector`` (the nearest to ``vector``), ``keyword`` (the best matches of ``text``'s
        words) or ``hybrid`` (both lists fused); by default hybrid when both are given, else vector.
        ``filter`` keeps the items whose metadata contains it, in every mode. The HNSW index answers
        unless ``exact``; with ``hnsw.iterative_scan`` a filtered search keeps scanning until it has
        enough rows (or has visited ``max_scan_tuples``). ``exact`` is the brute-force ground truth. On
        a compact index (``memstore.compact``) the index gives ``pool`` candidates (default: the
        collection's pool factor times k) and they are re-ranked exactly. ``offset`` skips the first
        hits (offset + k at most 1,000); ``candidates``: how deep each list of a hybrid search goes
        (default max(50, 4 x (offset + k))); ``weights``: each list's weight in the fusion;
        ``score_threshold``: leave out hits scoring lower. ``using``: the embedding space searched
        (``memstore.spaces.lifecycle``; default: the collection's active space).
        """
        q = check_query(
            mode=mode,
            vector=vector,
            text=text,
            k=k,
            filter=filter,
            offset=offset,
            candidates=candidates,
            weights=weights,
            score_threshold=score_threshold,
            pool=pool,
            using=using,
        )
        return self.run_search(collection=collection, query=q, ef_search=ef_search, exact=exact)

    def search_groups(
        self, *, collection: str, group_by: str, group_size: int = 1, groups: int = 10, **search: Any
    ) -> list[request.Group[SearchResult]]:
        """The best ``group_size`` hits of each of the best ``groups`` groups (items sharing the value
        of the metadata field ``group_by``: the best photos per album, passages per document; an item
        whose field is a list is in the group of each element), groups in the order of their best
        hit. Each group is a list of its hits with the value they share as ``.value``. ``search``
        takes ``search``'s other arguments (not k or offset)."""
        if "k" in search:
            raise InvalidInputError("k is not an argument of search_groups: give the number of groups as groups=")
        if "offset" in search:
            # As the REST API answers it: a grouped search reads the ranked list from its top.
            raise InvalidInputError("offset pages hits, not groups: leave it out of search_groups")
        request.check_count("groups", groups, 1, MAX_K)
        request.check_count("group_size", group_size, 1, request.MAX_GROUP_SIZE)
        split_names(group_by, "group_by")  # a field's name or a dotted path, checked before searching
        window = request.group_window(groups, group_size)
        hits = self.search(collection=collection, k=window, **search)
        return request.grouped(hits, group_by, groups, group_size, metadata=lambda h: h.metadata)

    def duplicates(
        self,
        *,
        collection: str,
        threshold: float,
        after_id: int = 0,
        scan: int = 500,
        per_item: int = 5,
    ) -> tuple[list[DuplicatePair], int | None]:
        """Near-duplicate pairs, a page at a time: the ``scan`` items after ``after_id`` (by id) are
        each searched for their ``per_item`` nearest within ``threshold`` (the metric's distance;
        cosine: 1 - similarity). Returns the pairs, closest first, and the id to go on after (None at
        the end). Approximate, as every index search is; bounded, so a large collection is walked
        page by page rather than compared all at once."""
        c = self.get_collection(name=collection)
        if c.metric == "inner_product":
            # Its "distance" is the negative inner product: no threshold >= 0 tells a near copy from
            # any pair of vectors pointing the same way.
            raise InvalidInputError(
                f"collection {collection!r} has metric inner_product, which has no distance: near duplicates "
                "need one (metric cosine or l2)"
            )
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 <= threshold < 1e30:
            raise InvalidInputError(f"threshold must be a non-negative distance, not {threshold!r}")
        request.check_count("scan", scan, 1, 5000)
        request.check_count("per_item", per_item, 1, 100)
        request.check_count("after_id", after_id, 0, 2**63 - 1)
        with self.db.read() as conn:
            ids = [
                int(r[0])
                for r in conn.execute(
                    sql.SQL("SELECT id FROM {} WHERE id > %s AND embedding IS NOT NULL ORDER BY id LIMIT %s").format(
                        c.table
                    ),
                    (after_id, scan),
                )
            ]
            settings = SearchSettings(
                ef_search=max(c.default_ef_search, per_item), exact=False, max_scan_tuples=self.settings.max_scan_tuples
            )
            params = {"ids": ids, "per": per_item + 1, "threshold": float(threshold)}  # + 1: the item itself
            rows = statements.run_search(conn, settings, statements.duplicates_statement(c), params) if ids else []
        pairs = [DuplicatePair(int(r[0]), r[1], int(r[2]), r[3], float(r[4])) for r in rows]
        return pairs, (ids[-1] if len(ids) == scan else None)

    def recommend(
        self,
        *,
        collection: str,
        positive: Sequence[int | Any],
        negative: Sequence[int | Any] = (),
        k: int = 10,
        filter: dict[str, Any] | None = None,
        ef_search: int | None = None,
        exact: bool = False,
    ) -> list[SearchResult]:
        """Items like the ``positive`` examples and unlike the ``negative`` ones: each example a stored
        item's id or a vector (``request.recommendation`` says how they combine). The example
        items themselves are not answered. Examples and the search are in the collection's active space."""
        c = self.get_collection(name=collection)
        space = c.space()
        ids = [int(e) for e in [*positive, *negative] if _is_id(e)]
        stored = self.vectors(collection=collection, ids=ids) if ids else {}
        missing = [i for i in ids if i not in stored]
        if missing:
            raise NotFoundError(
                f"item {missing[0]} of collection {collection!r} has no vector: it does not exist or is not ready yet"
            )

        def vector_of(example: int | Any, where: str) -> np.ndarray:
            if _is_id(example):
                return stored[int(example)]
            return as_vector(example, dimensions=space.dimensions, metric=space.metric, where=where)

        target = request.recommendation(
            [vector_of(e, f"positive[{i}]") for i, e in enumerate(positive)],
            [vector_of(e, f"negative[{i}]") for i, e in enumerate(negative)],
            space.metric,
        )
        examples = set(ids)
        hits = self.search(
            collection=collection,
            vector=target,
            k=min(MAX_K, k + len(examples)),
            filter=filter,
            ef_search=ef_search,
            exact=exact,
        )
        kept = [h for h in hits if h.id not in examples][:k]
        return [replace(h, vector_rank=rank) for rank, h in enumerate(kept, start=1)]

    def run_search(
        self, *, collection: str, query: SearchQuery, ef_search: int | None = None, exact: bool = False
    ) -> list[SearchResult]:
        """A search whose arguments ``request.check_query`` has checked (the API checks them before
        it spends time embedding the query), run by ``memstore.search.runner``."""
        return runner.run(self, collection=collection, query=query, ef_search=ef_search, exact=exact)

    @property
    def second_walks(self) -> int:
        """How many searches through this store ran a second time with pgvector's iterative scan
        because one walk of the graph came back short (``SearchPlan.second_walk``). A rising rate means rows
        deleted or replaced since the last vacuum crowd the graph where searches look, or searches ask
        small collections for more rows than they hold; each such search costs two round trips."""
        return self.second_walk_count.count

    def plan(
        self,
        c: Collection,
        q: SearchQuery,
        *,
        ef_search: int | None,
        exact: bool,
        conn: psycopg.Connection[Any] | None = None,
    ) -> SearchPlan:
        """The plan of one search under this store's settings (``memstore.search.plan.plan``)."""
        return search_plan.plan(
            c, q, ef_search=ef_search, exact=exact, max_scan_tuples=self.settings.max_scan_tuples, conn=conn
        )

    def plain_search(
        self,
        c: Collection,
        *,
        vector: Any,
        k: int,
        filter: CompiledFilter | None,
        ef_search: int | None,
        exact: bool,
        alone: bool = False,
    ) -> SearchPlan:
        """The plan of a search on the full-precision index (``memstore.search.plan.plain_plan``)."""
        return search_plan.plain_plan(
            c,
            vector=vector,
            k=k,
            filter=filter,
            ef_search=ef_search,
            exact=exact,
            max_scan_tuples=self.settings.max_scan_tuples,
            alone=alone,
        )
