"""Keyword and hybrid search on a real PostgreSQL: what is found, how it ranks, and that no text breaks it."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from memstore.catalog import keywords
from memstore.db.core import raw_connection
from memstore.errors import InvalidInputError
from memstore.models import ItemIn
from memstore.search import statements
from memstore.search.request import check_query
from memstore.store import VectorStore

TEXTS = [
    "Use shutil.copytree to copy a whole folder with its files",
    "shutil.copytree copies a directory tree; see also copytree in the os docs",
    "Invoice SKU-88121-B was paid in March",
    "A cat sleeping on the red sofa",
    "parse_args() reads the command line",
    "The quick brown fox jumps over the lazy dog",
]


def _fill(store: VectorStore, name: str, *, partitions: int = 1, text_fields: tuple[str, ...] = ()) -> np.ndarray:
    rng = np.random.default_rng(11)
    vectors = rng.normal(size=(len(TEXTS) + 60, 16)).astype(np.float32)
    store.create_collection(name=name, dimensions=16, partitions=partitions, text_fields=text_fields)
    items = [
        ItemIn(vector=vectors[i], external_id=f"t{i}", text=t, metadata={"kind": "doc", "n": i})
        for i, t in enumerate(TEXTS)
    ]
    # Filler without text: found by vector only.
    items += [
        ItemIn(vector=vectors[j], external_id=f"v{j}", metadata={"kind": "filler", "n": j})
        for j in range(len(TEXTS), len(vectors))
    ]
    store.upsert_items(collection=name, items=items)
    return vectors


@pytest.mark.parametrize("partitions", [1, 3])
def test_keyword_search_finds_identifiers_and_their_parts(
    store: VectorStore, collection_name: str, partitions: int
) -> None:
    _fill(store, collection_name, partitions=partitions)

    def found(text: str) -> list[str]:
        return [r.external_id for r in store.search(collection=collection_name, text=text, mode="keyword", k=5)]

    # The exact identifier first: the item that holds it as written outranks one that has its parts.
    assert set(found("shutil.copytree")) == {"t0", "t1"}
    assert set(found("copytree")) == {"t0", "t1"}
    assert found("SKU-88121-B") == ["t2"]
    assert found("88121") == ["t2"]
    assert found("parse_args") == ["t4"]
    assert found("sofa cat") == ["t3"]
    assert found('"red sofa"') == ["t3"]
    assert found("sofa -cat") == []
    assert found("nothing-like-this") == []
    hits = store.search(collection=collection_name, text="copytree", mode="keyword", k=5)
    assert all(r.distance is None and r.vector_rank is None for r in hits)
    assert [r.keyword_rank for r in hits] == list(range(1, len(hits) + 1))
    assert all(a.score >= b.score for a, b in itertools.pairwise(hits))


def test_an_exact_token_outranks_a_part_of_one(store: VectorStore, collection_name: str) -> None:
    rng = np.random.default_rng(3)
    store.create_collection(name=collection_name, dimensions=4)
    store.upsert_items(
        collection=collection_name,
        items=[
            ItemIn(vector=rng.normal(size=4), external_id="part", text="see pkg.loader.copytree for details"),
            ItemIn(vector=rng.normal(size=4), external_id="exact", text="copytree copies folders"),
        ],
    )
    hits = store.search(collection=collection_name, text="copytree", mode="keyword", k=2)
    assert [r.external_id for r in hits] == ["exact", "part"]


def test_file_names_and_listed_fields_are_keywords(store: VectorStore, collection_name: str) -> None:
    rng = np.random.default_rng(4)
    store.create_collection(name=collection_name, dimensions=4, text_fields=["title", "tags"])
    store.upsert_items(
        collection=collection_name,
        items=[
            ItemIn(vector=rng.normal(size=4), external_id="a", metadata={"filename": "IMG_20240501_0042.jpg"}),
            ItemIn(vector=rng.normal(size=4), external_id="b", metadata={"title": "Quarterly report", "tags": ["q3"]}),
            ItemIn(vector=rng.normal(size=4), external_id="c", metadata={"note": "quarterly"}),  # not a listed field
            ItemIn(vector=rng.normal(size=4), external_id="d", metadata={"tags": {"deep": ["nested-q3"], "n": 7}}),
        ],
    )

    def found(text: str) -> list[str]:
        return sorted(r.external_id for r in store.search(collection=collection_name, text=text, mode="keyword", k=5))

    assert found("IMG_20240501_0042.jpg") == ["a"]
    assert found("quarterly") == ["b"]
    assert found("q3") == ["b", "d"]
    assert found("7") == ["d"]


def test_hybrid_fuses_both_lists_and_says_where_each_hit_came_from(store: VectorStore, collection_name: str) -> None:
    vectors = _fill(store, collection_name)
    # The query vector is the filler v10's own: the vector list puts it first; the keywords find t2.
    hits = store.search(collection=collection_name, text="SKU-88121-B", vector=vectors[10], k=5)
    by_id = {r.external_id: r for r in hits}
    assert hits[0].external_id in ("v10", "t2")
    assert by_id["v10"].vector_rank == 1 and by_id["v10"].keyword_rank is None
    assert by_id["t2"].keyword_rank == 1  # one keyword hit and the vector list's first tie at 1 / 61
    assert all(r.distance is not None for r in hits)  # keyword-only hits get their distance too
    # The fused score is RRF's: weight / (60 + rank) summed over the lists that found the hit.
    for r in hits:
        expected = sum(1.0 / (60 + rank) for rank in (r.vector_rank, r.keyword_rank) if rank is not None)
        assert r.score == pytest.approx(expected)
    # Weights: with the keyword list weighted 0, the order is the vector list's.
    vector_only = store.search(collection=collection_name, vector=vectors[10], k=5)
    weighted = store.search(
        collection=collection_name, text="SKU-88121-B", vector=vectors[10], k=5, weights={"vector": 1, "keyword": 0}
    )
    assert [r.id for r in weighted] == [r.id for r in vector_only]


def test_a_keyword_query_of_stop_words_or_punctuation_falls_back_to_vector_order(
    store: VectorStore, collection_name: str
) -> None:
    rng = np.random.default_rng(8)
    store.create_collection(name=collection_name, dimensions=8, language="english")
    vectors = rng.normal(size=(30, 8))
    store.upsert_items(
        collection=collection_name,
        items=[ItemIn(vector=v, external_id=str(i), text=f"the {i} of and") for i, v in enumerate(vectors)],
    )
    vector_only = [r.id for r in store.search(collection=collection_name, vector=vectors[0], k=5)]
    for text in ("the of and", "!!! ( ) & | :*", "'"):
        hits = store.search(collection=collection_name, text=text, vector=vectors[0], k=5, mode="hybrid")
        assert [r.id for r in hits] == vector_only, text
        assert all(r.keyword_rank is None for r in hits)
        assert store.search(collection=collection_name, text=text, mode="keyword", k=5) == []


def test_filters_apply_to_both_halves_and_k_rows_come_back_when_k_match(
    store: VectorStore, collection_name: str
) -> None:
    rng = np.random.default_rng(9)
    store.create_collection(name=collection_name, dimensions=8, hnsw_m=4, hnsw_ef_construction=8)
    vectors = rng.normal(size=(600, 8))
    store.upsert_items(
        collection=collection_name,
        items=[
            ItemIn(vector=v, external_id=str(i), text=f"common word{i % 7}", metadata={"bucket": i % 50})
            for i, v in enumerate(vectors)
        ],
    )
    # 12 rows have bucket 3; the query vector is far from most of them.
    hits = store.search(
        collection=collection_name, text="common", vector=vectors[0], k=10, filter={"bucket": 3}, mode="hybrid"
    )
    assert len(hits) == 10 and all(r.metadata["bucket"] == 3 for r in hits)
    keyword = store.search(collection=collection_name, text="word3", mode="keyword", k=20, filter={"bucket": 3})
    assert keyword and all(r.metadata["bucket"] == 3 for r in keyword)
    assert {int(r.external_id) for r in keyword} == {i for i in range(600) if i % 50 == 3 and i % 7 == 3}


def test_paging_and_score_threshold(store: VectorStore, collection_name: str) -> None:
    vectors = _fill(store, collection_name)
    for mode, args in (
        ("vector", {"vector": vectors[0]}),
        ("hybrid", {"vector": vectors[0], "text": "copytree sofa invoice"}),
        ("keyword", {"text": "the"}),
    ):
        whole = store.search(collection=collection_name, mode=mode, k=6, exact=True, **args)
        first = store.search(collection=collection_name, mode=mode, k=3, exact=True, **args)
        second = store.search(collection=collection_name, mode=mode, k=3, offset=3, exact=True, **args)
        assert [r.id for r in first + second] == [r.id for r in whole], mode
        if whole:
            cut = whole[len(whole) // 2].score
            kept = store.search(collection=collection_name, mode=mode, k=6, exact=True, score_threshold=cut, **args)
            assert kept and all(r.score >= cut for r in kept)
            assert [r.id for r in kept] == [r.id for r in whole if r.score >= cut]


def test_search_arguments_are_checked_before_any_work() -> None:
    v = [0.1, 0.2]
    bad: list[dict[str, Any]] = [
        {"mode": "keyword", "vector": None, "text": None},
        {"mode": "hybrid", "vector": v, "text": None},
        {"mode": "vector", "vector": None, "text": "x"},
        {"mode": None, "vector": None, "text": "x"},
        {"mode": "fuzzy", "vector": v, "text": "x"},
        {"mode": "keyword", "vector": None, "text": "x\x00"},
        {"mode": "keyword", "vector": None, "text": "x" * 5000},
        {"mode": "vector", "vector": v, "text": None, "offset": 995},
        {"mode": "hybrid", "vector": v, "text": "x", "candidates": 5},
        {"mode": "hybrid", "vector": v, "text": "x", "weights": {"vector": 0, "keyword": 0}},
        {"mode": "hybrid", "vector": v, "text": "x", "weights": {"other": 1}},
        {"mode": "vector", "vector": v, "text": None, "score_threshold": float("nan")},
    ]
    for args in bad:
        with pytest.raises(InvalidInputError):
            check_query(k=10, **args)
    assert check_query(mode=None, vector=v, text="x", k=10).mode == "hybrid"
    assert check_query(mode=None, vector=v, text=None, k=10).mode == "vector"
    # A keyword or hybrid search's text is one full-text query, held shorter than an embedded text;
    # the refusal names the mode the search took and the limit that applies.
    long_text = "bicycle " * 600
    with pytest.raises(InvalidInputError, match=r"4800 characters; the limit for the text of a hybrid search is 4096"):
        check_query(mode=None, vector=v, text=long_text, k=10)
    assert check_query(mode="keyword", vector=None, text="x" * 4096, k=10).text == "x" * 4096
    # The default depth of a hybrid search's lists does not move with the page (pages stay consistent).
    assert check_query(mode=None, vector=v, text="x", k=10, offset=20).candidates == 50
    assert check_query(mode=None, vector=v, text="x", k=10, offset=0).candidates == 50
    assert check_query(mode=None, vector=v, text="x", k=20).candidates == 80


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(min_size=1, max_size=80).filter(lambda t: t.strip() and "\x00" not in t))
def test_no_text_breaks_the_keyword_query(store: VectorStore, text: str) -> None:
    name = "kw_fuzz"
    if store.cached_collection(name) is None:
        try:
            store.get_collection(name=name)
        except LookupError:
            _fill(store, name)
    hits = store.search(collection=name, text=text, mode="keyword", k=5)
    assert len(hits) <= 5
    hybrid = store.search(collection=name, text=text, vector=np.ones(16, np.float32), k=5)
    assert len(hybrid) == 5


def test_the_keyword_index_serves_keyword_searches(store: VectorStore, engine: sa.Engine, collection_name: str) -> None:
    rng = np.random.default_rng(12)
    store.create_collection(name=collection_name, dimensions=8)
    store.upsert_items(
        collection=collection_name,
        items=[ItemIn(vector=rng.normal(size=8), external_id=str(i), text=f"row {i} code-{i}") for i in range(3000)],
    )
    c = store.get_collection(name=collection_name)
    with raw_connection(engine) as conn:
        conn.execute(sql.SQL("ANALYZE {}").format(c.table))
        for mode in ("keyword", "hybrid"):
            q = check_query(mode=mode, vector=rng.normal(size=8) if mode == "hybrid" else None, text="code-1234", k=5)
            plan = store.plan(c, q, ef_search=None, exact=False, conn=conn)
            with conn.cursor() as cur:
                statements.apply(cur, plan.settings)
                rows = cur.execute(sql.SQL("EXPLAIN ") + plan.statement, plan.params).fetchall()
            assert keywords.index_name(c) in "\n".join(r[0] for r in rows), mode


def test_changing_the_keyword_fields_rebuilds_the_index_online(
    store: VectorStore, engine: sa.Engine, collection_name: str
) -> None:
    rng = np.random.default_rng(13)
    store.create_collection(name=collection_name, dimensions=4, partitions=2)
    store.upsert_items(
        collection=collection_name,
        items=[ItemIn(vector=rng.normal(size=4), external_id=str(i), metadata={"sku": f"A-{i}"}) for i in range(20)],
    )
    assert store.search(collection=collection_name, text="A-7", mode="keyword", k=3) == []
    changed = store.set_keywords(collection=collection_name, text_fields=["sku"], grace_s=0)
    assert changed.text_fields == ("sku",)
    assert [r.external_id for r in store.search(collection=collection_name, text="A-7", mode="keyword", k=3)] == ["7"]
    assert keywords.version(changed) == 2
    assert _side_tables(engine, changed) == [(keywords.table_name(changed), True)]
    with pytest.raises(InvalidInputError):
        store.set_keywords(collection=collection_name, language="klingon")
    with pytest.raises(InvalidInputError):
        store.set_keywords(collection=collection_name, text_fields=["a", "a"])


def _side_tables(engine: sa.Engine, c: Any) -> list[tuple[str, bool]]:
    """The collection's keyword side tables, each with whether its GIN index is valid."""
    with raw_connection(engine) as conn:
        return [
            (r[0], bool(r[1]))
            for r in conn.execute(
                "SELECT t.relname, x.indisvalid FROM pg_class t LEFT JOIN pg_index x ON x.indrelid = t.oid "
                "AND x.indexrelid = to_regclass(t.relname || '_words') WHERE t.relkind = 'r' AND t.relname ~ %s "
                "ORDER BY 1",
                (f"^memstore_kw_c{c.id}_v[0-9]+$",),
            ).fetchall()
        ]


