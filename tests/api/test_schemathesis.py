"""A bounded schemathesis run over the OpenAPI schema: no generated request may get a 5xx answer."""

from __future__ import annotations

import json

import httpx
import pytest

schemathesis = pytest.importorskip(
    "schemathesis", reason="schemathesis is not installed (pip install schemathesis): property run skipped"
)
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402


@schemathesis.serializer("application/x-ndjson")
def _ndjson(_ctx: object, value: object) -> bytes:
    """The load route's body: generated strings sent as they are (most are bad lines, which is the point)."""
    return value.encode() if isinstance(value, str) else json.dumps(value).encode()


EXAMPLES = 25  # per operation and generation mode; the whole run stays well under two minutes


def test_no_generated_request_gets_a_server_error(fake_server, fake_admin_key, fake_collection) -> None:
    schema = schemathesis.openapi.from_url(f"{fake_server.url}/openapi.json")
    headers = {"Authorization": f"Bearer {fake_admin_key}"}
    # Keep the collection alive: generated DELETEs go to other names only.
    failures: list[str] = []
    calls = 0
    statuses: dict[int, int] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
            )
            def run(case: schemathesis.Case) -> None:
                nonlocal calls
                if "name" in (case.path_parameters or {}) and case.method != "DELETE" and calls % 2 == 0:
                    case.path_parameters["name"] = fake_collection  # reach past the 404 half of the time
                calls += 1
                try:
                    response = case.call(headers=headers, timeout=30)
                except httpx.HTTPError as exc:  # pragma: no cover - shown in the failure list
                    failures.append(f"{case.method} {case.formatted_path}: {exc}")
                    return
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                if response.status_code >= 500:
                    failures.append(
                        f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:300]}"
                    )

            try:
                run()
            except Unsatisfiable:  # nothing to break in this mode (e.g. no parameters at all)
                continue
    print(f"schemathesis: {calls} requests, statuses {sorted(statuses.items())}")
    assert calls > 200
    assert sum(n for code, n in statuses.items() if code < 300) > 20, statuses  # success paths were reached
    assert not failures, "\n".join(failures[:10])
