"""Search filters: a JSON object compiled, in one checking pass, to one parameterised SQL condition
on a collection's ``metadata`` column.

The language::

    filter    = { clause, ... }            every clause holds; {} matches every row
    clause    = "field": value             a field's name, or a dotted path of names ("exif.iso" is
                                           {"exif": {"iso": ...}}, as in MongoDB and Qdrant; "\\."
                                           is a dot inside a name: split_names)
              | "$and": [filter, ...]      every filter holds (a non-empty list)
              | "$or":  [filter, ...]      some filter holds (a non-empty list)
              | "$not": filter             the filter does not hold
    value     = operators                  a non-empty object whose keys all start with "$"
              | fields                     a non-empty object with no "$" key: the fields of a nested
                                           object, each a clause of its own ({"exif": {"iso": ...}})
              | anything else              plain JSON, matched by containment, as before this language
    operators = {"$eq": v, "$ne": v, "$gt": v, "$gte": v, "$lt": v, "$lte": v, "$in": [v, ...],
                 "$nin": [v, ...], "$exists": true|false, "$contains": v, "$all": [v, ...],
                 "$size": n, "$not": operators}

An object that mixes "$" keys and field names as a field's value is refused (is it a comparison or
a nested object?). In a filter object, "$" keys are the logical operators next to the fields, so a
metadata key that starts with "$" can be matched only inside a plain value.

What each part means (lists follow MongoDB's and Qdrant's rules):

- A scalar condition on a field that holds a list is met when an element meets it: a plain scalar
  value, ``$eq`` and ``$in`` (an element equal to the value, or to one of the values), and the
  ranges. ``{"tags": "pets"}`` matches ``"tags": "pets"`` and ``"tags": ["pets", "holiday"]``.
- Each operator of a field's object is met on its own: ``{"n": {"$gt": 1, "$lt": 5}}`` matches
  ``"n": 3`` and also ``"n": [0, 10]`` (10 is above 1, 0 is below 5), as in MongoDB. There is no
  ``$elemMatch``: the language cannot ask for one element that meets every bound.
- Plain values are JSON containment: a scalar is equal to the field or to an element of it (as
  written: numbers by value, strings exactly, so "2024-05-01" is not "2024-05-01T00:00Z"); an array
  value is held by an array field (every listed value); an object value ``{}`` matches an object
  field. Each plain scalar is one ``metadata @> ANY('{"f": v}', '{"f": [v]}')``, and the plain arrays
  and objects of one filter object (nested fields included) fold into one ``metadata @> %(f_n)s``;
  the collection's GIN index serves both.
- Comparisons are typed by their operand: a JSON number compares numbers (exactly, as numeric); a
  string in ISO 8601 form (``YYYY-MM-DD``, optionally ``THH:MM``, ``:SS``, ``.ffffff`` and ``Z`` or
  ``+HH:MM``; without an offset it is UTC) compares instants; any other string compares strings by
  code point (COLLATE "C": independent of the database's locale). A field value (or element) of
  another type never satisfies a comparison: a number is never equal to, above or below a string,
  "10" is not a number, a string not in ISO form is not a date, and strings longer than
  MAX_KEYWORD_LENGTH characters are not ranged over (see migration 0005). The range operators of one
  object must share one type (a number above 5 and before May never matches anything). A range
  operand that reads as a date in another form (``2024/05/01``, ``05/01/2024``, ``01.05.2024``,
  ``2024-5-1``, ``May 1, 2024``: ``looks_like_date``) is refused rather than compared as a string.
- ``$eq`` with a date compares instants ("2024-05-01" equals "2024-05-01T00:00:00Z"); with a
  number, a string, true, false or null it is JSON equality, which is typed equality for numbers and
  strings (numbers by value, strings exactly, at any length). With an array or an object it is JSON
  equality (arrays in order, objects with exactly the same pairs) of the whole field, or of one of
  its elements: ``{"$eq": ["a"]}`` matches ``["a"]`` and ``[["a"], "b"]``. null is equal to null
  only: a missing field is not null (``$exists`` asks for that).
- ``$in`` holds values of one type (a mixed list is refused; true, false, null, arrays and objects
  count as one type); an empty list matches nothing.
- ``$ne``, ``$nin`` and ``$not`` are the negations of ``$eq``, ``$in`` and their filter: ``$ne``
  matches a list with no element equal to the value, and a missing field or one of another type.
- ``$exists: true`` matches rows that have the key (even when its value is null); ``false`` those
  that have not.
- ``$contains`` matches rows whose field is an array holding the operand, or every value of a list
  operand (as containment: an equal scalar, or an object or array element that contains it).
  ``$all`` is ``$contains`` with a non-empty list.
- ``$size: n`` matches rows whose field is an array of n elements.
- A nested field whose parent is missing, or is not an object (a list of objects included), is
  missing.

The SQL: values always go in as parameters (``%(f_0)s``, ``%(f_1)s``, ...). Field names go in as SQL
literals (``sql.Literal``, quoted by psycopg), because an expression index is only matched by the
same expression: ``metadata -> 'taken'`` matches an index on it, ``metadata -> $1`` does not in a
generic plan. A name holding "%" goes in as a parameter instead (psycopg would read the "%" in the
query text as a placeholder), so an index on such a field serves custom plans only. The typed
comparisons use the expressions of ``memstore.catalog.metadata_sql`` (``typed_expression``): a range, or
``$eq``/``$in`` with dates, is ``(typed(f) <op> v OR (jsonb_typeof(f) = 'array' AND EXISTS (an
element <op> v)))``: a typed index serves the first branch and the partial index built beside it (the
rows whose field is a list) the second, as a BitmapOr, however sparse the field.

Bounds: MAX_FILTER_BYTES of JSON, MAX_FILTER_DEPTH levels (the filter is one; each filter under a
logical operator, each object or array in a field's value is one more), MAX_FILTER_CLAUSES conditions
and MAX_LIST_VALUES values in a list.
"""