def _stored(engine: sa.Engine, c: Any) -> dict[str, str]:
    """external_id -> the stored keywords of each item that has a side row."""
    with raw_connection(engine) as conn:
        rows = conn.execute(
            sql.SQL("SELECT t.external_id, k.words::text FROM {} t JOIN {} k USING (id)").format(
                c.table, keywords.table(c)
            )
        ).fetchall()
    return dict(rows)


@pytest.mark.parametrize("partitions", [1, 2])
def test_stored_keywords_follow_every_write(
    store: VectorStore, engine: sa.Engine, collection_name: str, partitions: int
) -> None:
    """Inserts, upserts, metadata and text changes, vector-only writes and deletes each leave the side
    table exactly as the keywords of the rows now are; a row with nothing to parse has no side row."""
    c = store.create_collection(name=collection_name, dimensions=2, partitions=partitions, text_fields=("sku",))
    store.upsert_items(
        collection=collection_name,
        items=[
            ItemIn(vector=[1.0, 0.0], external_id="a", text="red bicycle"),
            ItemIn(vector=[0.0, 1.0], external_id="b", metadata={"sku": "X-1"}),
            ItemIn(vector=[1.0, 1.0], external_id="bare"),
        ],
    )
    assert sorted(_stored(engine, c)) == ["a", "b"]
    assert "bicycl" in _stored(engine, c)["a"] or "bicycle" in _stored(engine, c)["a"]
    store.upsert_items(
        collection=collection_name,
        items=[
            ItemIn(vector=[1.0, 0.0], external_id="a", text="blue kayak"),  # the text changed
            ItemIn(vector=[0.0, 1.0], external_id="b"),  # its listed field gone: nothing to parse
            ItemIn(vector=[1.0, 1.0], external_id="bare", metadata={"sku": "Z-9"}),
        ],
    )
    stored = _stored(engine, c)
    assert sorted(stored) == ["a", "bare"]
    assert "kayak" in stored["a"] and "bicycle" not in stored["a"]
    assert [h.external_id for h in store.search(collection=collection_name, text="kayak", mode="keyword")] == ["a"]
    assert store.search(collection=collection_name, text="bicycle", mode="keyword") == []
    assert [h.external_id for h in store.search(collection=collection_name, text="Z-9", mode="keyword")] == ["bare"]
    store.delete_items(collection=collection_name, external_ids=["a"])
    assert sorted(_stored(engine, c)) == ["bare"]
    assert store.search(collection=collection_name, text="kayak", mode="keyword") == []


