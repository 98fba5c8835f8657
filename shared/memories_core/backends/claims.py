"""Who holds a job claim, and whether that process is gone.

A worker that claims a pending job records itself as the claim's owner:
``<host id>/<pid>/<start time>``, where the host id names the machine *and* the PID
namespace (hostname, the kernel's boot id, the inode of ``/proc/self/ns/pid``: two containers
with one hostname still differ) and the start time is the process's start in clock ticks
since boot (``/proc/<pid>/stat``, field 22), so a recycled PID is not mistaken for the owner.

Another process on the same host (same host id) may then tell that the owner died: its PID
is gone, or now belongs to a process started at another time. Such a claim is taken over at
once instead of after its lease (:meth:`~memories_core.engine.JobPolicy.lease`). Claims of
other hosts, and every claim where ``/proc`` is missing (not Linux), are left to the lease:
a process can only vouch for the death of its own host's processes.
"""

from __future__ import annotations

import functools
import os
import socket

__all__ = ["current_owner", "owner_is_dead"]


@functools.lru_cache(maxsize=1)
def _host_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        pid_ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return f"{socket.gethostname()}:{boot}:{pid_ns}"


def _start_time(pid: int) -> str | None:
    """``pid``'s start time in clock ticks since boot, ``None`` if no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def current_owner() -> str | None:
    """This process as a claim owner, or ``None`` where liveness cannot be checked."""
    host = _host_id()
    if host is None:
        return None
    pid = os.getpid()
    start = _start_time(pid)
    return None if start is None else f"{host}/{pid}/{start}"


def owner_is_dead(owner: str | None) -> bool:
    """Whether ``owner`` (from :func:`current_owner`) is a process of this host that ended.

    ``False`` when unsure: another host, an unreadable owner, no ``/proc``.
    """
    if not owner:
        return False
    parts = owner.rsplit("/", 2)
    if len(parts) != 3:
        return False
    host, pid_text, start = parts
    mine = _host_id()
    if mine is None or host != mine or not pid_text.isdigit():
        return False
    return _start_time(int(pid_text)) != start
