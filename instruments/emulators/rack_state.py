"""A rack's claim on this machine, and what is done when its owner is gone. The owner of a rack
writes a state file as it builds (``STATE_DIR/<prefix>.json``: its pid and start time, the
`lumion-hil run` it runs under, its namespaces and root link, its management subnet, its
scratch folder), so that
a rack left by an owner killed outright is found and removed by the next one
(:func:`clean_up_stale`) or by ``lumion-hil bench restore`` (:func:`restore_after_killed_runs`),
and so that two racks on one machine never take the same management subnet
(:func:`choose_mgmt_net`, under one machine-wide lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from lumion_hil.instruments.emulators.rack_machine import available, list_netns, pids_in, remove_named, root_links
from lumion_hil.instruments.emulators.rack_netlink import IPRoute
from lumion_hil.instruments.emulators.rack_spec import MGMT_SPACE, PREFIX, RackError, RackLayout, RackUnavailable
from lumion_hil.instruments.gpu_host.jobs import wait_exit

STATE_DIR = "/run/lumion-hil/racks"
LOCK_FILE = "/run/lumion-hil/racks.lock"  # one for the machine, whatever a rack's state_dir
SCRATCH = "lumion-hil-rack-"  # a rack's scratch folder (ssh keys, job logs, checkpoints): <tmp>/SCRATCH<prefix>-<random>


@contextlib.contextmanager
def state_lock():
    """One machine-wide lock over choosing a management subnet and taking it."""
    Path(LOCK_FILE).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def write_state(layout: RackLayout, state_file: Path, scratch: Path | None = None) -> None:
    """The rack's state file, as its owner (this process) holds it now."""
    run = run_wrapper()  # the `lumion-hil run` this rack's owner runs under, if any
    state = {"prefix": layout.prefix, "owner_pid": os.getpid(), "owner_start": process_start(os.getpid()),
             "run_pid": run, "run_start": process_start(run) if run else None,
             "netns": layout.namespaces, "links": [layout.root_link],
             "mgmt_net": str(layout.mgmt_net) if layout.mgmt_net else None,
             "hosts": [h.name for h in layout.spec.hosts], "scratch": str(scratch) if scratch else None}
    tmp = state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(state_file)


def earlier_mgmt_net(state_file: Path) -> ipaddress.IPv4Network | None:
    """The management subnet an earlier (crashed) owner of this state file chose, if it says."""
    if state_file.exists():
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
            return ipaddress.IPv4Network(json.loads(state_file.read_text()).get("mgmt_net"))
    return None


def choose_mgmt_net(root: IPRoute, layout: RackLayout, state_file: Path) -> ipaddress.IPv4Network:
    """The management /24: the one the root link already has, else the one chosen before
    (by this rack, or by a crashed owner of its prefix) if still free, else the first in
    MGMT_SPACE that no root address or route and no other rack's state file uses."""
    if layout.root_link in root_links():
        for addr in root.addr("dump", family=socket.AF_INET, index=socket.if_nametoindex(layout.root_link)):
            net = ipaddress.IPv4Network(f"{addr.get('address')}/{addr['prefixlen']}", strict=False)
            if net.subnet_of(MGMT_SPACE):
                return net
    used = []
    for addr in root.addr("dump", family=socket.AF_INET):
        used.append(ipaddress.IPv4Network(f"{addr.get('address')}/{addr['prefixlen']}", strict=False))
    for route in root.route("dump", family=socket.AF_INET):
        if route["dst_len"] and route.get("dst"):
            used.append(ipaddress.IPv4Network(f"{route.get('dst')}/{route['dst_len']}", strict=False))
    for path in state_file.parent.glob("*.json"):
        if path == state_file:
            continue
        try:
            other = json.loads(path.read_text()).get("mgmt_net")
        except (OSError, ValueError, AttributeError):
            continue
        if other:
            used.append(ipaddress.IPv4Network(other))
    candidates = list(MGMT_SPACE.subnets(new_prefix=24))[1:]
    for net in ([layout.mgmt_net] if layout.mgmt_net else []) + candidates:
        if not any(net.overlaps(u) for u in used):
            return net
    raise RackError(f"rack {layout.prefix}: every /24 of {MGMT_SPACE} is in use in the root namespace")


