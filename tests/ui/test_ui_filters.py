"""Filter chips, the search form's mode switch, list fields on cards and which list found a hit,
over HTTP; the chips' listing against the store's own filtered search; and the abuse cases (chips the
filter language refuses, chips that are not chips, markup in values), which the page explains."""

from __future__ import annotations

import itertools
import re
from typing import Any

import httpx
import numpy as np
import psycopg
import pytest

from memstore.models import ItemIn
from memstore.store import VectorStore
from memstore.ui import search

ROW = re.compile(r'<li class="result" data-item="(\d+)"')

NOTES = {
    "gh": ("github actions failing again", {"kind": "note", "tags": ["github", "ci"], "price": 5}),
    "bug": ("a bug report for the kettle", {"kind": "note", "tags": ["bugs"], "price": 12.5}),
    "may": ("photo of the lake in may", {"kind": "photo", "taken": "2024-05-03T10:00:00Z", "price": 10}),
    "june": ("photo of the beach in june", {"kind": "photo", "taken": "2024-06-01", "tags": "github"}),
    "old": ("an old scan", {"kind": "photo", "taken": "2023-12-25"}),
}


@pytest.fixture
def notes(api: httpx.Client, ui_collection: str) -> dict[str, int]:
    items = [{"external_id": eid, "text": text, "metadata": meta} for eid, (text, meta) in NOTES.items()]
    r = api.post(f"/v1/collections/{ui_collection}/items?wait=true", json={"items": items})
    assert r.status_code == 201, r.text
    return {it["external_id"]: it["id"] for it in r.json()["items"]}


def _shown(page: httpx.Response) -> set[int]:
    return {int(i) for i in ROW.findall(page.text)}


def _get(client: httpx.Client, name: str, *chips: str, **params: str) -> httpx.Response:
    return client.get(f"/ui/c/{name}", params=[*params.items(), *(("f", c) for c in chips)])


def test_chips_apply_without_a_query(admin_page, ui_collection, notes) -> None:
    page = _get(admin_page, ui_collection, "kind=note")
    assert page.status_code == 200, page.text
    assert _shown(page) == {notes["gh"], notes["bug"]}
    assert "Items matching the filters" in page.text
    assert 'aria-label="Remove filter kind: note"' in page.text


def test_a_tag_chip_matches_a_list_holding_it(admin_page, ui_collection, notes) -> None:
    plain = _get(admin_page, ui_collection, "tags=github")
    assert _shown(plain) == {notes["gh"], notes["june"]}  # an element of a list, or the value itself
    listed = _get(admin_page, ui_collection, 'tags=["github"]')
    assert _shown(listed) == {notes["gh"]}  # a list: the field is a list holding every value
    both = _get(admin_page, ui_collection, "tags=github", "tags=ci")  # chips on one key all hold
    assert _shown(both) == {notes["gh"]}
    searched = _get(admin_page, ui_collection, "tags=github", q="github actions")
    assert _shown(searched) == {notes["gh"], notes["june"]} or _shown(searched) == {notes["gh"]}
    assert notes["bug"] not in _shown(searched)


def test_range_chips_compare_numbers_and_dates(admin_page, ui_collection, notes) -> None:
    assert _shown(_get(admin_page, ui_collection, "price>=10")) == {notes["bug"], notes["may"]}
    assert _shown(_get(admin_page, ui_collection, "price<10")) == {notes["gh"]}
    may = _get(admin_page, ui_collection, "taken>=2024-05-01", "taken<2024-06-01")
    assert _shown(may) == {notes["may"]}
    assert "taken ≥ 2024-05-01" in may.text and "taken &lt; 2024-06-01" in may.text
    # the same chips filter a typed query
    found = _get(admin_page, ui_collection, "taken>=2024-05-01", q="photo of the lake")
    assert _shown(found) <= {notes["may"], notes["june"]} and notes["may"] in _shown(found)