def test_a_word_in_every_text_ranks_from_the_stored_keywords(
    store: VectorStore, engine: sa.Engine, collection_name: str
) -> None:
    """Neither the match nor the ranking parses a text: the plan reads the side table's words and
    calls no memstore_keywords; ranking takes at most RANK_LIMIT matches."""
    rng = np.random.default_rng(5)
    store.create_collection(name=collection_name, dimensions=4)
    store.upsert_items(
        collection=collection_name,
        items=[
            ItemIn(vector=rng.normal(size=4), external_id=str(i), text=f"common {'filler ' * (i % 7)} unique{i}")
            for i in range(300)
        ],
    )
    c = store.get_collection(name=collection_name)
    with raw_connection(engine) as conn:
        q = check_query(mode="keyword", vector=None, text="common", k=10)
        plan = store.plan(c, q, ef_search=None, exact=False, conn=conn)
        rows = conn.execute(sql.SQL("EXPLAIN (VERBOSE) ") + plan.statement, plan.params).fetchall()
    explained = "\n".join(r[0] for r in rows)
    assert "memstore_keywords" not in explained
    assert "Limit" in explained and str(keywords.RANK_LIMIT) in plan.statement.as_string(None)
    hits = store.search(collection=collection_name, text="common unique7", mode="keyword", k=3)
    assert hits[0].external_id == "7"