def command_of(pid: int) -> str:
    """A process's command name ("?" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def process_start(pid: int) -> int | None:
    """A live process's start time in clock ticks since boot (tells a pid from its reuse);
    None for no process, or one dead and not yet reaped (a zombie, or one exiting)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X", "x"):
        return None
    return int(fields[19])


def alive(pid: int, start: int | None) -> bool:
    """Whether the process that had ``pid`` (and started at ``start``, where known) still runs."""
    now = process_start(pid)
    return now is not None and (start is None or now == start)


def run_wrapper() -> int | None:
    """The pid of the `lumion-hil run` this process runs under (its LUMION_HIL_RUN), if any."""
    run = os.environ.get("LUMION_HIL_RUN", "")
    head = run.split("-", 1)[0]
    return int(head) if head.isdigit() else None


def rack_states(state_dir: str, prefix: str) -> list[dict]:
    """The state files of the racks under ``prefix``, as read."""
    states = []
    for path in sorted(Path(state_dir).glob("*.json")) if Path(state_dir).is_dir() else []:
        try:
            state = json.loads(path.read_text())
            state["owner_pid"] = int(state["owner_pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(state.get("prefix"), str) and state["prefix"].startswith(prefix):
            states.append(state)
    return states


def make_scratch(prefix: str) -> Path:
    """A new scratch folder for the rack ``prefix``, in this process's temp dir."""
    return Path(tempfile.mkdtemp(prefix=f"{SCRATCH}{prefix}-"))


def scratch_owner(folder: str | os.PathLike) -> str | None:
    """The rack prefix a scratch folder is named for, or None for a path not named as one."""
    name = Path(folder).name
    return name[len(SCRATCH):].rsplit("-", 1)[0] if name.startswith(SCRATCH) and "-" in name[len(SCRATCH):] else None


def earlier_scratch(state_file: Path, prefix: str) -> Path | None:
    """The scratch folder an earlier (crashed) owner of this state file made, if it is still there."""
    if state_file.exists():
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
            folder = Path(json.loads(state_file.read_text()).get("scratch"))
            if scratch_owner(folder) == prefix and folder.is_dir() and not folder.is_symlink():
                return folder
    return None


def remove_scratch(folder: str | os.PathLike | None, prefix: str) -> list[str]:
    """Remove the rack ``prefix``'s scratch folder: only a folder (not a link) whose name is
    that rack's scratch name, wherever a state file says it is; what it removed."""
    if not folder:
        return []
    path = Path(folder)
    if scratch_owner(path) != prefix or path.is_symlink() or not path.is_dir():
        return []
    shutil.rmtree(path, ignore_errors=True)
    return [] if path.exists() else [str(path)]


def leftovers(prefix: str = "lh-") -> dict[str, list[str]]:
    """What is on this machine under ``prefix``: namespaces, root-namespace links, the
    processes inside those namespaces (as "pid namespace command"), and the racks' scratch
    folders in the temp dir. Random prefixes have one length, so one rack's prefix never
    starts another's."""
    netns = [n for n in list_netns() if n.startswith(prefix)]
    links = [n for n in root_links() if n.startswith(prefix)]
    pids = pids_in(netns)
    folders = sorted(str(p) for p in Path(tempfile.gettempdir()).glob(f"{SCRATCH}{prefix}*")
                     if scratch_owner(p) and p.is_dir() and not p.is_symlink())
    return {"netns": netns, "links": links,
            "processes": [f"{pid} {ns} {command_of(pid)}" for ns in netns for pid in sorted(pids[ns])],
            "folders": folders}


def destroy(prefix: str) -> list[str]:
    """Remove every namespace and root link named ``<prefix>-...``, killing the processes in
    those namespaces, whoever owns them; what it removed. For a rack's exact prefix only."""
    if not PREFIX.match(prefix):
        raise ValueError(f"rack prefix {prefix!r}: 1-13 of [a-z0-9-]")
    ok, why = available()
    if not ok:
        raise RackUnavailable(why)
    return remove_named(prefix, [], [])


def restore_after_killed_runs(state_dir: str = STATE_DIR, prefix: str = "lh-",
                              wait_s: float = 60.0) -> tuple[list[str], dict[str, list[str]]]:
    """What ``bench restore`` does on this machine after a run was killed. A rack whose run's
    wrapper died while its owner lives is being torn down by that owner (sent SIGTERM on its
    wrapper's death, it stops at a safe point): wait for the owner to end, at most ``wait_s``.
    Then tear down every rack whose owner is dead, and everything under ``prefix`` that no
    live rack owns (scratch folders too), and wait for the processes killed to be gone. Returns
    (what it removed, what is still there that no live run owns: namespaces, links, processes,
    folders)."""
    deadline = time.monotonic() + wait_s
    for state in rack_states(state_dir, prefix):
        if alive(state["owner_pid"], state.get("owner_start")) and state.get("run_pid") \
                and not alive(state["run_pid"], state.get("run_start")):
            wait_exit(state["owner_pid"], deadline - time.monotonic())
    removed = clean_up_stale(state_dir, prefix)

    def live() -> list[str]:  # read again each time: a run may be building its rack meanwhile
        return [s["prefix"] for s in rack_states(state_dir, prefix) if alive(s["owner_pid"], s.get("owner_start"))]

    def owned(kind: str, name: str, rack: str) -> bool:
        if kind == "folders":
            return scratch_owner(name) == rack
        return f" {rack}-" in f" {name}" or name.startswith(rack + "-")

    def orphans() -> dict[str, list[str]]:
        found = leftovers(prefix)
        racks = live()  # after the scan: a rack writes its state file before it makes any of its parts
        return {kind: [x for x in names if not any(owned(kind, x, p) for p in racks)] for kind, names in found.items()}

    left = orphans()
    for name in left["netns"] + left["links"]:
        rack_prefix = name.rsplit("-", 1)[0]
        if PREFIX.match(rack_prefix) and rack_prefix not in live():
            removed += remove_named(rack_prefix, [], [])
    for folder in left["folders"]:
        if scratch_owner(folder) not in live():
            removed += remove_scratch(folder, scratch_owner(folder) or "")
    settle = time.monotonic() + 5.0
    while any(orphans().values()) and time.monotonic() < settle:
        time.sleep(0.05)  # killed: each process is gone once the kernel has reaped it
    return removed, orphans()


def clean_up_stale(state_dir: str = STATE_DIR, prefix: str = "lh-") -> list[str]:
    """Tear down the racks (under ``prefix``) whose owner process is dead, as their state
    files in ``state_dir`` list them, with any other namespace or root link named with their
    prefix, and their scratch folders; what it removed (names, and the state files' and
    folders' paths)."""
    directory = Path(state_dir)
    if not directory.is_dir() or not any(directory.glob("*.json")):
        return []
    ok, why = available()
    if not ok:
        raise RackUnavailable(why)
    removed: list[str] = []
    for path in sorted(directory.glob("*.json")):
        try:
            state = json.loads(path.read_text())
            rack_prefix, pid = state["prefix"], int(state["owner_pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not rack_prefix.startswith(prefix) or not PREFIX.match(rack_prefix):
            continue
        start = process_start(pid)
        if start is not None and start == state.get("owner_start", start):
            continue  # its owner lives
        mine = [n for n in [*state.get("netns", []), *state.get("links", [])]
                if isinstance(n, str) and n.startswith(rack_prefix + "-")]  # never another's names
        removed += remove_named(rack_prefix, [n for n in mine if n in state.get("netns", [])],
                                [n for n in mine if n in state.get("links", [])])
        removed += remove_scratch(state.get("scratch") if isinstance(state.get("scratch"), str) else None, rack_prefix)
        path.unlink(missing_ok=True)
        removed.append(str(path))
    return removed
