"""A background process's CPU priority: the kernel's own way of putting searches first.

A ``memstore worker`` process answers no search: everything it does (decoding images, the model,
reading text) can wait while a search wants a core. The foreground controller spaces its work out
when searches slow down, but between two of its decisions a model pass already running still takes
a core the search's server process or its database backend wanted; on a small machine that is where
the tail of the searches' latency comes from. The scheduler can do better at no cost: a thread under
Linux's ``SCHED_IDLE`` policy runs only on a core nothing else wants, and a waking search preempts
it at once. ``low`` (``nice`` 10) is the portable, milder form: the worker still gets about a tenth of
a core that a search also wants, so it never stalls outright under a steady search load.

Linux keeps the policy and the nice value per thread, and a thread inherits both from the thread that
starts it, so ``apply`` sets them on every thread the process has when called (before the model's
threads exist, ideally) and every thread started afterwards follows. A platform or container that
refuses the change leaves the process as it was, and says so; nothing is raised for it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import get_args

from memstore.settings import CpuPriority

log = logging.getLogger(__name__)

LOW_NICE = 10
PRIORITIES: tuple[str, ...] = get_args(CpuPriority)


def _thread_ids() -> list[int]:
    """Every thread of this process (Linux), or just the process itself elsewhere."""
    try:
        return [int(entry.name) for entry in Path("/proc/self/task").iterdir()]
    except OSError:
        return [0]


def _set_idle(tid: int) -> None:
    os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))  # type: ignore[attr-defined,unused-ignore]


def _set_nice(tid: int, nice: int) -> None:
    os.setpriority(os.PRIO_PROCESS, tid, nice)  # on Linux, PRIO_PROCESS with a thread id sets that thread


def apply(priority: str) -> str:
    """Put this process's threads (and those it starts later) at ``priority`` (normal, low or idle);
    what was applied: ``SCHED_IDLE``, ``nice 10``, or ``normal`` (asked for, or the only thing allowed)."""
    if priority not in PRIORITIES:
        raise ValueError(f"unknown CPU priority {priority!r}: {', '.join(PRIORITIES[:-1])} or {PRIORITIES[-1]}")
    if priority == "normal":
        return "normal"
    idle = priority == "idle" and hasattr(os, "SCHED_IDLE")
    applied = "SCHED_IDLE" if idle else f"nice {LOW_NICE}"
    main = os.getpid()  # on Linux the main thread's id is the process's
    # The main thread first: if it is refused, no other thread has been changed either.
    for tid in sorted(_thread_ids(), key=lambda t: t not in (0, main)):
        try:
            if idle:
                _set_idle(tid)
            else:
                # Never raise a priority already lower (a worker started under `nice 19` stays there).
                _set_nice(tid, max(LOW_NICE, os.getpriority(os.PRIO_PROCESS, tid)))
        except OSError as exc:
            if tid in (0, main):  # refused (a container's policy): the process runs as it was
                log.warning("could not lower this process's CPU priority to %s (%s); it runs as it was", applied, exc)
                return "normal"
            # another thread that ended meanwhile: nothing to do
    return applied


def current() -> str:
    """The calling thread's priority as ``apply`` names it."""
    if hasattr(os, "sched_getscheduler") and os.sched_getscheduler(0) == getattr(os, "SCHED_IDLE", -1):
        return "SCHED_IDLE"
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    return "normal" if nice == 0 else f"nice {nice}"