from __future__ import annotations

import calendar
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Literal

from psycopg import sql
from psycopg.types.json import Jsonb

from memstore.catalog.field_paths import split_names
from memstore.catalog.metadata_sql import (
    MAX_KEYWORD_LENGTH,
    is_list,
    json_value,
    typed_expression,
    typed_value,
)
from memstore.errors import InvalidInputError
from memstore.inputs import MAX_FILTER_BYTES, MAX_FILTER_DEPTH, has_nul

MAX_FILTER_CLAUSES = 64
# The two constant conditions, compared by identity when conditions are joined (``_join``).
TRUE = sql.SQL("TRUE")
FALSE = sql.SQL("FALSE")
MAX_LIST_VALUES = 512

# "json": true, false, null, arrays and objects, which only $eq/$ne/$in/$nin take.
Kind = Literal["number", "timestamp", "keyword", "json"]

_RANGE_OPERATORS = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}
_FIELD_OPERATORS = (
    "$eq",
    "$ne",
    *_RANGE_OPERATORS,
    "$in",
    "$nin",
    "$exists",
    "$contains",
    "$all",
    "$size",
    "$not",
)
_LOGICAL_OPERATORS = ("$and", "$or", "$not")
_KIND_NAMES = {
    "number": "a number",
    "timestamp": "a date",
    "keyword": "a string",
    "json": "a boolean, null, array or object",
}

# The grammar of migration 0005's memstore_timestamp; the two must change together.
_ISO_8601 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})"
    r"(?:[Tt ]([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]{1,6}))?)?(?:[Zz]|([+-])([0-9]{2})(?::?([0-9]{2}))?)?)?"
)

