"""A search corpus made on the spot from Python's standard library: every documented public function,
class and method of a fixed list of modules, named by its dotted identifier (``shutil.copytree``,
``collections.OrderedDict.move_to_end``) and described by the first paragraph of its docstring.

It is what keyword search is for: each item has a unique identifier that a person remembers exactly
and that a sentence embedding blurs, and a description in plain language that keywords match poorly.
The corpus depends only on the Python that runs the benchmark, so every run on one interpreter builds
the same one, and no data ships with the repository.
"""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass

MODULES = tuple(
    [
        "abc",
        "argparse",
        "array",
        "ast",
        "asyncio",
        "base64",
        "binascii",
        "bisect",
        "bz2",
        "calendar",
        "cmath",
        "codecs",
        "collections",
        "colorsys",
        "concurrent.futures",
        "configparser",
        "contextlib",
        "copy",
        "csv",
        "dataclasses",
        "datetime",
        "decimal",
        "difflib",
        "email.utils",
        "enum",
        "errno",
        "filecmp",
        "fnmatch",
        "fractions",
        "functools",
        "gc",
        "getpass",
        "gettext",
        "glob",
        "graphlib",
        "gzip",
        "hashlib",
        "heapq",
        "hmac",
        "html",
        "http.client",
        "inspect",
        "io",
        "ipaddress",
        "itertools",
        "json",
        "locale",
        "logging",
        "lzma",
        "math",
        "mimetypes",
        "mmap",
        "netrc",
        "operator",
        "os",
        "os.path",
        "pathlib",
        "pickle",
        "platform",
        "pprint",
        "queue",
        "random",
        "re",
        "reprlib",
        "sched",
        "secrets",
        "select",
        "selectors",
        "shelve",
        "shlex",
        "shutil",
        "signal",
        "socket",
        "sqlite3",
        "ssl",
        "stat",
        "statistics",
        "string",
        "struct",
        "subprocess",
        "sys",
        "tarfile",
        "tempfile",
        "textwrap",
        "threading",
        "time",
        "timeit",
        "tokenize",
        "traceback",
        "types",
        "typing",
        "unicodedata",
        "urllib.parse",
        "urllib.request",
        "uuid",
        "warnings",
        "weakref",
        "xml.etree.ElementTree",
        "zipfile",
        "zlib",
    ]
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s")


@dataclass(frozen=True)
class Entry:
    identifier: str  # module.name or module.Class.method
    description: str  # the docstring's first paragraph, on one line

    @property
    def text(self) -> str:
        return f"{self.identifier}: {self.description}"

    def natural_query(self) -> str:
        """The description's first sentence without the identifier's own words: what a person who
        forgot the name would type."""
        first = _SENTENCE_END.split(self.description, maxsplit=1)[0]
        names = {part.lower() for part in re.split(r"[._]", self.identifier) if part}
        words = [w for w in first.split() if w.strip("().,:;'`\"").lower() not in names]
        return " ".join(words)


def build(max_description: int = 300) -> list[Entry]:
    """Every documented public callable of MODULES (and the methods of their classes), one entry per
    identifier and per description (the second of two items with the same description is left out:
    a query for it could not tell them apart)."""
    entries: list[Entry] = []
    seen_descriptions: set[str] = set()
    seen_objects: set[int] = set()
    for module_name in MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name, obj in sorted(vars(module).items()):
            if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.isclass(obj)):
                continue
            home = getattr(obj, "__module__", None) or module_name
            if home.lstrip("_").split(".")[0] != module_name.split(".")[0]:
                continue  # re-exported from elsewhere
            members = [(f"{module_name}.{name}", obj)]
            if inspect.isclass(obj):
                members += [
                    (f"{module_name}.{name}.{attr}", member)
                    for attr, member in sorted(vars(obj).items())
                    if not attr.startswith("_") and callable(member)
                ]
            for identifier, member in members:
                if id(member) in seen_objects:
                    continue
                seen_objects.add(id(member))
                description = _description(member, max_description)
                if description is None or description in seen_descriptions:
                    continue
                seen_descriptions.add(description)
                entries.append(Entry(identifier, description))
    return entries


def _description(obj: object, limit: int) -> str | None:
    doc = inspect.getdoc(obj)
    if not doc:
        return None
    paragraph = doc.strip().split("\n\n")[0]
    # A builtin's docstring may open with its signature; the description follows it.
    lines = [line for line in paragraph.splitlines() if not re.match(r"^\w[\w.]*\(.*\)( -> .*)?$", line.strip())]
    text = " ".join(" ".join(lines).split())
    if len(text.split()) < 5:
        return None
    return text[:limit]