def test_field_names_with_percent_are_refused() -> None:
    from memstore.catalog import keywords

    with pytest.raises(InvalidInputError, match="%"):
        keywords.check_text_fields(["discount%"])


def test_an_identifier_query_finds_it_however_the_parser_split_it(store: VectorStore, collection_name: str) -> None:
    rng = np.random.default_rng(21)
    store.create_collection(name=collection_name, dimensions=4)
    store.upsert_items(
        collection=collection_name,
        items=[
            ItemIn(vector=rng.normal(size=4), external_id="file", metadata={"filename": "SKU-88121-B.jpg"}),
            ItemIn(vector=rng.normal(size=4), external_id="other", metadata={"filename": "SKU-12345-C.jpg"}),
        ],
    )
    hits = store.search(collection=collection_name, text="SKU-88121-B", mode="keyword", k=3)
    assert [h.external_id for h in hits] == ["file"]


def test_a_long_text_is_stored_and_its_first_words_are_keywords(store: VectorStore, collection_name: str) -> None:
    store.create_collection(name=collection_name, dimensions=2)
    text = "opening-marker " + " ".join(f"w{i:06d}" for i in range(120_000))  # ~960,000 characters
    store.upsert_items(collection=collection_name, items=[ItemIn(vector=[1.0, 0.0], external_id="long", text=text)])
    assert store.get_item(collection=collection_name, external_id="long").text == text
    assert [h.external_id for h in store.search(collection=collection_name, text="w000010", mode="keyword")] == ["long"]


