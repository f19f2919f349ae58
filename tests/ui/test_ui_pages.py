"""The pages over HTTP, signed in with a session cookie: what each shows and each change they make."""

from __future__ import annotations

import html
import json
import re

import httpx

from tests.api.api_helpers import make_image, wait_ready
from tests.ui.ui_helpers import csrf_of, wait_until


def _add_texts(api: httpx.Client, name: str, texts: dict[str, str], metadata: dict | None = None) -> dict[str, int]:
    items = [{"external_id": eid, "text": text, "metadata": metadata or {}} for eid, text in texts.items()]
    r = api.post(f"/v1/collections/{name}/items?wait=true", json={"items": items})
    assert r.status_code == 201, r.text
    return {it["external_id"]: it["id"] for it in r.json()["items"]}


def _add_images(api: httpx.Client, name: str, count: int, seed: int = 0) -> list[int]:
    files = [("files", (f"photo-{i}.jpg", make_image(seed + i), "image/jpeg")) for i in range(count)]
    r = api.post(f"/v1/collections/{name}/items?wait=true", files=files)
    assert r.status_code == 201, r.text
    return [it["id"] for it in r.json()["items"]]


def test_the_collections_page_lists_counts_index_size_and_health(admin_page, api, ui_collection) -> None:
    _add_texts(api, ui_collection, {"a": "a red bicycle", "b": "a blue boat"})
    page = admin_page.get("/ui/")
    assert page.status_code == 200
    row = re.search(rf'<tr data-collection="{ui_collection}">(.*?)</tr>', page.text, re.S)
    assert row, page.text
    cells = re.findall(r'<td class="num">([^<]*)', row[1])
    assert cells[:3] == ["2", "0", "0"]  # items, pending, failed
    assert cells[3].endswith(("KiB", "MiB"))  # the index size, readable
    assert "healthy" in row[1]


def test_a_text_query_in_the_address_opens_with_its_results(admin_page, api, ui_collection) -> None:
    ids = _add_texts(api, ui_collection, {"bike": "a red bicycle", "boat": "a blue boat", "cat": "a cat"})
    page = admin_page.get(f"/ui/c/{ui_collection}", params={"q": "a red bicycle"})
    assert page.status_code == 200
    shown = [int(i) for i in re.findall(r'<li class="result" data-item="(\d+)"', page.text)]
    assert sorted(shown) == sorted(ids.values())
    assert shown[0] == ids["bike"]  # the same text embeds to the same vector: the nearest
    assert "Results for “a red bicycle”" in page.text
    assert f'href="/ui/c/{ui_collection}?like={ids["bike"]}"' in page.text  # more like this


def test_a_typed_query_finds_by_keyword_what_the_model_cannot_embed(admin_page, api, collection_name) -> None:
    """A collection of 8-dimensional vectors the server's model does not make: the words of the query
    still find items by keyword (a hybrid search where the model can embed, keyword search here)."""
    r = api.post("/v1/collections", json={"name": collection_name, "dimensions": 8, "text_fields": ["sku"]})
    assert r.status_code == 201, r.text
    items = [
        {"external_id": "kettle", "vector": [0.1] * 7 + [1.0], "text": "Stainless kettle", "metadata": {"sku": "KT-1"}},
        {"external_id": "pan", "vector": [1.0] + [0.1] * 7, "text": "Cast iron pan", "metadata": {"sku": "PN-2"}},
    ]
    r = api.post(f"/v1/collections/{collection_name}/items", json={"items": items})
    assert r.status_code == 201, r.text
    ids = {it["external_id"]: it["id"] for it in r.json()["items"]}
    page = admin_page.get(f"/ui/c/{collection_name}", params={"q": "PN-2"})
    assert page.status_code == 200, page.text
    assert [int(i) for i in re.findall(r'<li class="result" data-item="(\d+)"', page.text)] == [ids["pan"]]


