"""What the three command-line programs share (``memstore``, ``memstore-maint``, ``encoder``).

- :func:`run`: the ``main(argv) -> int`` behind each program. Click runs without its standalone
  mode so that tests and scripts get the exit code back; this module turns click's exceptions into
  the exit codes the programs have always had (usage errors 2, an interrupt 130), and each program
  maps its own errors to a short line on stderr through ``on_error``.
- :func:`json_option`, :func:`emit` and :func:`print_json`: ``--json`` prints exactly one JSON document on stdout.
- :class:`SettingDefault`: an option whose default comes from the settings when the command runs.
- :func:`exit_cleanly_on_sigterm` and :func:`stop_on_signals`: how the long-running commands stop.

Kept light (click and the standard library): ``encoder --help`` must not pay for the database layer.
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import click

EXIT_OK = 0
EXIT_USAGE = 2  # a usage error, or a request the command refuses (scripts around these commands test for it)
EXIT_INTERRUPTED = 130  # the shell's code for Ctrl-C

# -h as well as --help (both have always worked); defaults shown in every help text.
CONTEXT_SETTINGS: dict[str, Any] = {
    "help_option_names": ["-h", "--help"],
    "show_default": True,
    "max_content_width": 100,
}

F = TypeVar("F", bound=Callable[..., Any])


def run(
    command: click.Command,
    argv: Sequence[str] | None,
    *,
    prog: str,
    on_error: Callable[[Exception], int | None] | None = None,
) -> int:
    """Run ``command`` on ``argv`` (``sys.argv[1:]`` when None) and return its exit code.

    ``on_error`` gets any other exception a command raised: it prints what the user should read and
    returns the exit code, or returns None to let the exception through (a bug keeps its traceback).
    ``SystemExit`` raised by a command passes through untouched.
    """
    try:
        result = command.main(args=argv, prog_name=prog, standalone_mode=False)
    except click.ClickException as exc:  # usage errors (exit 2) and the like: usage line, hint, message
        exc.show()
        return exc.exit_code
    except click.Abort:  # click's wrapping of KeyboardInterrupt
        return EXIT_INTERRUPTED
    except Exception as exc:
        code = on_error(exc) if on_error is not None else None
        if code is None:
            raise
        return code
    # --help and click's own exits come back as their code; a command returns its code (None: success).
    return EXIT_OK if result is None else int(result)


def json_option(help: str = "print the result as JSON") -> Callable[[F], F]:
    """``--json``, passed to the command as ``as_json``."""
    return click.option("--json", "as_json", is_flag=True, help=help)


def emit(as_json: bool, payload: Any, text: Callable[[], str]) -> None:
    """Print a command's result on stdout: ``payload`` as one JSON document, or ``text()`` for people."""
    if as_json:
        print_json(payload)
    else:
        click.echo(text())


def json_object_option(example: str) -> Callable[[click.Context, click.Parameter, str | None], dict[str, Any] | None]:
    """A click callback reading an option's value as a JSON object (``example`` in the refusal)."""

    def parse(_ctx: click.Context, _param: click.Parameter, value: str | None) -> dict[str, Any] | None:
        if value is None:
            return None
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON ({exc})") from None
        if not isinstance(parsed, dict):
            raise click.BadParameter(f"a JSON object, e.g. {example}")
        return parsed

    return parse


def print_json(payload: Any) -> None:
    """One JSON document on one line of stdout (times and the like as strings)."""
    click.echo(json.dumps(payload, default=str))


class SettingDefault(click.Option):
    """An option whose ``default`` is a function of the settings, called when the command runs (so
    the environment and ``.env`` of that moment count, not those at import) and in ``--help``, which
    shows the value it would use."""

    def get_help_extra(self, ctx: click.Context) -> Any:
        extra = super().get_help_extra(ctx)
        if callable(self.default):
            extra["default"] = str(self.default())
        return extra


def exit_cleanly_on_sigterm() -> None:
    """Turn SIGTERM into ``SystemExit(0)``: atexit handlers run (the last process sharing the
    embedded PostgreSQL stops it) and a requested stop reads as a success.

    uvicorn re-raises the signals it caught once it has shut down; with this handler in place that
    becomes a normal interpreter exit instead of death by signal.
    """

    def _exit(_signum: int, _frame: object) -> None:
        raise SystemExit(0)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit)


@contextmanager
def stop_on_signals(stop: threading.Event, on_signal: Callable[[int], None] | None = None) -> Iterator[None]:
    """While inside, SIGTERM and SIGINT set ``stop`` (the work in hand finishes, then the command
    ends) instead of killing the process; the previous handlers come back on the way out. Signals
    reach the main thread only: elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        if on_signal is not None:
            on_signal(signum)
        stop.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
