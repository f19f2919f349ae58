"""What the three commands (``memstore``, ``memstore-maint``, ``encoder``) promise alike: every help
page reads and exits 0, a usage error exits 2 with its message on stderr, ``--json`` prints exactly
one JSON document, and the exit codes of encoder.cli_support's mapping."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from encoder.__main__ import cli as encoder_cli
from encoder.__main__ import main as encoder_main
from encoder.cli_support import EXIT_INTERRUPTED, run
from maintenance.cli import cli as maint_cli
from maintenance.cli import main as maint_main
from memstore.cli import cli as memstore_cli
from memstore.cli import main as memstore_main
from memstore.settings import get_settings

Main = Callable[[Sequence[str] | None], int]
PROGRAMS: dict[str, tuple[click.Command, Main]] = {
    "memstore": (memstore_cli, memstore_main),
    "memstore-maint": (maint_cli, maint_main),
    "encoder": (encoder_cli, encoder_main),
}


def _command_paths(
    command: click.Command, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            yield from _command_paths(sub, (*path, name))


EVERY_COMMAND = [
    pytest.param(prog, path, command, id=" ".join((prog, *path)))
    for prog, (root, _) in PROGRAMS.items()
    for path, command in _command_paths(root)
]


@pytest.mark.parametrize(("prog", "path", "command"), EVERY_COMMAND)
def test_every_help_page_exits_0_and_explains_every_option(
    prog: str, path: tuple[str, ...], command: click.Command, capsys: pytest.CaptureFixture[str]
) -> None:
    _, main = PROGRAMS[prog]
    for flag in ("--help", "-h"):
        assert main([*path, flag]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"Usage: {' '.join((prog, *path))} "), out
    assert command.help, f"{prog} {' '.join(path)} has no description"
    unexplained = [p.name for p in command.params if isinstance(p, click.Option) and not p.hidden and not p.help]
    assert unexplained == [], f"options without help in {prog} {' '.join(path)}"


@pytest.mark.parametrize("prog", PROGRAMS)
def test_a_group_lists_its_commands_in_one_short_line_each(prog: str) -> None:
    for path, command in _command_paths(PROGRAMS[prog][0]):
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                line = sub.get_short_help_str(limit=200)
                assert line and len(line) <= 70, f"{prog} {' '.join((*path, name))}: {line!r}"


# Long-running servers print where they listen, not a result: the only commands without --json.
SERVERS = {("memstore", "serve"), ("encoder",)}


def test_every_command_that_prints_a_result_takes_json() -> None:
    leaves = {
        (prog, *path): command
        for prog, (root, _) in PROGRAMS.items()
        for path, command in _command_paths(root)
        if not isinstance(command, click.Group)
    }
    assert set(leaves) >= SERVERS  # the exceptions still name real commands
    without = [
        leaf
        for leaf, command in leaves.items()
        if leaf not in SERVERS and not any(p.name == "as_json" and "--json" in p.opts for p in command.params)
    ]
    assert without == []


@pytest.mark.parametrize(
    ("prog", "argv"),
    [
        ("memstore", ["--no-such-option"]),
        ("memstore", ["db", "upgrade", "--no-such-option"]),
        ("memstore-maint", ["status", "--no-such-option"]),
        ("encoder", ["--no-such-option"]),
    ],
)
def test_an_unknown_option_exits_2_with_the_message_on_stderr(
    prog: str, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert PROGRAMS[prog][1](argv) == 2
    captured = capsys.readouterr()
    assert "No such option" in captured.err and "--no-such-option" in captured.err
    assert f"Try '{' '.join((prog, *argv[:-1]))} --help' for help." in captured.err
    assert captured.out == ""


@pytest.mark.parametrize(
    ("prog", "argv", "said"),
    [
        ("memstore", [], "Commands:"),  # no command: the list of commands, as an error
        ("memstore", ["no-such-command"], "No such command"),
        ("memstore", ["keys", "create", "someone"], "Missing option '--scope'"),
        ("memstore", ["serve", "--port", "eighty"], "'eighty' is not a valid integer"),
        ("memstore-maint", ["report"], "Missing option '--plot'"),
        ("memstore-maint", ["history", "--limit", "many"], "'many' is not a valid integer"),
        ("encoder", ["--port", "x"], "'x' is not a valid integer"),
    ],
)
def test_usage_errors_exit_2(prog: str, argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert PROGRAMS[prog][1](argv) == 2
    captured = capsys.readouterr()
    assert said in captured.err and captured.out == ""


def test_compact_is_hidden_from_the_help_but_still_answers(capsys: pytest.CaptureFixture[str]) -> None:
    assert maint_main(["--help"]) == 0
    listing = capsys.readouterr().out
    assert "rebuild" in listing and "compact" not in listing
    assert maint_main(["compact", "--help"]) == 0
    page = capsys.readouterr().out
    assert "The old name of rebuild" in page and "--partition" in page


def test_serve_help_shows_the_defaults_the_settings_give(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The defaults are read when the command runs (not at import), so the environment of that moment counts."""
    monkeypatch.setenv("MEMSTORE_PORT", "8765")
    get_settings.cache_clear()
    try:
        assert memstore_main(["serve", "--help"]) == 0
        assert "[default: 8765]" in " ".join(capsys.readouterr().out.split())
    finally:
        get_settings.cache_clear()