def test_filter_chips_narrow_the_results_and_keep_value_types(admin_page, api, ui_collection) -> None:
    _add_texts(api, ui_collection, {"x": "one"}, {"year": 2020, "album": "paris"})
    _add_texts(api, ui_collection, {"y": "two"}, {"year": "2020", "album": "rome"})
    number = admin_page.get(f"/ui/c/{ui_collection}", params={"q": "one", "f": "year=2020"})
    assert len(re.findall(r'class="result"', number.text)) == 1
    assert "year: 2020" in number.text
    string = admin_page.get(f"/ui/c/{ui_collection}", params={"q": "one", "f": 'year="2020"'})
    assert len(re.findall(r'class="result"', string.text)) == 1
    both = admin_page.get(f"/ui/c/{ui_collection}", params=[("q", "one"), ("f", "year=2020"), ("f", "album=rome")])
    assert "Nothing matches." in both.text


def test_more_like_this_searches_by_the_stored_item(admin_page, api, ui_collection) -> None:
    ids = _add_texts(api, ui_collection, {"a": "first", "b": "second"})
    page = admin_page.get(f"/ui/c/{ui_collection}", params={"like": ids["a"]})
    shown = [int(i) for i in re.findall(r'data-item="(\d+)"', page.text)]
    assert shown == [ids["b"]]  # its neighbours, never the item itself
    assert "More like" in page.text
    for bad in ("abc", "0", "-3", "9" * 30):
        refused = admin_page.get(f"/ui/c/{ui_collection}", params={"like": bad})
        assert refused.status_code == 422 and "like: an item id (a whole number from 1)" in refused.text, bad
    long = admin_page.get(f"/ui/c/{ui_collection}", params={"q": "word " * 3000})
    assert long.status_code == 422 and 'id="search-error"' in long.text, long.text[-400:]


def test_an_item_page_shows_the_original_metadata_and_neighbours(admin_page, api, ui_collection) -> None:
    [first, second] = _add_images(api, ui_collection, 2)
    page = admin_page.get(f"/ui/c/{ui_collection}/items/{first}")
    assert page.status_code == 200
    assert f'src="/ui/c/{ui_collection}/items/{first}/original"' in page.text
    assert "photo-0.jpg" in page.text  # the file name, kept as metadata
    neighbours = re.search(r'<ul class="results compact" id="neighbours">(.*?)</ul>', page.text, re.S)
    assert neighbours and f'data-item="{second}"' in neighbours[1]
    assert f'data-item="{first}"' not in neighbours[1]  # not its own neighbour
    original = admin_page.get(f"/ui/c/{ui_collection}/items/{first}/original")
    assert original.status_code == 200 and original.content[:2] == b"\xff\xd8"
    assert original.headers["content-security-policy"].startswith("sandbox")


def test_metadata_edits_are_saved_and_bad_json_is_explained(admin_page, api, ui_collection) -> None:
    ids = _add_texts(api, ui_collection, {"a": "some text"}, {"old": 1})
    url = f"/ui/c/{ui_collection}/items/{ids['a']}"
    csrf = csrf_of(admin_page.get(url).text)
    saved = admin_page.post(f"{url}/metadata", data={"csrf": csrf, "metadata": '{"new": "value"}'})
    assert saved.status_code == 303 and saved.headers["location"].endswith("?notice=saved")
    assert api.get(f"/v1/collections/{ui_collection}/items/{ids['a']}").json()["metadata"] == {"new": "value"}
    bad = admin_page.post(f"{url}/metadata", data={"csrf": csrf, "metadata": '{"unclosed": '})
    assert bad.status_code == 422
    assert "not valid JSON" in bad.text
    assert "{&#34;unclosed&#34;: " in bad.text  # what was typed is kept in the form (escaped)
    listed = admin_page.post(f"{url}/metadata", data={"csrf": csrf, "metadata": "[1, 2]"})
    assert listed.status_code == 422 and "must be a JSON object" in listed.text
    assert api.get(f"/v1/collections/{ui_collection}/items/{ids['a']}").json()["metadata"] == {"new": "value"}


