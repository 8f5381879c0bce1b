"""The rack in a box over real ssh: one sshd per host network namespace (instruments/emulators/
sshd.py) and the ssh launcher (instruments/emulators/launch.py). Needs root, ip and openssh."""

from __future__ import annotations

import ipaddress
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lumion_hil.instruments.emulators import sshd
from lumion_hil.instruments.emulators.sshd import HostSshd, SshKeys, netns_pids
from lumion_hil.instruments.protocols import InstrumentError

from conftest import needs

OK, WHY = sshd.available()
pytestmark = needs("netns", OK, f"rack in a box over ssh: {WHY}")

HOSTS = ("h0", "h1", "h2")
LAUNCH = [sys.executable, "-m", "lumion_hil.instruments.emulators.launch"]


def ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def free_subnet() -> ipaddress.IPv4Network:
    """A /24 of 198.18.0.0/15 that no route or address on this machine touches."""
    used = [ipaddress.ip_network(r["dst"], strict=False) for r in json.loads(ip("-j", "-4", "route", "show", "table", "all"))
            if r["dst"] != "default"]
    used += [ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False)
             for link in json.loads(ip("-j", "-4", "addr")) for a in link.get("addr_info", [])]
    candidates = list(ipaddress.ip_network("198.18.0.0/15").subnets(new_prefix=24))
    random.shuffle(candidates)
    return next(net for net in candidates if not any(net.overlaps(u) for u in used))


@dataclass
class Rack:
    keys: SshKeys
    tag: str
    uplink: str  # the root namespace's end of the rack's one link
    subnet: ipaddress.IPv4Network
    switch: str  # the namespace holding the bridge
    hosts: dict[str, HostSshd] = field(default_factory=dict)

    def ssh(self, host: str, command: str, timeout: float = 10) -> subprocess.CompletedProcess:
        return subprocess.run(self.hosts[host].ssh_argv() + [command], capture_output=True, text=True,
                              timeout=timeout)

    def leftovers(self) -> dict[str, list[str]]:
        """Each host's processes other than its sshd listener (command lines)."""
        found = {}
        for name, host in self.hosts.items():
            cmds = []
            for pid in netns_pids(host.netns):
                if pid != host.pid:
                    try:
                        cmds.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
                    except OSError:
                        pass
            if cmds:
                found[name] = cmds
        return found

    def wait_no_leftovers(self, within_s: float = 5.0) -> dict[str, list[str]]:
        deadline = time.monotonic() + within_s
        while (left := self.leftovers()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return left

    def kill_leftovers(self) -> None:
        for host in self.hosts.values():
            kill_all(host.netns, but=host.pid)


def kill_all(netns: str, but: int | None = None) -> None:
    """SIGKILL every process in ``netns`` (but one)."""
    for pid in netns_pids(netns):
        if pid != but:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="module")
