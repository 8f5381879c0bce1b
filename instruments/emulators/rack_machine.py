"""What the rack in a box asks of this machine: whether it can build one at all
(:func:`available`), network namespaces made, entered (one thread at a time: setns is per
thread) and removed, the processes inside them found and killed, and links in the root
namespace. Every call here takes names; the rack (rack.py) chooses them.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from lumion_hil.instruments.emulators.rack_netlink import IPRoute, NetlinkError, pyroute2_netns, tbf_args
from lumion_hil.instruments.emulators.rack_spec import NETNS_DIR, RackError

_CLONE_NEWNET = 0x40000000


_available: tuple[bool, str] | None = None


def available() -> tuple[bool, str]:
    """Whether this machine can build a rack, and why not: Linux, root (CAP_NET_ADMIN and
    CAP_SYS_ADMIN), pyroute2, and a probe namespace with a veth, a bridge and a tbf in it.
    The probe runs once per process."""
    global _available
    if _available is None:
        _available = _probe()
    return _available


def _probe() -> tuple[bool, str]:
    if not sys.platform.startswith("linux"):
        return False, f"not Linux ({sys.platform}): network namespaces are Linux's"
    if IPRoute is None:
        return False, "pyroute2 is not installed (pip install pyroute2)"
    try:
        found = re.search(r"CapEff:\s*([0-9a-f]+)", Path("/proc/self/status").read_text())
        caps = int(found.group(1), 16) if found else 0
    except OSError:
        caps = 0
    missing = [name for bit, name in ((12, "CAP_NET_ADMIN"), (21, "CAP_SYS_ADMIN")) if not caps >> bit & 1]
    if missing:
        who = "not root" if os.geteuid() != 0 else "root without its capabilities (a container's bounding set?)"
        return False, f"{who} (uid {os.geteuid()}): {', '.join(missing)} missing"
    probe = f"lh-probe-{os.getpid()}"
    try:
        create_netns(probe)
    except Exception as e:
        return False, f"creating network namespace {probe} was refused ({e}); try `ip netns add test`"
    step = "netlink socket"
    try:
        with netlink_in(probe) as ipr:
            step = "veth"
            ipr.link("add", ifname="a", kind="veth", peer="b")
            step = "bridge"
            ipr.link("add", ifname="br", kind="bridge")
            step = "tbf"
            ipr.tc("add", "tbf", ipr.link_lookup(ifname="a")[0], **tbf_args(100e6))
    except Exception as e:
        return False, f"the kernel refused a {step} in namespace {probe}: {e}"
    finally:
        remove_netns(probe)
    return True, "root on Linux with network namespaces, veth, bridges and tbf"


def run_in_netns(name: str, fn: Callable[[], object]) -> object:
    """fn() in a thread of its own moved into namespace ``name`` (setns is per thread, so the
    caller's thread never leaves its namespace); /proc/sys/net there is that namespace's."""
    return run_in_netns_each({name: fn})[name]


def run_in_netns_each(jobs: dict[str, Callable[[], object]]) -> dict[str, object]:
    """Each namespace's job at once, each in a thread of its own there; their results."""
    results: dict[str, object] = {}
    errors: list[BaseException] = []

    def target(name, fn):
        try:
            fd = os.open(f"{NETNS_DIR}/{name}", os.O_RDONLY)
            try:
                if _libc().setns(fd, _CLONE_NEWNET) != 0:
                    code = ctypes.get_errno()
                    raise OSError(code, f"setns into network namespace {name}: {os.strerror(code)}")
            finally:
                os.close(fd)
            results[name] = fn()
        except BaseException as e:  # handed to the caller
            errors.append(e)

    threads = [threading.Thread(target=target, args=job, name=f"netns {job[0]}") for job in jobs.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


_libc_handle = None


def _libc():
    global _libc_handle
    if _libc_handle is None:
        _libc_handle = ctypes.CDLL(None, use_errno=True)
    return _libc_handle


def write_sysctls(values: dict[str, str]) -> None:
    for path, value in values.items():
        with open(f"/proc/sys/{path}", "w") as f:
            f.write(value)


def _netns_key(name: str) -> tuple[int, int] | None:
    try:
        st = os.stat(f"{NETNS_DIR}/{name}")
    except OSError:
        return None
    return st.st_dev, st.st_ino


def pids_in(names: list[str]) -> dict[str, list[int]]:
    """The processes whose network namespace is each of ``names`` (zombies have none)."""
    keys = {k: n for n in names if (k := _netns_key(n)) is not None}
    found: dict[str, list[int]] = {n: [] for n in names}
    if not keys:
        return found
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        name = keys.get((st.st_dev, st.st_ino))
        if name is not None:
            found[name].append(int(entry))
    return found


def kill_in(names: list[str], sig: int = signal.SIGKILL, wait_s: float = 2.0) -> list[int]:
    """Signal every process in the namespaces; SIGKILL again to what they start meanwhile,
    until none is left there (or wait_s has passed). The pids signalled."""
    pids = {p for ps in pids_in(names).values() for p in ps}
    signalled: set[int] = set()
    deadline = time.monotonic() + wait_s
    while pids:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        signalled |= pids
        if sig != signal.SIGKILL or time.monotonic() > deadline:
            break
        time.sleep(0.005)
        pids = {p for ps in pids_in(names).values() for p in ps}
    return sorted(signalled)


def create_netns(name: str) -> None:
    """A named network namespace, made by ``ip netns add`` (a fork and exec). pyroute2's own
    way forks this Python process, and a fork of a process whose other threads hold locks (the
    harness's progress line, the emulators) can leave the child waiting on them for ever."""
    done = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if done.returncode != 0 and not os.path.exists(f"{NETNS_DIR}/{name}"):
        raise OSError(f"ip netns add {name}: {done.stderr.strip() or f'exit {done.returncode}'}")


def netlink_in(name: str) -> "IPRoute":
    """A netlink socket in namespace ``name``, opened by a thread that moved there (setns is per
    thread), so no process is forked (see create_netns)."""
    fd = run_in_netns(name, lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM,
                                                   socket.NETLINK_ROUTE).detach())
    return IPRoute(fileno=fd)


def remove_netns(name: str) -> bool:
    """Unmount and remove a namespace's name; False if it had none."""
    path = f"{NETNS_DIR}/{name}"
    if not os.path.exists(path):
        return False
    try:
        pyroute2_netns.remove(name)
    except FileNotFoundError:
        return False
    return True


def root_links() -> list[str]:
    return [name for _, name in socket.if_nameindex()]


def delete_root_links(names: list[str]) -> list[str]:
    removed: list[str] = []
    present = set(root_links())
    todo = [n for n in names if n in present]
    if not todo:
        return removed
    with IPRoute() as ipr:
        for name in todo:
            try:
                ipr.link("del", index=socket.if_nametoindex(name))
                removed.append(name)
            except (OSError, NetlinkError) as e:
                if getattr(e, "code", getattr(e, "errno", None)) not in (errno.ENODEV, errno.ENOENT):
                    raise RackError(f"deleting root-namespace link {name}: {e}") from e
    return removed


def remove_named(prefix: str, netns: list[str], links: list[str]) -> list[str]:
    """Kill what runs in the rack's namespaces, delete its root links and namespaces (and any
    other ``<prefix>-`` named ones); what it removed."""
    netns = sorted(set(netns) | {n for n in list_netns() if n.startswith(prefix + "-")})
    links = sorted(set(links) | {n for n in root_links() if n.startswith(prefix + "-")})
    kill_in(netns)
    removed = delete_root_links(links)
    removed += [n for n in netns if remove_netns(n)]
    return removed


def list_netns() -> list[str]:
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []
