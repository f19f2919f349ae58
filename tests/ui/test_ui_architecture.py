"""The web pages keep the API's rules: no SQL of their own, no maintenance import, every template
and static file installed with the package, and no third-party script."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UI = ROOT / "memstore" / "ui"


def test_the_pages_run_no_sql_and_never_import_maintenance() -> None:
    words = ("raw_connection", "SELECT ", "DELETE FROM", "INSERT INTO", "UPDATE ", "sql.SQL(", "import maintenance")
    offenders = {str(p.relative_to(ROOT)): [w for w in words if w in p.read_text()] for p in UI.rglob("*.py")}
    offenders |= {
        str(p.relative_to(ROOT)): ["from maintenance"] for p in UI.rglob("*.py") if "from maintenance" in p.read_text()
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_new_core_modules_load_no_web_framework() -> None:
    code = (
        "import json, sys\n"
        "import memstore.media.thumbnails, memstore.access.ui_sessions, memstore.action_log\n"
        "heavy = {'fastapi', 'starlette', 'torch', 'jinja2'}\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & heavy)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_every_template_and_static_file_is_installed() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    missing = []
    for folder in ("templates", "static"):
        package = f"memstore.ui.{folder}"
        assert package in setuptools["packages"]  # a data package: listed, so nothing is left behind
        files = [p for p in (UI / folder).glob("*") if p.is_file()]
        assert files
        patterns = setuptools["package-data"][package]
        missing += [str(f) for f in files if not any(f.match(pattern) for pattern in patterns)]
    assert missing == []


def test_pages_load_scripts_and_styles_from_this_server_only() -> None:
    for template in (UI / "templates").glob("*.html"):
        text = template.read_text()
        assert not re.search(r"<script(?![^>]*\bsrc=\"\{\{ ui \}\}/static/)", text), template.name
        assert not re.search(r"\son[a-z]+=", text), template.name  # no inline event handlers
        assert "style=" not in text, template.name  # the CSP allows no inline style
        assert "http://" not in text and "https://" not in text, template.name