# Strings that read as a date in some other form: a range with one as its operand is refused rather
# than compared by code point. Numeric dates (digit groups separated by "-", "/" or "."), whatever
# follows them, and a month's name with a year.
_MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?"
    r"|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_DATE_LIKE = (
    re.compile(r"[0-9]{4}[-/.][0-9]{1,2}[-/.][0-9]{1,2}(?![0-9]).*", re.S),  # 2024/05/01, 2024-5-1, 2024-05-01T10
    re.compile(r"[0-9]{4}[-/][0-9]{1,2}"),  # 2024-05, 2024/5
    re.compile(r"[0-9]{1,2}[-/.][0-9]{1,2}[-/.][0-9]{4}(?![0-9]).*", re.S),  # 05/01/2024, 01.05.2024, 1-5-2024
    re.compile(r"[0-9]{2}[-/.][0-9]{2}[-/.][0-9]{2}(?![0-9]).*", re.S),  # 05/01/24
    re.compile(rf"(?=.*\b{_MONTH}\b)(?=.*\b[0-9]{{4}}\b).*", re.I | re.S),  # May 1, 2024; 1 May 2024
)
_ISO_FORM = "YYYY-MM-DD, optionally followed by THH:MM[:SS[.ffffff]] and Z or +HH:MM"


@dataclass(frozen=True)
class CompiledFilter:
    where: sql.Composable  # a boolean SQL expression over the unqualified column ``metadata``
    params: dict[str, Any]  # the named parameters it uses, every name starting "f_"


def compile_filter(value: Mapping[str, Any]) -> CompiledFilter:
    """Check ``value`` and compile it (see the module's docstring); InvalidInputError names the JSON
    path of the offending part, e.g. ``filter.taken.$gte``."""
    compiler = _Compiler()
    where = compiler.filter(value, _Path("filter"), level=1)
    _check_encoding(value)
    return CompiledFilter(where=where, params=compiler.params)


def looks_like_date(text: str) -> bool:
    """True for a string that reads as a date in a form other than ISO 8601 (``2024/05/01``,
    ``05/01/2024``, ``01.05.2024``, ``2024-5-1``, ``May 1, 2024``); a range refuses such an operand."""
    text = text.strip()
    return any(pattern.fullmatch(text) for pattern in _DATE_LIKE)


def parse_timestamp(text: str) -> datetime | None:
    """``text`` as an aware UTC datetime when it is an ISO 8601 date or date-time of the grammar in
    the module's docstring, else None. OverflowError when the offset moves it out of years 1-9999."""
    match = _ISO_8601.fullmatch(text)
    if match is None:
        return None
    y, mo, d, h, mi, s, fraction, sign, off_h, off_m = match.groups()
    year, month, day = int(y), int(mo), int(d)
    if not (year >= 1 and 1 <= month <= 12 and 1 <= day <= calendar.monthrange(year, month)[1]):
        return None
    hour, minute, second = int(h or 0), int(mi or 0), int(s or 0)
    offset_hours, offset_minutes = int(off_h or 0), int(off_m or 0)
    if hour > 23 or minute > 59 or second > 59 or offset_hours > 23 or offset_minutes > 59:
        return None
    micro = int((fraction or "").ljust(6, "0"))
    local = datetime(year, month, day, hour, minute, second, micro, tzinfo=UTC)
    # The offset is how far local time is ahead of UTC.
    offset = timedelta(hours=offset_hours, minutes=offset_minutes)
    return local + offset if sign == "-" else local - offset


class _Path:
    """Where a part of the filter is, for error messages: ``filter.$or[1].taken.$gte``."""

    _PLAIN = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")

    def __init__(self, text: str) -> None:
        self.text = text

    def key(self, name: str) -> _Path:
        if self._PLAIN.fullmatch(name):
            return _Path(f"{self.text}.{name}")
        return _Path(f"{self.text}[{json.dumps(name)[:80]}]")

    def item(self, index: int) -> _Path:
        return _Path(f"{self.text}[{index}]")

    def __str__(self) -> str:
        return self.text