def test_deleting_an_item_takes_the_confirmation_form(admin_page, api, ui_collection) -> None:
    ids = _add_texts(api, ui_collection, {"a": "doomed"})
    url = f"/ui/c/{ui_collection}/items/{ids['a']}"
    page = admin_page.get(url).text
    assert 'id="confirm-delete"' in page and "cannot be undone" in page
    done = admin_page.post(f"{url}/delete", data={"csrf": csrf_of(page)})
    assert done.status_code == 303 and done.headers["location"] == f"/ui/c/{ui_collection}?notice=deleted"
    assert api.get(f"/v1/collections/{ui_collection}/items/{ids['a']}").status_code == 404
    gone = admin_page.get(url)
    assert gone.status_code == 404 and "Not found" in gone.text


def test_thumbnails_are_made_at_ingest_and_served_with_etag_and_cache_control(admin_page, api, ui_collection) -> None:
    [item] = _add_images(api, ui_collection, 1, seed=7)
    url = f"/ui/c/{ui_collection}/items/{item}/thumbnail"
    first = admin_page.get(url)
    assert first.status_code == 200
    assert first.headers["content-type"] == "image/webp"
    assert first.content[:4] == b"RIFF" and first.content[8:12] == b"WEBP"
    assert first.headers["cache-control"] == "private, max-age=300"
    again = admin_page.get(url, headers={"If-None-Match": first.headers["etag"]})
    assert again.status_code == 304 and again.content == b""
    assert admin_page.get(url, headers={"If-None-Match": '"other"'}).status_code == 200


def test_new_content_replaces_the_thumbnail(admin_page, api, ui_collection) -> None:
    files = [("files", ("a.jpg", make_image(1), "image/jpeg"))]
    [item] = api.post(
        f"/v1/collections/{ui_collection}/items?wait=true", files=files, data={"external_id": "x"}
    ).json()["items"]
    url = f"/ui/c/{ui_collection}/items/{item['id']}/thumbnail"
    before = admin_page.get(url).headers["etag"]
    replaced = api.put(
        f"/v1/collections/{ui_collection}/items/{item['id']}/content?wait=true",
        files={"file": ("b.png", make_image(99, size=(120, 40), fmt="PNG"), "image/png")},
    )
    assert replaced.status_code in (201, 202), replaced.text
    wait_ready(api, ui_collection)
    after = wait_until(lambda: admin_page.get(url), what="the new thumbnail")
    assert after.status_code == 200 and after.headers["etag"] != before


def test_text_items_show_their_text_as_a_card_and_have_no_thumbnail(admin_page, api, ui_collection) -> None:
    ids = _add_texts(api, ui_collection, {"t": "a note about tides"})
    page = admin_page.get(f"/ui/c/{ui_collection}")
    assert '<span class="snippet">a note about tides</span>' in page.text
    assert admin_page.get(f"/ui/c/{ui_collection}/items/{ids['t']}/thumbnail").status_code == 404


def test_the_maintenance_page_draws_its_charts_from_the_history(admin_page, ui_collection, engine) -> None:
    from memstore.db.core import raw_connection

    with raw_connection(engine) as conn:
        for minutes, recall, dead, size in (
            (30, 0.97, 10, 1_000_000),
            (20, 0.91, 400, 1_400_000),
            (10, 0.99, 0, 900_000),
        ):
            conn.execute(
                "INSERT INTO memstore_maintenance_probes (collection, partition_table, taken_at, live_rows, dead_rows, "
                "index_bytes, fresh_index_bytes, recall, recommendation) VALUES "
                "(%s, %s, now() - make_interval(mins => %s), 1000, %s, %s, 900000, %s, 'nothing')",
                (ui_collection, f"c_{ui_collection}", minutes, dead, size, recall),
            )
        conn.execute(
            "INSERT INTO memstore_maintenance_actions (collection, partition_table, action, reason, started_at, "
            "finished_at, duration_s, outcome) VALUES (%s, %s, 'rebuild', %s, now() - interval '15 minutes', "
            "now() - interval '14 minutes', 42.5, 'ok')",
            (ui_collection, f"c_{ui_collection}", "recall 0.91 < 0.95 <b>"),
        )
    page = admin_page.get("/ui/maintenance", params={"c": ui_collection})
    assert page.status_code == 200
    section = re.search(
        rf'<section class="card maint" data-collection="{ui_collection}">(.*?)</section>', page.text, re.S
    )
    assert section, page.text
    charts = re.findall(r'<svg viewBox="0 0 480 190" role="img" aria-label="([^"]+)"', section[1])
    assert charts == ["Sampled recall", "Dead entries per live row", "Index size (dashed: a fresh build)"]
    assert section[1].count("<polyline") == 4  # recall, dead, size and the fresh build's size
    assert len(re.findall(r'<circle cx="[\d.]+" cy="[\d.]+" r="2.5" class="dot series-0"/>', section[1])) >= 9
    assert 'class="marker action-rebuild"' in section[1]
    assert "42.5 s" in section[1] and "recall 0.91 &lt; 0.95 &lt;b&gt;" in section[1]


