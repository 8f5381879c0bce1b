"""A run holds a lock on what its bench drives (each instrument's and each host's address), so
two runs never drive the same instruments at once: not two runs of one bench file, not two bench
files that name one switch. A bench that owns some ports of a shared switch
(``safety.owned_ports``) locks those ports, and the switch only against a bench that takes all of
it. Two benches served from one bench file on one machine are at different addresses, and run
side by side. Locks are files on the machine that runs; across machines, labgrid places."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Iterable

from lumion_hil.harness.errors import BenchInUseError


def lock_dir() -> Path:
    return Path(os.environ.get("LUMION_HIL_LOCK_DIR", Path(tempfile.gettempdir()) / "lumion-hil-locks"))


def _key(address: str) -> str:
    """One instrument, however its address is spelled: VISA resource names are case-insensitive
    and board 0 may be left out (TCPIP0::h::5025::SOCKET is TCPIP::h::5025::SOCKET)."""
    return re.sub(r"^(tcpip|gpib|usb|asrl|visa)0::", r"\1::", address.strip().casefold())


class BenchLock:
    """The locks of one run: one for each address in ``parts`` (what is driven -> its address),
    by default the bench's name alone; those in ``shared`` are held shared (several runs may hold
    one, none while another run holds it whole)."""

    def __init__(self, bench_name: str, parts: dict[str, str] | None = None, shared: Iterable[str] = ()):
        self.bench_name = bench_name
        self.parts = parts or {f"bench {bench_name!r}": bench_name}
        shared = set(shared)
        by_key: dict[str, tuple[str, bool]] = {}
        for what, address in self.parts.items():
            by_key.setdefault(_key(address), (what, what in shared))
        self._wanted = sorted(by_key.items())
        self._fds: list[tuple[int, bool]] = []  # (file, held shared)

    @classmethod
    def for_bench(cls, bench) -> "BenchLock":
        """Every instrument and host of ``bench`` at an address of its own (not emulated in this
        process); the bench's name where it has none. A switch the bench owns only some ports of
        is held shared, and each of its ports exclusively."""
        parts = {f"instrument {name} at {spec.resource}": spec.resource
                 for name, spec in bench.instruments.items() if not spec.emulated}
        shared: set[str] = set()
        switch = bench.instruments.get(bench.topology.switch)
        if switch is not None and not switch.emulated and bench.safety.owned_ports is not None:
            whole = f"instrument {bench.topology.switch} at {switch.resource}"
            shared.add(whole)
            parts |= {f"port {p} of {whole.removeprefix('instrument ')}": f"{switch.resource} port {p}"
                      for p in bench.safety.owned_ports}
        parts |= {f"host {h.name} at {h.address}": f"host:{h.address}" for h in bench.topology.hosts if not h.emulated}
        return cls(bench.name, parts or None, shared)

    @staticmethod
    def path_for(key: str) -> Path:
        safe = re.sub(r"[^a-z0-9_.-]", "_", key)[:80]
        return lock_dir() / f"{safe}-{hashlib.sha1(key.encode()).hexdigest()[:8]}.lock"

    def acquire(self) -> "BenchLock":
        lock_dir().mkdir(parents=True, exist_ok=True)
        holder_line = f"pid {os.getpid()}, bench {self.bench_name!r}, since {time.strftime('%Y-%m-%d %H:%M:%S')}"
        for key, (what, shared) in self._wanted:
            path = self.path_for(key)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or \
                    "runs of benches that own some of its ports"  # held shared: no holder named
                os.close(fd)
                self.release()
                busy = what if what.startswith("bench ") else f"bench {self.bench_name!r}: {what}"
                raise BenchInUseError(f"{busy} is in use by {holder} (lock {path})") from None
            if not shared:  # the file of a lock held shared names no holder
                os.ftruncate(fd, 0)
                os.pwrite(fd, holder_line.encode(), 0)
            self._fds.append((fd, shared))
        return self

    def release(self) -> None:
        while self._fds:
            fd, shared = self._fds.pop()
            if not shared:
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> "BenchLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