@dataclass
class _Compiler:
    params: dict[str, Any] = field(default_factory=dict)
    clauses: int = 0
    key_characters: int = 0  # of every key read so far: the filter's size, bounded before it is encoded

    def names(self, key: str, path: _Path) -> tuple[str, ...]:
        """``split_names`` of a field's key, within MAX_FILTER_BYTES of keys in all (a filter whose
        keys alone are larger is refused before they are split: splitting is linear in them)."""
        self.key_characters += len(key) + 1
        if self.key_characters > MAX_FILTER_BYTES:
            raise InvalidInputError(f"{path}: the filter's keys pass {MAX_FILTER_BYTES} bytes, the limit of a filter")
        return split_names(key, path)

    # ------------------------------------------------------------------ filter objects

    def filter(self, value: Any, path: _Path, level: int) -> sql.Composable:
        if not isinstance(value, Mapping):
            raise InvalidInputError(f"{path}: a filter must be a JSON object, not {_type_name(value)}")
        _check_level(level, path)
        plain: dict[str, Any] = {}
        conditions: list[sql.Composable] = []
        for key, item in value.items():
            _check_key(key, path)
            if key.startswith("$"):
                conditions.append(self.logical(key, item, path.key(key), level))
            else:
                self.named(self.names(key, path.key(key)), item, (), path, level, plain, conditions)
        if plain:
            conditions.insert(0, self.containment(plain, path))
        return _all(conditions)

    def logical(self, operator: str, value: Any, path: _Path, level: int) -> sql.Composable:
        if operator == "$not":
            return _negate(self.filter(value, path, level + 1))
        if operator in ("$and", "$or"):
            items = self.list_operand(value, path, allow_empty=False)
            parts = [self.filter(item, path.item(i), level + 1) for i, item in enumerate(items)]
            return _join(parts, "AND" if operator == "$and" else "OR")
        if operator in _FIELD_OPERATORS:
            raise InvalidInputError(f'{path}: {operator} applies to a field, as in {{"field": {{"{operator}": ...}}}}')
        raise InvalidInputError(
            f"{path}: unknown operator {operator}; a filter takes {', '.join(_LOGICAL_OPERATORS)} "
            f'(a field whose key starts with $ is written "\\{operator}")'
        )

    def named(
        self,
        names: tuple[str, ...],
        value: Any,
        prefix: tuple[str, ...],
        path: _Path,
        level: int,
        plain: dict[str, Any],
        conditions: list[sql.Composable],
    ) -> None:
        """A clause whose key names ``names`` under the fields ``prefix`` (a dotted key's names, or one
        name): ``{"exif.iso": v}`` compiles as ``{"exif": {"iso": v}}``, each name one level deeper."""
        head, at = names[0], path.key(names[0])
        if len(names) == 1:
            self.field(head, value, (*prefix, head), at, level, plain, conditions)
            return
        _check_level(level + 1, at)
        nested: dict[str, Any] = {}
        self.named(names[1:], value, (*prefix, head), at, level + 1, nested, conditions)
        if nested:
            self.put_plain(plain, head, nested, prefix, at, conditions)

    def field(
        self,
        key: str,
        value: Any,
        fields: tuple[str, ...],
        path: _Path,
        level: int,
        plain: dict[str, Any],
        conditions: list[sql.Composable],
    ) -> None:
        """One field's clause, its key at ``level``: its operators and plain scalars compile to
        conditions, its plain arrays and empty objects go to ``plain`` (the containment of the filter
        object it is in), nested fields recurse."""
        if _is_operators(value, path):
            conditions.append(self.operators(value, fields, path, level + 1))
        elif isinstance(value, Mapping) and value:
            _check_level(level + 1, path)
            nested: dict[str, Any] = {}
            for name, item in value.items():
                _check_key(name, path)
                self.named(self.names(name, path.key(name)), item, fields, path, level + 1, nested, conditions)
            if nested:
                self.put_plain(plain, key, nested, fields[:-1], path, conditions)
        elif isinstance(value, Mapping | list):
            _check_plain_depth(value, level, path)
            self.put_plain(plain, key, value, fields[:-1], path, conditions)
        else:
            conditions.append(self.holds_scalar(fields, [value], path))

    def put_plain(
        self,
        plain: dict[str, Any],
        key: str,
        value: Any,
        prefix: tuple[str, ...],
        path: _Path,
        conditions: list[sql.Composable],
    ) -> None:
        """``value`` into the containment of its filter object under ``key``. Two clauses on one field
        (``{"exif.iso": [1], "exif": {"iso": [2]}}``, or dotted siblings ``"exif.a"``, ``"exif.b"``)
        fold into one containment where they can (containment of the merge is containment of both);
        an object beside an array gets a containment of its own, from the top."""
        if key not in plain:
            plain[key] = value
            return
        merged = _merged(plain[key], value)
        if merged is not None:
            plain[key] = merged
            return
        conditions.append(self.containment(_under((*prefix, key), value), path))

    # ------------------------------------------------------------------ one field's operators

    def operators(self, ops: Mapping[str, Any], fields: tuple[str, ...], path: _Path, level: int) -> sql.Composable:
        _check_level(level, path)
        conditions: list[sql.Composable] = []
        ranges: list[tuple[str, Any]] = []  # (SQL operator, typed value): one condition, where the first was
        range_kind: Kind | None = None
        range_at = 0
        for operator, operand in ops.items():
            at = path.key(operator)
            if operator != "$not":
                _check_plain_depth(operand, level, at)
            if operator in ("$eq", "$ne"):
                equal = self.among(fields, [operand], at, listed=False)
                conditions.append(equal if operator == "$eq" else _negate(equal))
            elif operator in _RANGE_OPERATORS:
                kind = self.kind(operand, at)
                if kind == "json":
                    raise InvalidInputError(
                        f"{at}: {operator} compares numbers, dates and strings, not {_type_name(operand)}"
                    )
                if kind == "keyword" and looks_like_date(operand):
                    raise InvalidInputError(
                        f"{at}: {operand[:40]!r} looks like a date but is not ISO 8601, so it would be compared "
                        f"as a string; write dates as {_ISO_FORM}"
                    )
                if range_kind is not None and kind != range_kind:
                    raise InvalidInputError(
                        f"{at}: {operator} compares {_KIND_NAMES[kind]} where the other comparisons of "
                        f"{path} compare {_KIND_NAMES[range_kind]}"
                    )
                if range_kind is None:
                    range_at = len(conditions)
                range_kind = kind
                self.count(at)
                ranges.append((_RANGE_OPERATORS[operator], self.typed_value(operand, kind, at)))
            elif operator in ("$in", "$nin"):
                values = self.list_operand(operand, at, allow_empty=True)
                member = self.among(fields, values, at, listed=True)
                conditions.append(member if operator == "$in" else _negate(member))
            elif operator == "$exists":
                if not isinstance(operand, bool):
                    raise InvalidInputError(f"{at}: $exists takes true or false, not {_type_name(operand)}")
                self.count(at)
                test = sql.SQL("IS NOT NULL" if operand else "IS NULL")
                conditions.append(sql.SQL("({}) {}").format(self.json_value(fields), test))
            elif operator == "$contains":
                values = self.list_operand(operand, at, allow_empty=True) if isinstance(operand, list) else [operand]
                conditions.append(self.contains(fields, values, at))
            elif operator == "$all":
                conditions.append(self.contains(fields, self.list_operand(operand, at, allow_empty=False), at))
            elif operator == "$size":
                if isinstance(operand, bool) or not isinstance(operand, int) or operand < 0:
                    raise InvalidInputError(
                        f"{at}: $size takes a whole number of elements (0 or more), not {operand!r:.40}"
                    )
                self.count(at)
                array = _array_or_null(self.json_value(fields))
                conditions.append(sql.SQL("jsonb_array_length({}) = {}").format(array, self.param(operand)))
            elif operator == "$not":
                if not _is_operators(operand, at):
                    raise InvalidInputError(
                        f'{at}: $not takes an object of operators, as in {{"$not": {{"$gt": 5}}}}, '
                        f"not {_type_name(operand)}"
                    )
                conditions.append(_negate(self.operators(operand, fields, at, level + 1)))
            elif operator in _LOGICAL_OPERATORS:
                raise InvalidInputError(
                    f"{at}: {operator} combines filters, not a field's operators; "
                    f'write {{"{operator}": [{{"field": ...}}, ...]}}'
                )
            else:
                raise InvalidInputError(
                    f"{at}: unknown operator {operator}; a field takes {', '.join(_FIELD_OPERATORS)}"
                )
        if ranges:
            assert range_kind is not None and range_kind != "json"
            tests = [(sql.SQL(op), self.param(value)) for op, value in ranges]
            conditions.insert(range_at, self.typed_any(fields, range_kind, tests))
        return _all(conditions)

    def among(self, fields: tuple[str, ...], values: list[Any], path: _Path, *, listed: bool) -> sql.Composable:
        """The field equals one of ``values``, or is an array with an element that does: ``$eq``'s one
        operand (at ``path``), or the ``listed`` values of ``$in`` (at ``path[i]``)."""
        if not values:
            return FALSE

        def where(i: int) -> _Path:
            return path.item(i) if listed else path

        kinds = [self.kind(v, where(i)) for i, v in enumerate(values)]
        for i, kind in enumerate(kinds):
            if kind != kinds[0]:
                raise InvalidInputError(
                    f"{where(i)}: {_KIND_NAMES[kind]} among values of another type ({_KIND_NAMES[kinds[0]]} "
                    f"first); the values of {path} must share one type"
                )
        kind = kinds[0]
        if kind == "timestamp":
            self.count(path)
            typed = [self.typed_value(v, kind, where(i)) for i, v in enumerate(values)]
            test = (
                (sql.SQL("="), self.param(typed[0]))
                if len(typed) == 1
                else (sql.SQL("= ANY"), sql.SQL("({}::timestamptz[])").format(self.param(typed)))
            )
            return self.typed_any(fields, kind, [test])
        for i, v in enumerate(values):
            if kind == "number":
                self.typed_value(v, kind, where(i))  # a finite number
        # Numbers, strings, true, false and null: JSON containment (numbers compare as numbers,
        # strings exactly), which the collection's GIN index answers. Arrays and objects: JSON
        # equality of the field or of one of its elements.
        scalars = [v for v in values if not isinstance(v, list | dict)]
        structured = [v for v in values if isinstance(v, list | dict)]
        parts: list[sql.Composable] = []
        if scalars:
            parts.append(self.holds_scalar(fields, scalars, path))
        if structured:
            self.count(path)
            array = self.param([Jsonb(v) for v in structured])
            value = self.json_value(fields)
            parts.append(
                sql.SQL("(({value}) = ANY({array}::jsonb[]) OR {elements})").format(
                    value=value,
                    array=array,
                    elements=_some_element(value, sql.SQL("el.v = ANY({}::jsonb[])").format(array)),
                )
            )
        return _join(parts, "OR")

    def holds_scalar(self, fields: tuple[str, ...], values: list[Any], path: _Path) -> sql.Composable:
        """The field is one of the scalars ``values`` or an array holding one: ``metadata @> ANY`` of
        ``{"f": v}`` and ``{"f": [v]}`` for each (jsonb's containment lets an array contain a scalar
        only at the top level), which the collection's GIN index answers."""
        documents = []
        for value in values:
            for form in (value, [value]):
                documents.append(Jsonb(_under(fields, form)))
        self.count(path)
        return sql.SQL("metadata @> ANY({}::jsonb[])").format(self.param(documents))

    def typed_any(
        self, fields: tuple[str, ...], kind: Kind, tests: Sequence[tuple[sql.Composable, sql.Composable]]
    ) -> sql.Composable:
        """Typed comparisons ``(operator, operand)``: the field meets all of them, or it is an array and
        each is met by some element (MongoDB's rule). The first branch is written on exactly the typed
        index's expression; the second is guarded by ``jsonb_typeof(field) = 'array'``, exactly the
        predicate of the partial index ``memstore.catalog.metadata_indexes`` builds beside every typed one
        (it holds only the rows whose field is a list), so the two index scans serve the whole
        condition as a BitmapOr however few rows have the field."""
        assert kind != "json"
        scalar = self.typed(kind, fields)
        value = self.json_value(fields)
        whole = [sql.SQL("{} {} {}").format(scalar, op, operand) for op, operand in tests]
        each = [
            _some_element(value, sql.SQL("{} {} {}").format(typed_value(kind, sql.SQL("el.v")), op, operand))
            for op, operand in tests
        ]
        return sql.SQL("({} OR ({} AND {}))").format(
            sql.SQL(" AND ").join(whole), is_list(value), sql.SQL(" AND ").join(each)
        )

    def contains(self, fields: tuple[str, ...], values: list[Any], path: _Path) -> sql.Composable:
        self.count(path)
        return sql.SQL("metadata @> {}").format(self.param(Jsonb(_under(fields, list(values)))))

    def containment(self, plain: dict[str, Any], path: _Path) -> sql.Composable:
        self.count(path)
        return sql.SQL("metadata @> {}").format(self.param(Jsonb(plain)))

    # ------------------------------------------------------------------ operands and SQL pieces

    def kind(self, operand: Any, path: _Path) -> Kind:
        if isinstance(operand, bool) or operand is None or isinstance(operand, list | dict):
            return "json"
        if isinstance(operand, int | float):
            return "number"
        if isinstance(operand, str):
            try:
                date = parse_timestamp(operand)
            except OverflowError:
                raise InvalidInputError(f"{path}: {operand!r} is out of the years 1 to 9999 once in UTC") from None
            return "keyword" if date is None else "timestamp"
        raise InvalidInputError(f"{path}: {_type_name(operand)} is not a JSON value")

    def typed_value(self, operand: Any, kind: Kind, path: _Path) -> Any:
        if kind == "number":
            if isinstance(operand, float) and not math.isfinite(operand):
                raise InvalidInputError(f"{path}: {operand} is not a JSON number")
            # repr is the shortest text that reads back as the same float: what JSON carries. An
            # integer of any size is one (jsonb keeps it exactly), within Python's digits for text.
            try:
                return Decimal(repr(operand)) if isinstance(operand, float) else Decimal(operand)
            except ValueError:
                digits = sys.get_int_max_str_digits()
                raise InvalidInputError(f"{path}: an integer of more than {digits} digits") from None
        if kind == "timestamp":
            return parse_timestamp(operand)
        if len(operand) > MAX_KEYWORD_LENGTH:
            raise InvalidInputError(
                f"{path}: strings are compared up to {MAX_KEYWORD_LENGTH} characters, this one has {len(operand)}"
            )
        return operand

    def typed(self, kind: Kind, fields: tuple[str, ...]) -> sql.Composed:
        assert kind != "json"
        return typed_expression(kind, tuple(self.field_name(name) for name in fields))

    def json_value(self, fields: tuple[str, ...]) -> sql.Composable:
        return json_value(tuple(self.field_name(name) for name in fields))

    def field_name(self, name: str) -> sql.Composable:
        return self.param(name) if "%" in name else sql.Literal(name)

    def list_operand(self, value: Any, path: _Path, *, allow_empty: bool) -> list[Any]:
        if not isinstance(value, list):
            raise InvalidInputError(f"{path}: takes a JSON array, not {_type_name(value)}")
        if not value and not allow_empty:
            raise InvalidInputError(f"{path}: takes a non-empty array")
        if len(value) > MAX_LIST_VALUES:
            raise InvalidInputError(f"{path}: holds {len(value)} values; the limit is {MAX_LIST_VALUES}")
        return value

    def param(self, value: Any) -> sql.Placeholder:
        name = f"f_{len(self.params)}"
        self.params[name] = value
        return sql.Placeholder(name)

    def count(self, path: _Path) -> None:
        self.clauses += 1
        if self.clauses > MAX_FILTER_CLAUSES:
            raise InvalidInputError(f"{path}: the filter has more than {MAX_FILTER_CLAUSES} conditions")


