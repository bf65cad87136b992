"""Whether another process holds a file's ``flock``: the one probe that the spool reader (a
writer still locking its file) and a run's staging sweep (a run still alive) share. No Beam."""
from __future__ import annotations

import errno
import fcntl


def flocked(fd: int) -> bool:
    """Whether another open file holds an exclusive ``flock`` on the file of ``fd`` (a writer
    that locks its file while writing); a shared lock taken to tell is dropped at once. A file
    system without locks answers False."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES)
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False