def test_a_refused_chip_is_explained_on_the_page(admin_page, ui_collection, notes) -> None:
    cases = {
        "taken>=2024/05/01": "looks like a date but is not ISO 8601",
        "price>=true": "compares numbers, dates and strings",
        "price>=10": None,  # a control: fine
        "$or=1": None,  # a chip names a field: the key "$or", escaped for the filter, not the operator
    }
    for chip, message in cases.items():
        for params in ({}, {"q": "photo"}):
            page = _get(admin_page, ui_collection, chip, **params)
            if message is None:
                assert page.status_code == 200
                continue
            assert page.status_code == 422, (chip, page.status_code)
            assert 'id="search-error"' in page.text and message in page.text
            assert "Remove filter" in page.text  # the chip is there to take away


def test_text_that_is_no_chip_is_named_not_dropped(admin_page, ui_collection, notes) -> None:
    page = _get(admin_page, ui_collection, "just words", "kind=note")
    assert page.status_code == 422
    assert "Not a filter: “just words”" in page.text and "key=value" in page.text
    assert _shown(page) == {notes["gh"], notes["bug"]}  # the chips that are chips still apply
    assert _get(admin_page, ui_collection, "  ").status_code == 200  # an empty filter box is nothing


def test_chip_abuse_never_breaks_the_page(admin_page, ui_collection, notes) -> None:
    nasty = [
        "<script>alert(1)</script>=<img src=x onerror=alert(2)>",
        "x=" + "9" * 400,
        "n=NaN",
        "n>=1e400",
        "n>=Infinity",
        '"unterminated=1',
        'k={"$where": "1"}',
        "k=[[1]]",
        "k>=[1, 2]",
        "=",
        ">=<",
        "a" * 199 + "=",
        "k=\x00",
        "k>=" + "z" * 190,
        "deep=" + "[" * 150,
    ]
    for chip in nasty:
        page = _get(admin_page, ui_collection, chip)
        assert page.status_code in (200, 422), (chip, page.status_code, page.text[-500:])
        assert "<script>alert(1)" not in page.text and "<img src=x" not in page.text
    many = _get(admin_page, ui_collection, *(f"k{i}=1" for i in range(32)))
    assert many.status_code == 422 and many.text.count("Remove filter") == search.MAX_CHIPS
    assert "At most 8 filters; left out: k8=1, k9=1, k10=1, k11=1, k12=1 and 19 more." in many.text
    too_many = _get(admin_page, ui_collection, *(f"k{i}=1" for i in range(40)))
    assert too_many.status_code == 404 and "is not valid here" in too_many.text  # the address's own limit, a page
    evil_mode = _get(admin_page, ui_collection, q="photo", mode="<b>x</b>")
    assert evil_mode.status_code == 422 and "<b>x</b>" not in evil_mode.text
    assert "mode is one of hybrid, vector, keyword" in evil_mode.text


def test_a_ninth_chip_is_named_not_dropped(admin_page, ui_collection, notes) -> None:
    chips = [f"k{i}>=0" for i in range(7)] + ["kind=note", "tags=github", "kind=note"]
    page = _get(admin_page, ui_collection, *chips)
    assert page.status_code == 422
    assert 'id="search-error"' in page.text and "At most 8 filters; left out: tags=github." in page.text
    assert page.text.count("Remove filter") == search.MAX_CHIPS  # a chip given twice is one chip
    hostile = _get(admin_page, ui_collection, *chips[:8], '"<b>x</b>"=1')
    assert "left out: &#34;&lt;b&gt;x&lt;/b&gt;&#34;=1." in hostile.text and "<b>x</b>" not in hostile.text


def test_chips_that_differ_read_differently(admin_page, ui_collection, notes) -> None:
    labels = {
        "year=2020": "year: 2020",
        'year="2020"': 'year: "2020"',
        'flag="true"': 'flag: "true"',
        "flag=true": "flag: true",
        '"a.b"=1': '"a.b": 1',
        "a.b=1": "a.b: 1",
        '"a=b">=2': '"a=b" ≥ 2',
        "name=two words": "name: two words",
        "taken>=2024-05-01": "taken ≥ 2024-05-01",
    }
    for text, label in labels.items():
        chip = search.parse_chip(text)
        assert chip is not None and chip.label == label, (text, chip)
    assert len({search.parse_chip(t).label for t in labels}) == len(labels)  # type: ignore[union-attr]
    page = _get(admin_page, ui_collection, "year=2020", 'year="2020"')
    assert 'aria-label="Remove filter year: 2020"' in page.text
    assert 'aria-label="Remove filter year: &#34;2020&#34;"' in page.text


