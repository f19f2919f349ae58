"""How a metadata field is named, everywhere a request names one (a filter's keys, ``group_by``, a
typed index's field, a listing's ``order_by``, a collection's ``text_fields``): a key, or a dotted path
of keys to a nested field, as MongoDB and Qdrant write it (``exif.iso``); a backslash makes the next
dot, backslash or ``$`` part of a key (``price\\.usd`` is the one key ``price.usd``, ``\\$ref`` the key
``$ref``, which unescaped a filter reads as an operator)."""

from __future__ import annotations

import json

from memstore.errors import InvalidInputError


def split_names(key: str, path: object = "filter") -> tuple[str, ...]:
    """The names a field's key holds (``path``: where the key is, for messages): a dot separates
    nested fields (``exif.iso``), a backslash makes the next dot or backslash part of a name
    (``price\\.usd`` is the one key ``price.usd``). InvalidInputError for an empty name between
    dots, or a name after a dot that starts with "$"."""
    if "\\" not in key:
        names = key.split(".") if "." in key else [key]
        return _checked_names(key, names, path, set())
    names = []
    current: list[str] = []
    literal_dollar: set[int] = set()  # the names whose first "$" was escaped: keys, not operators
    escaped = False
    for ch in key:
        if escaped:
            if ch == "$" and not current:
                literal_dollar.add(len(names))
            current.append(ch if ch in ".\\$" else "\\" + ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == ".":
            names.append("".join(current))
            current = []
        else:
            current.append(ch)
    names.append("".join(current) + ("\\" if escaped else ""))
    return _checked_names(key, names, path, literal_dollar)


def _checked_names(key: str, names: list[str], path: object, literal_dollar: set[int]) -> tuple[str, ...]:
    if len(names) > 1 and "" in names:
        raise InvalidInputError(
            f"{path}: {json.dumps(key)[:80]} has an empty name between dots; a dot separates nested fields "
            '("exif.iso") and "\\." is a dot inside a name'
        )
    if any(name.startswith("$") and i not in literal_dollar for i, name in enumerate(names) if i):
        raise InvalidInputError(
            f"{path}: {json.dumps(key)[:80]} has a name starting with $ after a dot (a key that starts with $ "
            'is written "\\$")'
        )
    return tuple(names)


def escape_name(name: str) -> str:
    """``name`` as one key of a filter, whatever dots, backslashes or leading ``$`` it holds
    (``split_names``)."""
    escaped = name.replace("\\", "\\\\").replace(".", "\\.")
    return "\\" + escaped if escaped.startswith("$") else escaped
