"""NIC link state: /sys/class/net on a real host (event-driven through netlink RTNLGRP_LINK,
polling only where netlink is not available), or the emulated world's links."""

from __future__ import annotations

import select
import socket
import time
from pathlib import Path

SYSFS_NET = "/sys/class/net"
_RTMGRP_LINK = 1
_FALLBACK_POLL_S = 0.005


class SysfsLinks:
    def __init__(self, root: str = SYSFS_NET, clock_ns=time.monotonic_ns):
        self.root = Path(root)
        self.clock_ns = clock_ns

    def interfaces(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir()) if self.root.is_dir() else []

    def _read(self, interface: str, name: str) -> str | None:
        try:
            return (self.root / interface / name).read_text().strip()
        except FileNotFoundError:
            if not (self.root / interface).exists():
                raise KeyError(f"no interface {interface!r} under {self.root}") from None
            return None
        except OSError:  # carrier of an interface that is administratively down: EINVAL
            return None

    def state(self, interface: str) -> dict:
        carrier = self._read(interface, "carrier")
        out = {"interface": interface, "carrier": int(carrier) if carrier in ("0", "1") else None,
               "operstate": self._read(interface, "operstate"), "t_ns": self.clock_ns()}
        for counter in ("carrier_changes", "carrier_up_count", "carrier_down_count"):
            value = self._read(interface, counter)
            out[counter] = int(value) if value and value.isdigit() else None
        return out

    @staticmethod
    def is_up(state: dict) -> bool:
        return state["carrier"] == 1 and state["operstate"] in ("up", "unknown")

    def _netlink(self) -> socket.socket | None:
        if str(self.root) != SYSFS_NET or not hasattr(socket, "AF_NETLINK"):
            return None  # a test tree or another OS: nothing would announce its changes
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
            sock.bind((0, _RTMGRP_LINK))
            return sock
        except OSError:
            return None

    def wait(self, interface: str, up: bool, timeout_s: float) -> dict:
        """Until the link is up (or down). Returns the state, when it was seen, and how;
        ``already``: it was so at the first look, so ``t_ns`` is when it was looked at, not when
        it changed."""
        deadline = time.monotonic() + timeout_s
        sock = self._netlink()
        method = "netlink" if sock else "polling"
        woke = None  # when netlink last woke us: the instant a change read just after was announced
        first = True
        try:
            while True:
                state = self.state(interface)
                if self.is_up(state) == up:
                    return {**state, "t_ns": woke or state["t_ns"], "timed_out": False, "method": method,
                            "already": first}
                first = False
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return {**state, "timed_out": True, "method": method}
                if sock is not None:
                    ready, _, _ = select.select([sock], [], [], remaining)
                    woke = None
                    if ready:
                        woke = self.clock_ns()
                        sock.recv(65536)  # any link message: read sysfs again
                else:
                    time.sleep(min(_FALLBACK_POLL_S, remaining))  # fallback: nothing announces changes
        finally:
            if sock is not None:
                sock.close()
