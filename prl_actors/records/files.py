"""Private files written whole or not at all: the run's keys, the /dev/shm weight snapshots.

A reader that lists or opens the file meanwhile must never see it half written (a server would
refuse a half-written key for good; a worker would map a torn snapshot), so the bytes go to a
temporary name in the same directory (created exclusively, never through a symlink) and are
renamed into place.
"""

from __future__ import annotations

import os
from pathlib import Path

WRITE_BLOCK = 64 << 20  # one os.write at most this large


def write_private(path: Path, *parts: bytes | memoryview) -> None:
    """Write `parts` one after the other to `path`, mode 0600, through a temporary name and an
    atomic rename (an existing `path` is replaced)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask left
        for data in parts:
            view = memoryview(data)
            view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
            for lo in range(0, view.nbytes, WRITE_BLOCK):
                chunk = view[lo : lo + WRITE_BLOCK]
                while chunk.nbytes:
                    chunk = chunk[os.write(fd, chunk) :]
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)