def test_card_values_link_only_to_chips_the_page_takes(admin_page, api, ui_collection) -> None:
    long = "w" * 250
    items = [
        {"external_id": "long", "text": "long value", "metadata": {"note": long, "tags": [long, "short"]}},
        {"external_id": "empty", "text": "empty key", "metadata": {"": "blank key"}},
    ]
    r = api.post(f"/v1/collections/{ui_collection}/items?wait=true", json={"items": items})
    ids = {it["external_id"]: it["id"] for it in r.json()["items"]}
    page = _get(admin_page, ui_collection)
    links = [href.replace("&amp;", "&") for href in re.findall(r'<a class="chip(?: tag)?" href="([^"]+)"', page.text)]
    assert links and all(admin_page.get(link).status_code == 200 for link in links)
    assert not any("w" * 100 in link for link in links)  # the long value: shown, not a link
    assert '<span class="chip" title="too long to filter on">note: ' in page.text
    assert '<span class="chip tag" data-key="tags">' in page.text
    blank = next(link for link in links if "blank+key" in link)
    assert _shown(admin_page.get(blank)) == {ids["empty"]}
    assert search.parse_chip('""=blank key') == search.Chip("", "blank key")
    assert search.parse_chip("=blank key") is None


def test_a_filter_added_to_more_like_this_keeps_it(admin_page, ui_collection, notes) -> None:
    like = _get(admin_page, ui_collection, like=str(notes["gh"]))
    assert f'<input type="hidden" name="like" value="{notes["gh"]}">' in like.text
    narrowed = _get(admin_page, ui_collection, "kind=note", like=str(notes["gh"]), q="")
    assert narrowed.status_code == 200 and "More like <a" in narrowed.text
    assert _shown(narrowed) == {notes["bug"]}  # the other note; never the item itself
    assert f'<input type="hidden" name="like" value="{notes["gh"]}">' in narrowed.text
    typed = _get(admin_page, ui_collection, like=str(notes["gh"]), q="kettle", mode="keyword")
    assert typed.status_code == 200 and "Results for “kettle”" in typed.text  # text typed there: a new search
    assert _shown(typed) == {notes["bug"]} and 'name="like"' not in typed.text


def test_the_mode_switch_searches_by_keyword_vector_or_both(admin_page, ui_collection, notes) -> None:
    keyword = _get(admin_page, ui_collection, q="kettle", mode="keyword")
    assert keyword.status_code == 200 and "(by keyword)" in keyword.text
    assert _shown(keyword) == {notes["bug"]}  # only the item with the word
    assert '<option value="keyword" selected>' in keyword.text
    vector = _get(admin_page, ui_collection, q="kettle", mode="vector")
    assert vector.status_code == 200 and "(by meaning)" in vector.text
    assert _shown(vector) == set(notes.values())  # every item has a nearest-neighbour distance
    assert "found-by" not in vector.text
    hybrid = _get(admin_page, ui_collection, q="kettle")
    assert "(hybrid: meaning and keywords)" in hybrid.text
    badges = dict(re.findall(r'data-item="(\d+)".*?class="found-by found-(\w+)"', hybrid.text, re.S))
    assert badges[str(notes["bug"])] == "both"  # the keyword list and the vector list found it
    assert set(badges.values()) <= {"both", "vector", "keyword"}
    assert "vector" in badges.values()  # the others: by meaning alone
    assert "keyword list: #1" in hybrid.text
    # the links of a page keep its mode
    chip_link = re.search(r'<a class="chip" href="([^"]+)"', keyword.text)
    assert chip_link and "mode=keyword" in chip_link[1]