def test_an_image_page_shows_the_text_read_in_it_escaped(admin_page, api, collection_name, engine) -> None:
    from memstore.catalog import ocr_items
    from memstore.catalog.registry import read_collection
    from memstore.db.core import raw_connection

    assert api.post("/v1/collections", json={"name": collection_name, "ocr": True}).status_code == 201
    [read, failed] = _add_images(api, collection_name, 2, seed=40)
    # Written as a worker would (what Tesseract reads is its own test's business): the page shows the
    # text, escaped, and a failure's reason.
    with raw_connection(engine) as conn:
        c = read_collection(conn, name=collection_name)
        ocr_items.write_text(conn, c, read, 'INVOICE 42 <script>alert("x")</script>')
        ocr_items.write_failure(conn, c, failed, "the image could not be decoded")
    page = admin_page.get(f"/ui/c/{collection_name}/items/{read}")
    assert page.status_code == 200
    shown = re.search(r'<pre class="text-original" id="ocr-text">(.*?)</pre>', page.text, re.S)
    assert shown and "INVOICE 42" in shown[1]
    assert "<script>alert" not in page.text and "&lt;script&gt;" in shown[1]
    other = admin_page.get(f"/ui/c/{collection_name}/items/{failed}").text
    assert 'id="ocr-error">the image could not be decoded<' in other
    # A collection without OCR shows no such section.
    plain_name = f"{collection_name}_x"
    assert api.post("/v1/collections", json={"name": plain_name}).status_code == 201
    [plain] = _add_images(api, plain_name, 1)
    assert 'id="ocr"' not in admin_page.get(f"/ui/c/{plain_name}/items/{plain}").text


def test_the_bare_address_leads_to_the_pages(server) -> None:
    """GET / answers a redirect to the web pages (relative, for a proxy's path), whose front door
    asks for a key: nothing of a collection is shown to the anonymous visitor on the way."""
    with httpx.Client(base_url=server.url, timeout=60) as anonymous:
        r = anonymous.get("/")
        assert r.status_code == 307 and r.headers["location"] == "ui/"
        followed = anonymous.get("/", follow_redirects=True)
        assert followed.url.path.startswith("/ui/") and followed.status_code == 200, followed.url
        assert "sign in" in followed.text.lower()
        assert anonymous.post("/").status_code == 405  # a redirect for reading only


def test_a_long_text_file_is_refused_for_its_length_not_its_encoding(admin_page, api, ui_collection) -> None:
    csrf = csrf_of(admin_page.get(f"/ui/c/{ui_collection}").text)
    for name, body in (("emoji.txt", "😀" * 9000), ("ascii.txt", "a" * 40_000)):
        r = admin_page.post(
            f"/ui/c/{ui_collection}/upload",
            files={"file": (name, body.encode(), "text/plain")},
            headers={"X-CSRF-Token": csrf},
        )
        assert r.status_code == 422, r.text
        assert "more than 8192 characters; the limit is 8192" in r.text, r.text
    fits = admin_page.post(
        f"/ui/c/{ui_collection}/upload",
        files={"file": ("fits.txt", ("😀" * 8192).encode(), "text/plain")},
        headers={"X-CSRF-Token": csrf},
    )
    assert fits.status_code == 200 and fits.json()["status"] == "pending", fits.text