def test_deleting_by_a_filter_that_matches_everything_is_refused(store: VectorStore, collection_name: str) -> None:
    store.create_collection(name=collection_name, dimensions=2)
    store.upsert_items(collection=collection_name, items=[ItemIn(vector=[1.0, 0.0], external_id="a")])
    for everything in ({}, {"$and": [{}]}, {"$or": [{}]}):
        with pytest.raises(InvalidInputError, match="every item"):
            store.delete_items(collection=collection_name, filter=everything)
    assert store.get_item(collection=collection_name, external_id="a")


@pytest.mark.parametrize("partitions", [1, 3])
@pytest.mark.parametrize("stop", ["before_record", "after_record"])
def test_a_keyword_change_that_stopped_half_way_is_finished_or_undone(
    store: VectorStore, engine: sa.Engine, collection_name: str, monkeypatch, partitions: int, stop: str
) -> None:
    from memstore.catalog import keywords

    rng = np.random.default_rng(22)
    store.create_collection(name=collection_name, dimensions=4, partitions=partitions)
    store.upsert_items(
        collection=collection_name,
        items=[
            ItemIn(vector=rng.normal(size=4), external_id=str(i), metadata={"title": f"T-{i}", "brand": f"B-{i}"})
            for i in range(30)
        ],
    )

    class Crash(Exception):
        pass

    real_fill, real_drop = keywords._fill, keywords.drop_other_versions

    def fill_then_crash(*args, **kwargs):
        real_fill(*args, **kwargs)
        raise Crash

    def drop_unless_recorded(conn, c):
        if keywords.version(c) > 1:  # the change's own last step, after it recorded version 2
            raise Crash
        real_drop(conn, c)  # the recovery a change starts with: nothing to drop yet

    if stop == "before_record":
        monkeypatch.setattr(keywords, "_fill", fill_then_crash)
    else:
        monkeypatch.setattr(keywords, "drop_other_versions", drop_unless_recorded)
    with pytest.raises(Crash):
        store.set_keywords(collection=collection_name, text_fields=["title"], grace_s=0)
    assert len(_side_tables(engine, store.get_collection(name=collection_name, fresh=True))) == 2
    monkeypatch.setattr(keywords, "_fill", real_fill)
    monkeypatch.setattr(keywords, "drop_other_versions", real_drop)

    # The next change first finishes or undoes the one that stopped, then makes its own.
    changed = store.set_keywords(collection=collection_name, text_fields=["brand"], grace_s=0)
    assert changed.text_fields == ("brand",)
    assert keywords.PENDING not in changed.options or changed.options[keywords.PENDING] is None
    assert [h.external_id for h in store.search(collection=collection_name, text="B-7", mode="keyword")] == ["7"]
    assert store.search(collection=collection_name, text="T-7", mode="keyword") == []
    assert _side_tables(engine, changed) == [(keywords.table_name(changed), True)]
    with raw_connection(engine) as conn:
        triggers = conn.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND tgname LIKE 'memstore_kw_%%' ORDER BY 1",
            (changed.table.as_string(conn),),
        ).fetchall()
    at = keywords.version(changed)
    assert [t[0] for t in triggers] == sorted(f"memstore_kw_v{at}_{e}" for e in ("delete", "insert", "update"))