def test_list_fields_show_as_tags_that_add_a_filter(admin_page, api, ui_collection) -> None:
    items = [
        {"external_id": "t", "text": "tagged", "metadata": {"tags": ["pets", "<b>bold</b>", 3]}},
        {"external_id": "u", "text": "other", "metadata": {"tags": ["holiday"]}},
    ]
    r = api.post(f"/v1/collections/{ui_collection}/items?wait=true", json={"items": items})
    ids = {it["external_id"]: it["id"] for it in r.json()["items"]}
    page = _get(admin_page, ui_collection)
    card = re.search(rf'data-item="{ids["t"]}"(.*?)</li>\s*</ul>', page.text, re.S)
    assert card
    tags = re.findall(r'<a class="chip tag" href="([^"]+)"[^>]*>([^<]*)</a>', page.text)
    shown = [t[1] for t in tags]
    assert "pets" in shown and "&lt;b&gt;bold&lt;/b&gt;" in shown and "3" in shown and "holiday" in shown
    assert "<b>bold</b>" not in page.text
    link = next(href for href, text in tags if text == "pets").replace("&amp;", "&")
    filtered = admin_page.get(link)
    assert _shown(filtered) == {ids["t"]}
    assert "tags: pets" in filtered.text
    # a second tag adds to the first rather than replacing it
    again = re.findall(r'<a class="chip tag" href="([^"]+)"[^>]*>3</a>', filtered.text)[0].replace("&amp;", "&")
    assert again.count("f=tags") == 2
    assert _shown(admin_page.get(again)) == {ids["t"]}


def test_a_photo_card_shows_its_date_taken(admin_page, api, ui_collection) -> None:
    meta = {"image": {"taken_at": "2024-05-03T10:00:00", "camera": "<i>Pixel</i>"}}
    r = api.post(
        f"/v1/collections/{ui_collection}/items?wait=true",
        json={"items": [{"external_id": "p", "text": "lake", "metadata": meta}]},
    )
    assert r.status_code == 201
    page = _get(admin_page, ui_collection)
    assert "taken 2024-05-03T10:00:00" in page.text
    assert "<i>Pixel" not in page.text


def test_a_dotted_key_is_a_path(admin_page, api, ui_collection) -> None:
    items = [
        {"external_id": "may", "text": "lake", "metadata": {"image": {"taken_at": "2024-05-03T10:00:00Z"}}},
        {"external_id": "jun", "text": "beach", "metadata": {"image": {"taken_at": "2024-06-03T10:00:00Z"}}},
        {"external_id": "lit", "text": "dots", "metadata": {"image.taken_at": "2024-05-04"}},
    ]
    r = api.post(f"/v1/collections/{ui_collection}/items?wait=true", json={"items": items})
    ids = {it["external_id"]: it["id"] for it in r.json()["items"]}
    may = _get(admin_page, ui_collection, "image.taken_at>=2024-05-01", "image.taken_at<2024-06-01")
    assert _shown(may) == {ids["may"]}
    literal = _get(admin_page, ui_collection, '"image.taken_at">=2024-05-01')
    assert _shown(literal) == {ids["lit"]}
    # a card's value under a key with a dot filters on that key, not on a path
    link = re.search(
        r'<a class="chip" href="([^"]+)" title="filter on image.taken_at"', _get(admin_page, ui_collection).text
    )
    assert link and _shown(admin_page.get(link[1].replace("&amp;", "&"))) == {ids["lit"]}


def test_a_filtered_listing_pages(admin_page, api, ui_collection, monkeypatch) -> None:
    from memstore.ui import browse

    items = [{"external_id": f"i{i}", "text": f"item {i}", "metadata": {"n": i}} for i in range(12)]
    r = api.post(f"/v1/collections/{ui_collection}/items?wait=true", json={"items": items})
    ids = [it["id"] for it in r.json()["items"]]
    monkeypatch.setattr(browse, "BROWSE_PAGE", 3)  # the server runs in this process
    first = _get(admin_page, ui_collection, "n>=6")
    assert [int(i) for i in ROW.findall(first.text)] == ids[6:9]
    link = re.search(r'<a href="([^"]+)" class="button">Next page</a>', first.text)
    assert link and "f=n%3E%3D6" in link[1] and f"after={ids[8]}" in link[1]
    second = admin_page.get(link[1].replace("&amp;", "&"))
    assert [int(i) for i in ROW.findall(second.text)] == ids[9:12]
    assert "Next page" not in second.text  # a full last page links to no empty one


def test_a_listing_that_runs_out_of_time_says_so_on_the_page(admin_page, ui_collection, notes, monkeypatch) -> None:
    def too_slow(self: VectorStore, **kwargs: Any) -> Any:
        raise psycopg.errors.QueryCanceled("canceling statement due to statement timeout")

    monkeypatch.setattr(VectorStore, "page_items", too_slow)  # the server runs in this process
    page = _get(admin_page, ui_collection, "kind=note")
    assert page.status_code == 504
    assert 'id="search-error"' in page.text and "did not answer in time" in page.text
    assert "Remove filter kind: note" in page.text  # a chip to take away, on the page


