"""File locks (``flock``) with a clear error where the file system gives none.

The run folder, the PACS ledger and the case cache lock files so that two processes never write one folder at once.
A network mount without a lock service (NFS whose ``rpc.statd``/``lockd`` is not running or not reachable, some CIFS
and FUSE mounts) answers ``flock`` with ``ENOLCK`` ("No locks available") or ``EOPNOTSUPP``; :func:`flock` turns that
into the caller's :class:`~pipeline.errors.CtpipeError` naming the folder and what to do, instead of a bare
"No locks available".
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from .errors import CtpipeError

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

#: Error numbers of a file system that gives no file locks.
NO_LOCK_ERRNOS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})


def flock(fd: int, operation: int, *, where: str | Path, error: type[CtpipeError], what: str) -> None:
    """``fcntl.flock(fd, operation)``; where ``where``'s file system gives no locks, ``error`` naming ``where``, the
    system's words for it and the fix. ``what`` says what the lock is for ("two runs never share one run folder").
    :class:`BlockingIOError` (another process holds the lock) and other :class:`OSError` pass through unchanged."""
    try:
        fcntl.flock(fd, operation)
    except BlockingIOError:
        raise
    except OSError as exc:
        if exc.errno not in NO_LOCK_ERRNOS:
            raise
        name = errno.errorcode.get(exc.errno, str(exc.errno))
        raise error(
            f"the file system of this folder gives no file locks ({os.strerror(exc.errno)}, {name}), and ctpipe locks "
            f"a file there so that {what}",
            where=where,
            fix=(
                "use a folder on a local disk, or enable locking on that mount (NFS: the lock service, rpc.statd and "
                "lockd, running on the client and the server; or mount it with the 'nolock' option when only this "
                "machine writes there)"
            ),
        ) from exc
