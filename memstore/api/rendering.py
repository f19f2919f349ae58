"""One JSON rendering for every answer: compact, UTF-8, and never a NaN or an infinity.

Starlette's ``JSONResponse`` renders the same way; the plain-ASGI layers (the search fast path, the
front's refusals) use ``render`` so that no route answers in a different shape.
"""

from __future__ import annotations

import json
from typing import Any


def render(content: Any) -> bytes:
    return json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()