ROOT = Path(__file__).resolve().parents[1]


def _deployed_command_lines() -> list[list[str]]:
    """The command lines compose.yaml's services and the Dockerfile's CMD run with our programs."""
    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    lines = [s["command"] for s in services.values() if s.get("command") and s["command"][0] in PROGRAMS]
    cmd = next(line for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("CMD "))
    return [*lines, json.loads(cmd.removeprefix("CMD "))]


def test_the_deployed_command_lines_are_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    """Every option the deployment files pass exists (--help, added last, stops before anything runs)."""
    lines = _deployed_command_lines()
    assert {line[0] for line in lines} == set(PROGRAMS)
    for prog, *args in lines:
        assert PROGRAMS[prog][1]([*args, "--help"]) == 0, (prog, args, capsys.readouterr().err)


@pytest.fixture
def database_env(monkeypatch: pytest.MonkeyPatch, database_url: str) -> Iterator[str]:
    monkeypatch.setenv("MEMSTORE_DATABASE_URL", database_url)
    get_settings.cache_clear()
    yield database_url
    get_settings.cache_clear()


def _one_json_document(capsys: pytest.CaptureFixture[str]) -> Any:
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 1, f"expected one JSON line on stdout, got: {out!r}"
    return json.loads(out)


def test_memstore_json_outputs_are_one_document_each(database_env: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert memstore_main(["db", "current", "--json"]) == 0
    revision = _one_json_document(capsys)["revision"]
    assert revision
    assert memstore_main(["db", "upgrade", "--json"]) == 0
    assert _one_json_document(capsys) == {"before": revision, "after": revision}
    assert memstore_main(["db", "url", "--json"]) == 0
    assert _one_json_document(capsys)["url"].startswith("postgresql://")
    name = f"conventions-{uuid.uuid4().hex[:8]}"
    assert memstore_main(["keys", "create", name, "--scope", "read", "--json"]) == 0
    created = _one_json_document(capsys)
    assert created["name"] == name and created["key"].startswith("msk_")
    assert memstore_main(["keys", "list", "--json"]) == 0
    assert name in [k["name"] for k in _one_json_document(capsys)]
    assert memstore_main(["keys", "revoke", name, "--json"]) == 0
    assert _one_json_document(capsys)["revoked_at"]


def test_maintenance_json_outputs_are_one_document_each(database_env: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert maint_main(["status", "--json"]) == 0
    assert isinstance(_one_json_document(capsys), list)
    assert maint_main(["history", "--json", "--limit", "3"]) == 0
    rows = _one_json_document(capsys)
    assert isinstance(rows, list) and len(rows) <= 3


def _program(body: Callable[[], int | None]) -> click.Command:
    return click.Command("prog", callback=body)


def test_run_returns_what_the_command_returns_and_0_for_none() -> None:
    assert run(_program(lambda: 3), [], prog="prog") == 3
    assert run(_program(lambda: None), [], prog="prog") == 0


def test_run_maps_an_interrupt_to_130(capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted() -> int:
        raise KeyboardInterrupt

    assert run(_program(interrupted), [], prog="prog") == EXIT_INTERRUPTED


def test_run_lets_errors_the_program_does_not_map_through() -> None:
    def broken() -> int:
        raise RuntimeError("a bug")

    assert (
        run(_program(broken), [], prog="prog", on_error=lambda exc: 7 if isinstance(exc, RuntimeError) else None) == 7
    )
    with pytest.raises(RuntimeError, match="a bug"):
        run(_program(broken), [], prog="prog", on_error=lambda exc: None)
    with pytest.raises(RuntimeError, match="a bug"):
        run(_program(broken), [], prog="prog")


def test_a_command_raising_system_exit_keeps_its_message() -> None:
    """``memstore ingest`` stops with SystemExit("memstore ingest: ...") and tests rely on seeing it."""

    def stops() -> int:
        raise SystemExit("prog: the reason")

    with pytest.raises(SystemExit, match="the reason"):
        run(_program(stops), [], prog="prog")