def _browser_form(text: str) -> str:
    """A textarea as a browser posts it: its line breaks as CR LF (each one %0D%0A once URL-encoded)."""
    return text.replace("\r\n", "\n").replace("\n", "\r\n")


def _deep(levels: int, leaf: dict) -> dict:
    for _ in range(levels):
        leaf = {"n": leaf}
    return leaf


def test_large_nested_metadata_saves_unchanged_and_an_oversized_form_is_explained(
    admin_page, api, ui_collection
) -> None:
    """About 40 KB of nested metadata (the limit is 64 KiB) saved as the page shows it: pretty-printed
    and URL-encoded, it is over 450 KB."""
    nested = {
        "albums": [
            {"name": f"album {i}", "photos": [_deep(16, {"id": j, "xy": [1, 2, 3, 4, 5, 6]}) for j in range(16)]}
            for i in range(16)
        ]
    }
    ids = _add_texts(api, ui_collection, {"big": "large metadata"}, nested)
    url = f"/ui/c/{ui_collection}/items/{ids['big']}"
    page = admin_page.get(url)
    shown = re.search(r'<textarea id="metadata-json" name="metadata"[^>]*>(.*?)</textarea>', page.text, re.S)
    assert shown
    text = html.unescape(shown[1])
    assert json.loads(text) == nested
    csrf = csrf_of(page.text)
    saved = admin_page.post(f"{url}/metadata", data={"csrf": csrf, "metadata": _browser_form(text)})
    assert saved.status_code == 303, saved.text[-500:]
    assert saved.headers["location"].endswith("?notice=saved")
    assert api.get(f"/v1/collections/{ui_collection}/items/{ids['big']}").json()["metadata"] == nested
    # Over the metadata limit: the page's own message, with what was sent kept in the form.
    big = admin_page.post(f"{url}/metadata", data={"csrf": csrf, "metadata": json.dumps({"x": "y" * 300_000})})
    assert big.status_code == 422, big.text[-500:]
    assert re.search(r'id="metadata-error">metadata is \d+ bytes; the limit is 65536<', big.text)
    # A form the parser refuses (more fields than it has) is the same inline error, never a 500.
    fields = {"csrf": csrf, "metadata": "{}", **{f"extra{i}": "x" for i in range(6)}}
    odd = admin_page.post(f"{url}/metadata", data=fields)
    assert odd.status_code == 422 and 'id="metadata-error"' in odd.text, odd.text[-500:]
    # Over the route's body limit: refused before it is read, as a page.
    huge = admin_page.post(
        f"{url}/metadata",
        data={"csrf": csrf, "metadata": "y" * 1_200_000},
        headers={"Accept": "text/html,application/xhtml+xml"},
    )
    assert huge.status_code == 413 and huge.headers["content-type"].startswith("text/html"), huge.text[-500:]
    assert "over the limit of" in huge.text and "<h1>Payload too large</h1>" in huge.text
    assert api.get(f"/v1/collections/{ui_collection}/items/{ids['big']}").json()["metadata"] == nested


def test_an_uploaded_files_name_is_kept_as_written(admin_page, api, ui_collection) -> None:
    """Browsers send a quote, CR and LF in a multipart file name as %22, %0D and %0A; a % of the name's
    own stays as it is."""
    csrf = csrf_of(admin_page.get(f"/ui/c/{ui_collection}").text)
    names = ['say "hi".txt', "100%41 real.txt", "two\r\nlines.txt"]
    stored = []
    for i, name in enumerate(names):
        r = admin_page.post(
            f"/ui/c/{ui_collection}/upload",
            files={"file": (name, f"text number {i}".encode(), "text/plain")},
            headers={"X-CSRF-Token": csrf},
        )
        assert r.status_code == 200, r.text
        stored.append(api.get(f"/v1/collections/{ui_collection}/items/{r.json()['id']}").json()["metadata"])
    assert [m["filename"] for m in stored] == names