# ---------------------------------------------------------------------- the listing against the search


ITEMS: list[dict[str, Any]] = [
    {"tags": ["pets", "holiday"], "n": 3, "taken": "2024-05-03T10:00Z", "kind": "note"},
    {"tags": ["money"], "n": [0, 10], "taken": ["2023-12-25", "2024-05-03T10:00+02:00"], "kind": "photo"},
    {"n": 7.5, "taken": "2024-06-01", "kind": "Note"},
    {"tags": "pets", "n": "10", "taken": "2024/05/01", "kind": ["note", "photo"]},
    {"n": True, "taken": "2024-05-01T00:00:00Z", "kind": None},
    {"n": 1.0, "taken": 20240501, "tags": [["pets"]]},
    {},
]
CHIPS = [
    "tags=pets",
    'tags=["pets"]',
    'tags=["pets", "holiday"]',
    "tags=money",
    "n=1",
    "n=10",
    'n="10"',
    "n=true",
    "n>=3",
    "n>1",
    "n<5",
    "n<=7.5",
    "n>=10",
    "taken>=2024-05-01",
    "taken<2024-05-03T09:00Z",
    "taken>2024-05-03T08:00:00+00:00",
    "taken<=2024-06-01",
    "kind=note",
    "kind>=N",
    "kind<note",
    "kind=null",
    "missing=1",
    "missing>=1",
]


def test_chips_on_the_store_filter_agree_with_its_search(store: VectorStore, collection_name: str) -> None:
    """Every chip, and pairs of them, list the items the store's filtered search finds (an exact
    search answers every item with a vector): browsing and searching filter alike."""
    store.create_collection(name=collection_name, dimensions=2)
    store.upsert_items(
        collection=collection_name,
        items=[ItemIn(vector=np.array([1.0, i + 1.0]), external_id=f"e{i}", metadata=m) for i, m in enumerate(ITEMS)],
    )
    sets = [[text] for text in CHIPS] + [list(pair) for pair in itertools.combinations(CHIPS[::3], 2)]
    for texts in sets:
        chips = search.parse_chips(texts)
        assert len(chips) == len(texts), texts
        flt = search.filter_of(chips)
        hits = store.search(collection=collection_name, vector=np.array([1.0, 1.0]), k=50, filter=flt, exact=True)
        listed, _ = store.page_items(collection=collection_name, limit=50, filter=flt)
        assert {i.id for i in listed} == {h.id for h in hits}, (texts, flt)


# ---------------------------------------------------------------------- parsing


def test_chips_parse_and_travel_unchanged() -> None:
    cases = {
        "kind=note": ("kind", "=", "note"),
        "year=2020": ("year", "=", 2020),
        'year="2020"': ("year", "=", "2020"),
        'tags=["a", 1]': ("tags", "=", ["a", 1]),
        "price >= 10.5": ("price", ">=", 10.5),
        "taken<2024-06-01": ("taken", "<", "2024-06-01"),
        "n>-1": ("n", ">", -1),
        "n<=x": ("n", "<=", "x"),
        '"a=b<c"=1': ("a=b<c", "=", 1),
        "k= spaced ": ("k", "=", "spaced"),
        "n=NaN": ("n", "=", "NaN"),
        "k=": ("k", "=", ""),
        "image.taken_at>=2024-05-01": ("image.taken_at", ">=", "2024-05-01"),
        '"a.b"=1': ("a.b", "=", 1),
    }
    for text, (key, op, value) in cases.items():
        chip = search.parse_chip(text)
        assert chip is not None and (chip.key, chip.op, chip.value) == (key, op, value), text
        assert search.parse_chip(chip.param) == chip, chip.param
    assert search.parse_chip("image.taken_at>=2024-05-01").nested  # type: ignore[union-attr]
    assert not search.parse_chip('"a.b"=1').nested  # type: ignore[union-attr]
    odd_chips = (search.Chip(" k", "v"), search.Chip("k", " v "), search.Chip("k", "true"), search.Chip("=", "<"))
    for odd in (*odd_chips, search.Chip("a.b", 1), search.Chip("a..b", 1), search.Chip("x.y", 2, "<", nested=True)):
        assert search.parse_chip(odd.param) == odd, odd.param
    for bad in ("words", "=1", ">=2", '"k"', '"k" 1', "x" * 201 + "=1"):
        assert search.parse_chip(bad) is None, bad