def rack(tmp_path_factory):
    """Three hosts (namespaces lh-ts<tag>-h0..h2, interface lhfab0) on a bridge in a namespace of
    its own (lh-ts<tag>-sw), one veth from it to the root namespace; an sshd in each host.
    Everything is removed at the end, whatever happened."""
    tag = f"{random.getrandbits(24):06x}"
    subnet = free_subnet()
    addr = list(subnet.hosts())
    keys = SshKeys(tmp_path_factory.mktemp("ssh"))
    r = Rack(keys, tag, f"lhts{tag}", subnet, f"lh-ts{tag}-sw")
    namespaces = [r.switch]
    try:
        ip("netns", "add", r.switch)
        ip("-n", r.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", r.switch, "link", "set", "br0", "up")
        ip("link", "add", r.uplink, "type", "veth", "peer", "name", "uplink", "netns", r.switch)
        ip("-n", r.switch, "link", "set", "uplink", "master", "br0", "up")
        ip("addr", "add", f"{addr[-1]}/24", "dev", r.uplink)
        ip("link", "set", r.uplink, "up")
        for i, name in enumerate(HOSTS):
            netns = f"lh-ts{tag}-{name}"
            ip("netns", "add", netns)
            namespaces.append(netns)
            ip("-n", r.switch, "link", "add", name, "type", "veth", "peer", "name", "lhfab0", "netns", netns)
            ip("-n", r.switch, "link", "set", name, "master", "br0", "up")
            ip("-n", netns, "addr", "add", f"{addr[i]}/24", "dev", "lhfab0")
            ip("-n", netns, "link", "set", "lhfab0", "up")
            ip("-n", netns, "link", "set", "lo", "up")
            r.hosts[name] = HostSshd(name, netns, str(addr[i]), keys)
        with ThreadPoolExecutor(len(HOSTS)) as pool:
            list(pool.map(HostSshd.start, r.hosts.values()))
        yield r
    finally:
        for host in r.hosts.values():
            host.stop()
        for netns in namespaces:
            kill_all(netns)
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        subprocess.run(["ip", "link", "del", r.uplink], capture_output=True)


@pytest.fixture
def clean(rack):
    """Each test leaves no process on any host but its sshd, and every sshd running."""
    yield rack
    rack.kill_leftovers()
    for host in rack.hosts.values():
        host.start()


def launch(rack: Rack, *args: str, program: list[str], hosts=HOSTS, timeout: float = 30) -> subprocess.CompletedProcess:
    dests = ",".join(rack.hosts[h].destination for h in hosts)
    return subprocess.run([*LAUNCH, "--ssh-config", str(rack.keys.config), "--hosts", dests,
                           "--python", sys.executable, *args, "--", *program],
                          capture_output=True, text=True, timeout=timeout)


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


# -- sshd -----------------------------------------------------------------------------------------


def test_sessions_see_their_namespace(clean):
    """A command run through ssh sees the host's own interfaces and /sys, not the root's."""
    rack = clean
    for name, host in rack.hosts.items():
        out = rack.ssh(name, "ls /sys/class/net; cat /sys/class/net/lhfab0/address; echo $SSH_CONNECTION")
        assert out.returncode == 0, out.stderr
        lines = out.stdout.split()
        assert lines[:2] == ["lhfab0", "lo"]
        mac = json.loads(ip("-n", host.netns, "-j", "link", "show", "lhfab0"))[0]["address"]
        assert lines[2] == mac
        assert lines[-2] == host.address  # SSH_CONNECTION's server address
    h0 = rack.hosts["h0"]
    sent = subprocess.run(h0.ssh_argv()[:-1] + ["-o", "SendEnv=LUMION_HIL_* NCCL_*", h0.destination,
                                                "echo $LUMION_HIL_PROBE $NCCL_PROBE"],
                          capture_output=True, text=True, env={**os.environ, "LUMION_HIL_PROBE": "1", "NCCL_PROBE": "2"})
    assert sent.stdout == "1 2\n"  # AcceptEnv
    assert rack.uplink in os.listdir("/sys/class/net")  # ... which the hosts do not see


def test_connect_time_and_concurrent_sessions(clean, capsys):
    """One connection + trivial command, timed (and the same without the remote login shell: the
    sftp subsystem runs inside sshd); ten sessions at once to one host all succeed."""
    rack = clean

    def timed(argv: list[str]) -> str:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            assert subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True).returncode == 0
            times.append(time.perf_counter() - t0)
        return (f"median {statistics.median(times) * 1000:.0f} ms, min {min(times) * 1000:.0f} ms, "
                f"max {max(times) * 1000:.0f} ms over {len(times)}")

    command = timed(rack.hosts["h0"].ssh_argv() + ["true"])
    handshake = timed(rack.hosts["h0"].ssh_argv()[:-1] + ["-s", rack.hosts["h0"].destination, "sftp"])
    with capsys.disabled():
        print(f"\nssh connect + `true` (root's login shell included): {command}"
              f"\nssh connect + session, no shell (sftp subsystem): {handshake}")
    with ThreadPoolExecutor(10) as pool:
        codes = list(pool.map(lambda _: rack.ssh("h1", "sleep 0.2").returncode, range(10)))
    assert codes == [0] * 10


