"""A run holds a lock on its bench, so two runs never drive the same instruments at once."""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
import time
from pathlib import Path

from lumion_hil.harness.errors import BenchInUseError


def lock_dir() -> Path:
    return Path(os.environ.get("LUMION_HIL_LOCK_DIR", Path(tempfile.gettempdir()) / "lumion-hil-locks"))


class BenchLock:
    def __init__(self, bench_name: str):
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", bench_name)
        self.path = lock_dir() / f"{safe}.lock"
        self.bench_name = bench_name
        self._fd: int | None = None

    def acquire(self) -> "BenchLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise BenchInUseError(f"bench {self.bench_name!r} is in use by {holder} (lock {self.path})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "BenchLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