def test_chips_make_one_filter() -> None:
    chips = search.parse_chips(["taken>=2024-05-01", "taken<2024-06-01", "kind=note", "taken>=2024-05-02"])
    assert search.filter_of(chips) == {"taken": {"$lt": "2024-06-01", "$gte": "2024-05-02"}, "kind": "note"}
    both = search.parse_chips(["tags=a", "tags=b", "tags=a"])
    assert search.filter_of(both) == {"$and": [{"tags": "a"}, {"tags": "b"}]}
    assert search.filter_of([]) is None
    # a quoted key holding a dot is one name: escaped, as the filter language reads a dot as a path
    literal = search.parse_chips(['"a.b"=1', "c.d=2"])
    assert search.filter_of(literal) == {"a\\.b": 1, "c": {"d": 2}}
    dated = search.parse_chips(["image.taken_at>=2024-05-01", "image.taken_at<2024-06-01", "kind=photo"])
    assert search.filter_of(dated) == {
        "image": {"taken_at": {"$gte": "2024-05-01", "$lt": "2024-06-01"}},
        "kind": "photo",
    }
    two = search.parse_chips(["image.camera=x", "image.taken_at>=2024-05-01"])
    assert search.filter_of(two) == {
        "$and": [{"image": {"camera": "x"}}, {"image": {"taken_at": {"$gte": "2024-05-01"}}}]
    }


TAKEN = {  # external id -> the date the photo was taken (None: no date); p2 and p4 are one instant
    "p1": "2024-05-03T10:00:00Z",
    "p2": "2023-01-01T00:00:00Z",
    "p3": None,
    "p4": "2023-01-01T01:00:00+01:00",
    "p5": "2025-12-31",
    "p6": "not a date",
    "p7": "2024-01-15T08:30:00Z",
}


@pytest.fixture
def photos(api: httpx.Client, ui_collection: str) -> dict[str, int]:
    items = []
    for i, (eid, taken) in enumerate(TAKEN.items()):
        meta: dict[str, Any] = {"kind": "odd" if i % 2 else "even"}
        if taken is not None:
            meta["image"] = {"taken_at": taken}
        items.append({"external_id": eid, "text": f"photo {eid}", "metadata": meta})
    r = api.post(f"/v1/collections/{ui_collection}/items?wait=true", json={"items": items})
    assert r.status_code == 201, r.text
    return {it["external_id"]: it["id"] for it in r.json()["items"]}


def _in_order(page: httpx.Response) -> list[int]:
    return [int(i) for i in ROW.findall(page.text)]


def _pages(client: httpx.Client, first: httpx.Response) -> list[list[int]]:
    """The ids of each page, following the Next page links."""
    pages = [_in_order(first)]
    page = first
    while (link := re.search(r'<a href="([^"]+)" class="button">Next page</a>', page.text)) is not None:
        page = client.get(link[1].replace("&amp;", "&"))
        assert page.status_code == 200, page.text[-500:]
        pages.append(_in_order(page))
        assert len(pages) < 20
    return pages


def test_the_sort_control_orders_by_date_taken(admin_page, ui_collection, photos) -> None:
    ids = photos
    newest = [ids[e] for e in ("p5", "p1", "p7", "p4", "p2", "p6", "p3")]  # ties by id; undated last
    oldest = [ids[e] for e in ("p2", "p4", "p7", "p1", "p5", "p3", "p6")]
    page = _get(admin_page, ui_collection)
    assert 'id="sort-form"' in page.text
    assert '<option value="added" selected>added</option>' in page.text
    assert "newest taken first" in page.text and "oldest taken first" in page.text
    assert _in_order(page) == sorted(ids.values())  # added: id order, as before
    page = _get(admin_page, ui_collection, sort="taken-desc")
    assert page.status_code == 200, page.text[-500:]
    assert _in_order(page) == newest
    assert '<option value="taken-desc" selected>newest taken first</option>' in page.text
    assert '<input type="hidden" name="sort" value="taken-desc">' in page.text  # the search form keeps it
    assert _in_order(_get(admin_page, ui_collection, sort="taken-asc")) == oldest
    # With filter chips: the chips' items in that order; the chip links keep the order.
    even = [i for i in newest if list(ids.values()).index(i) % 2 == 0]
    page = _get(admin_page, ui_collection, "kind=even", sort="taken-desc")
    assert _in_order(page) == even and "Items matching the filters" in page.text
    remove = re.search(r'<a href="([^"]+)" aria-label="Remove filter kind: even"', page.text)
    assert remove and "sort=taken-desc" in remove[1]
    # A typed query ranks by relevance, whatever the sort; its links drop the sort.
    found = _get(admin_page, ui_collection, q="photo", mode="keyword", sort="taken-desc")
    assert found.status_code == 200 and 'id="sort-form"' not in found.text


