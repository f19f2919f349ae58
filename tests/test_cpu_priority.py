"""A background process's CPU priority (memstore.services.cpu_priority): every thread it has when
asked and every thread it starts later. Each case runs in a process of its own (a priority lowered
here would slow the rest of the suite)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, os, sys, threading
from memstore.services import cpu_priority

def policy(tid):
    idle = os.sched_getscheduler(tid) == os.SCHED_IDLE
    return "SCHED_IDLE" if idle else f"nice {os.getpriority(os.PRIO_PROCESS, tid)}"

started = threading.Event(); release = threading.Event()
def before():
    started.set(); release.wait()
early = threading.Thread(target=before); early.start(); started.wait()
if len(sys.argv) > 2:
    os.setpriority(os.PRIO_PROCESS, 0, int(sys.argv[2]))  # the process started lower already
applied = cpu_priority.apply(sys.argv[1])
seen = {}
late = threading.Thread(target=lambda: seen.update(late=policy(0))); late.start(); late.join()
seen.update(main=policy(0), early=policy(early.native_id), applied=applied, current=cpu_priority.current())
release.set(); early.join()
print(json.dumps(seen))
"""


def _probe(*args: str) -> dict[str, str]:
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result: dict[str, str] = json.loads(done.stdout)
    return result


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's; this platform has none")
def test_idle_puts_every_thread_and_every_later_one_under_sched_idle() -> None:
    seen = _probe("idle")
    assert seen == dict.fromkeys(("late", "main", "early", "applied", "current"), "SCHED_IDLE")


def test_low_is_nice_10_for_every_thread() -> None:
    seen = _probe("low")
    assert seen == dict.fromkeys(("late", "main", "early", "applied", "current"), "nice 10")


def test_low_never_raises_a_priority_already_lower() -> None:
    seen = _probe("low", "15")
    assert seen["main"] == seen["late"] == "nice 15"
    assert seen["early"] == "nice 10"  # started before the process went to 15: lowered to 10, not raised


def test_normal_leaves_the_process_as_it_is() -> None:
    seen = _probe("normal")
    assert seen == {"late": "nice 0", "main": "nice 0", "early": "nice 0", "applied": "normal", "current": "normal"}


def test_an_unknown_priority_is_refused() -> None:
    from memstore.services import cpu_priority

    with pytest.raises(ValueError, match="normal, low or idle"):
        cpu_priority.apply("realtime")