def test_kill_sessions_drops_the_client(clean):
    rack = clean
    host = rack.hosts["h1"]
    # The remote shell says its pid, then becomes the command (exec keeps the pid): the process
    # that must run on is known whether or not the shell has exec'd yet when the session is killed
    # (a loaded machine once found it still "bash", a moment before "sleep").
    client = subprocess.Popen(host.ssh_argv() + ["echo ready $$; exec sleep 30"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        said = client.stdout.readline().split()
        assert said[:1] == ["ready"] and len(said) == 2, said
        command_pid = int(said[1])
        assert host.sessions()
        t0 = time.monotonic()
        killed = host.kill_sessions()
        code = client.wait(timeout=2)
        dropped_s = time.monotonic() - t0
    finally:
        client.kill()
        client.wait()
    assert killed and code != 0 and dropped_s < 2
    assert "closed by remote host" in client.stderr.read()
    assert host.alive and not host.sessions()
    # the command runs on, as on a real host: its process, and nothing else of the session's
    assert set(netns_pids(host.netns)) - {host.pid} == {command_pid}, rack.leftovers()
    assert rack.ssh("h1", "true").returncode == 0  # the listener takes new connections


def test_stop_start_restart(clean):
    rack = clean
    host = rack.hosts["h2"]
    host.stop()
    host.stop()  # twice is fine
    assert not host.alive and host.pid is None
    refused = rack.ssh("h2", "true")
    assert refused.returncode == 255 and "refused" in refused.stderr
    host.start()
    assert rack.ssh("h2", "echo again").stdout == "again\n"
    old = host.pid
    host.restart()
    assert host.alive and host.pid != old
    assert rack.ssh("h2", "true").returncode == 0


def test_start_failure_names_host_command_and_stderr(rack, tmp_path):
    """An sshd that cannot bind its address: the error says which host, what ran, what sshd said."""
    broken = HostSshd("hx", rack.hosts["h0"].netns, "198.51.100.7", rack.keys, start_timeout_s=3)
    with pytest.raises(InstrumentError) as err:
        broken.start()
    text = str(err.value)
    assert "hx" in text and "ip netns exec" in text and "sshd said:" in text
    assert "198.51.100.7" in text  # sshd's own complaint: cannot bind that address
    assert not broken.alive


# -- launcher -------------------------------------------------------------------------------------


def test_launch_ranks_and_output(clean):
    rack = clean
    out = launch(rack, "--env", "FOO=bar baz", program=py(
        "import os, sys; e = os.environ\n"
        "print(e['LUMION_HIL_RANK'], e['LUMION_HIL_WORLD_SIZE'], e['SSH_CONNECTION'].split()[2], e['FOO'])\n"
        "print('hello from', e['LUMION_HIL_RANK'], sorted(os.listdir('/sys/class/net')), file=sys.stderr)"))
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"0 3 {rack.hosts['h0'].address} bar baz\n"  # rank 0's stdout only
    for rank in range(3):
        assert f"[rank {rank}] hello from {rank} ['lhfab0', 'lo']" in out.stderr
    assert rack.wait_no_leftovers() == {}


def test_launch_failing_rank_ends_the_others(clean):
    rack = clean
    t0 = time.monotonic()
    out = launch(rack, program=py(
        "import os, sys, time\n"
        "if os.environ['LUMION_HIL_RANK'] == '1':\n"
        "    time.sleep(0.3); sys.exit(7)\n"
        "time.sleep(60)"))
    assert out.returncode == 7, out.stderr
    assert time.monotonic() - t0 < 10
    assert "rank 1 (root@" in out.stderr and "status 7" in out.stderr
    assert rack.wait_no_leftovers() == {}


def test_launch_timeout_ends_a_hung_rank(clean):
    """The hung rank ignores SIGTERM and has a child: both are killed all the same."""
    rack = clean
    t0 = time.monotonic()
    out = launch(rack, "--timeout", "1.5", program=py(
        "import os, signal, subprocess, time\n"
        "if os.environ['LUMION_HIL_RANK'] == '2':\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN); subprocess.Popen(['sleep', '60']); time.sleep(60)"))
    assert out.returncode == 124, out.stderr
    assert "timed out after 1.5 s" in out.stderr
    assert time.monotonic() - t0 < 10
    assert rack.wait_no_leftovers() == {}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_launcher_signalled_or_killed_takes_its_ranks(clean, sig):
    """SIGTERM: the launcher ends every rank (exit 143). SIGKILL: the ranks' ssh sessions see
    their stdin close and end the same way."""
    rack = clean
    dests = ",".join(h.destination for h in rack.hosts.values())
    proc = subprocess.Popen([*LAUNCH, "--ssh-config", str(rack.keys.config), "--hosts", dests, "--python",
                             sys.executable, "--", *py("import sys, time; print('up', file=sys.stderr, flush=True); "
                                                       "time.sleep(60)")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        started = set()
        while len(started) < 3:
            line = proc.stderr.readline()
            assert line, "the launcher ended before every rank started"
            if line.endswith("] up\n"):
                started.add(line.split("]")[0])
        assert set(rack.leftovers()) == set(HOSTS)  # every rank is running
        proc.send_signal(sig)
        code = proc.wait(timeout=10)
    finally:
        proc.kill()
        proc.wait()
    assert code == (143 if sig == signal.SIGTERM else -9)
    assert rack.wait_no_leftovers() == {}


def test_launch_help():
    out = subprocess.run([*LAUNCH, "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    assert "LUMION_HIL_RANK" in out.stdout and "--timeout" in out.stdout