def test_a_sorted_listing_pages_by_its_cursor(admin_page, ui_collection, photos, monkeypatch) -> None:
    from memstore.ui import browse

    ids = photos
    monkeypatch.setattr(browse, "BROWSE_PAGE", 2)  # the server runs in this process
    for sort, order in (
        ("taken-desc", ("p5", "p1", "p7", "p4", "p2", "p6", "p3")),
        ("taken-asc", ("p2", "p4", "p7", "p1", "p5", "p3", "p6")),
    ):
        first = _get(admin_page, ui_collection, sort=sort)
        pages = _pages(admin_page, first)
        assert [i for p in pages for i in p] == [ids[e] for e in order]  # no duplicate, no gap
        assert [len(p) for p in pages] == [2, 2, 2, 1]
        link = re.search(r'<a href="([^"]+)" class="button">Next page</a>', first.text)
        assert link and f"sort={sort}" in link[1] and "cursor=" in link[1] and "after=" not in link[1]
    odd = _pages(admin_page, _get(admin_page, ui_collection, "kind=odd", sort="taken-asc"))
    assert [i for p in odd for i in p] == [ids[e] for e in ("p2", "p4", "p6")]  # the odd ones, oldest first
    added = _pages(admin_page, _get(admin_page, ui_collection))
    assert [i for p in added for i in p] == sorted(ids.values())


def test_sort_abuse_is_explained_on_the_page(admin_page, ui_collection, photos, monkeypatch) -> None:
    from memstore.ui import browse

    first = _get(admin_page, ui_collection, sort="taken-desc")
    assert first.status_code == 200
    evil = _get(admin_page, ui_collection, sort="<script>alert(1)</script>")
    assert evil.status_code == 422 and "<script>alert(1)" not in evil.text
    assert "sort is one of added, taken-desc, taken-asc" in evil.text and 'id="search-error"' in evil.text
    assert _in_order(evil) == sorted(photos.values())  # the items, in the order added
    for params in (
        {"sort": "taken-desc", "cursor": "forged"},
        {"sort": "taken-desc", "cursor": "W10"},  # base64 of []
        {"sort": "taken-desc", "cursor": "eyJ4IjoxfQ"},  # base64 of {"x":1}
        {"sort": "taken-desc", "cursor": "<b>x</b>"},
        {"sort": "added", "cursor": "forged"},
        {"sort": "taken-desc", "after": "3"},
        {"sort": "taken-asc", "cursor": "A" * 8000},
    ):
        page = admin_page.get(f"/ui/c/{ui_collection}", params=params)
        assert page.status_code == 422, (params, page.status_code, page.text[-300:])
        assert 'id="search-error"' in page.text and "<b>x</b>" not in page.text
    too_long = admin_page.get(f"/ui/c/{ui_collection}", params={"sort": "taken-desc", "cursor": "A" * 9000})
    assert too_long.status_code in (404, 422) and "Traceback" not in too_long.text
    # A cursor of one order is refused by the other.
    monkeypatch.setattr(browse, "BROWSE_PAGE", 2)  # the server runs in this process
    link = re.search(r"cursor=([A-Za-z0-9_-]+)", _get(admin_page, ui_collection, sort="taken-desc").text)
    assert link
    other = _get(admin_page, ui_collection, sort="taken-asc", cursor=link[1])
    assert other.status_code == 422 and "cursor" in other.text