def test_keyword_fields_name_nested_fields_as_filters_do(store: VectorStore, collection_name: str) -> None:
    """A dotted name is a path into nested metadata, ``\\.`` keeps a dot in a key, and a key that
    starts with "[" is still a key; the same at creation and after an online change."""
    rng = np.random.default_rng(17)
    metadata = [
        {"image": {"camera": {"model": "zebra-x100"}}},
        {"price.usd": "walrus"},
        {"[odd": "narwhal"},
        {"image": "pelican"},  # not under the path: no keyword
        {"image.camera": {"model": "ocelot"}},  # the literal dotted key is not the path
    ]
    fields = ("image.camera.model", "price\\.usd", "[odd")
    store.create_collection(name=collection_name, dimensions=4, text_fields=fields)
    items = [ItemIn(vector=rng.normal(size=4), external_id=str(i), metadata=m) for i, m in enumerate(metadata)]
    store.upsert_items(collection=collection_name, items=items)

    def found(text: str) -> list[str]:
        return [r.external_id for r in store.search(collection=collection_name, text=text, mode="keyword", k=5)]

    expected = {"zebra": ["0"], "walrus": ["1"], "narwhal": ["2"], "pelican": [], "ocelot": []}
    assert {word: found(word) for word in expected} == expected
    store.set_keywords(collection=collection_name, text_fields=["image", "image\\.camera.model"], grace_s=0)
    assert {w: found(w) for w in ("zebra", "pelican", "ocelot", "walrus")} == {
        "zebra": ["0"],
        "pelican": ["3"],
        "ocelot": ["4"],
        "walrus": [],
    }
    with pytest.raises(InvalidInputError, match="empty name"):
        store.set_keywords(collection=collection_name, text_fields=["image..camera"])


