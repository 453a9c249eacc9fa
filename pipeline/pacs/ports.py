"""Which process holds a TCP port this machine listens on (Linux ``/proc``), for the errors of a server that cannot
listen: cheap (one read of ``/proc/net/tcp`` and ``tcp6``, then the open descriptors of the processes this user
may inspect), and None whenever it cannot be told (another user's process, no ``/proc``)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

_LISTEN = "0A"  # TCP state LISTEN in /proc/net/tcp


def _listening_inodes(port: int, proc: Path) -> set[str]:
    """Socket inodes listening on ``port`` (any local address), from ``/proc/net/tcp`` and ``tcp6``."""
    inodes: set[str] = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            local_port = fields[1].rsplit(":", 1)[-1]
            if int(local_port, 16) == port:
                inodes.add(fields[9])
    return inodes


def port_holder(port: int, *, proc: Path = Path("/proc")) -> str | None:
    """``"pid 1234 (Orthanc)"`` of the process listening on TCP ``port``, or None when it cannot be told."""
    inodes = _listening_inodes(port, proc)
    if not inodes:
        return None
    wanted = {f"socket:[{i}]" for i in inodes}
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        fd_dir = proc / pid / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # another user's process, or gone
            continue
        for fd in fds:
            try:
                if os.readlink(fd_dir / fd) in wanted:
                    comm = (proc / pid / "comm").read_text().strip()
                    return f"pid {pid} ({comm})"
            except OSError:
                continue
    return None
