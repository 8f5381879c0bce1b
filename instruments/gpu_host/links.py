"""NIC link state: /sys/class/net on a real host (event-driven through netlink RTNLGRP_LINK,
polling only where netlink is not available), or the emulated world's links."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import time
from pathlib import Path

SYSFS_NET = "/sys/class/net"
_RTMGRP_LINK = 1
_FALLBACK_POLL_S = 0.005


class SysfsLinks:
    def __init__(self, root: str = SYSFS_NET, clock_ns=time.monotonic_ns):
        self.root = Path(root)
        self.clock_ns = clock_ns
        self.dark: set[str] = set()  # interfaces whose transmitter this agent turned off

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
        speed = self._read(interface, "speed")  # Mb/s; -1 or unreadable while the link is down
        out["speed_mbps"] = int(speed) if speed and speed.isdigit() else None
        return out

    def states(self) -> list[dict]:
        """Every interface's state: what the agent's ``links`` answers."""
        return [self.state(i) for i in self.interfaces()]

    # -- the transmitter (the fibre walk of lumion-hil bench wiring) --------------------------------

    def set_transmitter(self, interface: str, on: bool) -> dict:
        """Turn the interface's transmitter off (or on again): the interface is taken
        administratively down (``ip link set dev IF down``; CAP_NET_ADMIN), which stops the
        laser on NICs that drop the physical link on close (mlx5; Intel ice, i40e and E610 with
        ``ethtool --set-priv-flags IF link-down-on-close on``). On a NIC that keeps its laser
        lit, the walk sees no light go out and says so. Never the interface this agent's own
        session (or the default route) runs over, nor the loopback."""
        if not (self.root / interface).exists():
            raise KeyError(f"no interface {interface!r} under {self.root}")
        if on is False:
            refused = self._refusal(interface)
            if refused:
                raise ValueError(f"{interface}: not turning its transmitter off: {refused}")
        proc = subprocess.run(["ip", "link", "set", "dev", interface, "up" if on else "down"],
                              capture_output=True, text=True, timeout=10)
        if proc.returncode != 0:
            raise OSError(f"ip link set dev {interface} {'up' if on else 'down'}: {proc.stderr.strip() or proc.returncode}")
        (self.dark.discard if on else self.dark.add)(interface)
        return {"interface": interface, "on": bool(on), "t_ns": self.clock_ns()}

    def _refusal(self, interface: str) -> str | None:
        if interface == "lo":
            return "it is the loopback"
        ssh = os.environ.get("SSH_CONNECTION", "").split()
        routes = subprocess.run(["ip", "-o", "route", "show", "default"], capture_output=True, text=True).stdout
        if f" dev {interface} " in f" {routes} ":
            return "the default route runs over it"
        if len(ssh) == 4:
            addrs = subprocess.run(["ip", "-o", "addr", "show", "dev", interface], capture_output=True, text=True).stdout
            if any(word.split("/")[0] == ssh[2] for word in addrs.split()):
                return f"this agent's ssh session arrives on it ({ssh[2]})"
        return None

    def restore_transmitters(self) -> None:
        """Every transmitter this agent turned off, on again (its session ended mid-walk)."""
        for interface in sorted(self.dark):
            try:
                self.set_transmitter(interface, True)
            except (OSError, KeyError, ValueError, subprocess.SubprocessError):
                pass

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