def test_a_word_matches_however_its_characters_are_written(store: VectorStore, collection_name: str) -> None:
    """Keywords and queries in one Unicode form (NFKC, migration 0016): a decomposed accent (what
    macOS writes in file names), a ligature and full-width letters find and are found."""
    rng = np.random.default_rng(19)
    store.create_collection(name=collection_name, dimensions=4)
    texts = {"nfd": "un cafe\u0301 noir", "lig": "the \ufb01sh market", "wide": "\uff33\uff2b\uff35-12"}
    items = [ItemIn(vector=rng.normal(size=4), external_id=k, text=t) for k, t in texts.items()]
    items.append(ItemIn(vector=rng.normal(size=4), external_id="file", metadata={"filename": "cafe\u0301 menu.jpg"}))
    store.upsert_items(collection=collection_name, items=items)

    def found(text: str) -> set[str]:
        return {r.external_id for r in store.search(collection=collection_name, text=text, mode="keyword", k=5)}

    assert found("caf\u00e9") == {"nfd", "file"}  # typed with one é
    assert found("cafe\u0301") == {"nfd", "file"}  # and as the file name writes it
    assert found("fish") == {"lig"} and found("\ufb01sh") == {"lig"}
    assert found("SKU-12") == {"wide"}


def test_an_excluded_word_keeps_its_rows_out(store: VectorStore, collection_name: str) -> None:
    """``-word`` excludes, whatever the word looks like: an identifier (whose parts would otherwise be
    matched as a phrase) or a word typed in another Unicode form (full-width letters)."""
    rng = np.random.default_rng(23)
    store.create_collection(name=collection_name, dimensions=4)
    texts = {"draft": "plan draft one", "final": "plan final two", "sku": "plan SKU-88121-B kettle"}
    store.upsert_items(
        collection=collection_name,
        items=[ItemIn(vector=rng.normal(size=4), external_id=k, text=t) for k, t in texts.items()],
    )

    def found(text: str) -> set[str]:
        return {r.external_id for r in store.search(collection=collection_name, text=text, mode="keyword", k=5)}

    assert found("plan -draft") == {"final", "sku"}
    assert found("-draft plan") == {"final", "sku"}
    assert found("plan -SKU-88121-B") == {"draft", "final"}
    assert found("plan -\uff33\uff2b\uff35") == {"draft", "final"}  # -ＳＫＵ, full width
    assert found("plan-draft") == {"draft"}  # a dash inside a word is no exclusion
    assert found("-draft") == {"final", "sku"}