# ---------------------------------------------------------------------- checks and SQL helpers


def _is_operators(value: Any, path: _Path) -> bool:
    """True for an operator object; refuses an object that mixes operators with field names."""
    if not isinstance(value, Mapping) or not value:
        return False
    marked = [key for key in value if isinstance(key, str) and key.startswith("$")]
    if marked and len(marked) != len(value):
        fields = [key for key in value if key not in marked]
        raise InvalidInputError(
            f"{path}: mixes operators ({', '.join(marked[:3])}) with fields ({', '.join(map(str, fields[:3]))}); "
            'write {"$and": [...]} or one object per field'
        )
    return bool(marked)


def _under(fields: tuple[str, ...], value: Any) -> dict[str, Any]:
    """``value`` as a document holding it at ``fields``: ``{"exif": {"iso": value}}``."""
    for name in reversed(fields):
        value = {name: value}
    return dict(value)


def _merged(a: Any, b: Any) -> Any:
    """One plain value that contains what ``a`` and ``b`` each contain, or None: objects merged key by
    key, arrays joined (an array contains the join when it holds every element of each)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = dict(a)
        for key, value in b.items():
            if key in out:
                value = _merged(out[key], value)
                if value is None:
                    return None
            out[key] = value
        return out
    if isinstance(a, list) and isinstance(b, list):
        return a + b
    return None


def _check_key(key: Any, path: _Path) -> None:
    if not isinstance(key, str):
        raise InvalidInputError(f"{path}: keys must be strings, not {_type_name(key)}")


def _check_level(level: int, path: _Path) -> None:
    if level > MAX_FILTER_DEPTH:
        raise InvalidInputError(f"{path}: the filter is nested deeper than {MAX_FILTER_DEPTH} levels")


def _check_plain_depth(value: Any, level: int, path: _Path) -> None:
    """Plain JSON nested no deeper than the limit, counted from where it sits."""
    pending = [(value, level)]
    while pending:
        item, at = pending.pop()
        if isinstance(item, Mapping | list):
            if at + 1 > MAX_FILTER_DEPTH:
                raise InvalidInputError(f"{path}: the filter is nested deeper than {MAX_FILTER_DEPTH} levels")
            children = item.values() if isinstance(item, Mapping) else item
            pending.extend((child, at + 1) for child in children)


def _check_encoding(value: Mapping[str, Any]) -> None:
    """Valid JSON that PostgreSQL's jsonb takes, within MAX_FILTER_BYTES (the structure is checked
    first, so the depth here is bounded)."""
    try:
        encoded = json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")  # the size stored
    except UnicodeEncodeError:
        raise InvalidInputError("filter: contains text that is not valid Unicode (a lone surrogate)") from None
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"filter: is not valid JSON: {exc}") from None
    if len(encoded) > MAX_FILTER_BYTES:
        raise InvalidInputError(f"filter: is {len(encoded)} bytes; the limit is {MAX_FILTER_BYTES}")
    if has_nul(value):
        raise InvalidInputError("filter: may not contain NUL characters (PostgreSQL's jsonb refuses them)")


def _array_or_null(value: sql.Composable) -> sql.Composable:
    """``value`` when it is a JSON array, else NULL: what the array functions may be given (they
    raise on anything else, and a CASE is evaluated in order)."""
    return sql.SQL("CASE WHEN jsonb_typeof({v}) = 'array' THEN {v} END").format(v=value)


def _some_element(value: sql.Composable, condition: sql.Composable) -> sql.Composable:
    """``value`` is an array and ``condition`` holds for one of its elements, ``el.v``."""
    return sql.SQL("EXISTS (SELECT FROM jsonb_array_elements({}) AS el(v) WHERE {})").format(
        _array_or_null(value), condition
    )


def _negate(condition: sql.Composable) -> sql.Composable:
    if condition is TRUE or condition is FALSE:
        return FALSE if condition is TRUE else TRUE
    # A typed comparison is NULL where it does not apply (missing field, another type); NOT NULL
    # would be NULL again, so a negation asks "not true" instead.
    return sql.SQL("({}) IS NOT TRUE").format(condition)


def _all(conditions: list[sql.Composable]) -> sql.Composable:
    return _join(conditions, "AND")


def _join(conditions: list[sql.Composable], word: str) -> sql.Composable:
    """The conditions joined by AND or OR, the constants folded: a filter that holds for every item
    however it is spelt (``{"$or": [{}, ...]}``, ``{"$not": {"$not": {}}}``) compiles to ``TRUE``,
    which is what a delete by filter refuses."""
    absorbing, neutral = (FALSE, TRUE) if word == "AND" else (TRUE, FALSE)
    if any(c is absorbing for c in conditions):
        return absorbing
    conditions = [c for c in conditions if c is not neutral]
    if not conditions:
        return neutral
    if len(conditions) == 1:
        return conditions[0]
    return sql.SQL("(") + sql.SQL(f" {word} ").join(conditions) + sql.SQL(")")


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return f"a {type(value).__name__}"
