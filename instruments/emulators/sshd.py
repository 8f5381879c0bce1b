"""ssh into the rack in a box: each GPU host is a network namespace running its own sshd, and the
harness reaches it with a plain ``ssh``, as a lab reaches a real host.

One run makes one :class:`SshKeys` in its run folder (a client key, a host key shared by every
host, and an ``ssh_config`` that trusts that host key for exactly the addresses it serves);
each host gets a :class:`HostSshd` started with ``ip netns exec``, so the sshd and everything
started through it see the namespace's own interfaces, /sys/class/net included.

    keys = SshKeys(run_dir)
    sshd = HostSshd("h0", "lh-rack-h0", "198.18.7.1", keys)
    sshd.start()
    subprocess.run(keys.ssh_argv("root@198.18.7.1") + ["ip", "-br", "link"])

Needs root, Linux network namespaces and Debian's openssh-server (``/usr/sbin/sshd``).
"""

from __future__ import annotations

import functools
import ipaddress
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from lumion_hil.instruments.protocols import InstrumentError

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = "/run/sshd"  # sshd refuses to start without its privilege separation directory

# How the client notices a dead host: no reply to ServerAliveCountMax probes, one every
# ServerAliveInterval seconds.
CONNECT_TIMEOUT_S = 3
ALIVE_INTERVAL_S = 1
ALIVE_COUNT_MAX = 3


def available() -> tuple[bool, str]:
    """(True, "") when sshd, ssh, ssh-keygen and ip are here and we are root; else why not."""
    missing = [name for name in (SSHD, "ssh", "ssh-keygen", "ip") if shutil.which(name) is None]
    if missing:
        return False, "not installed: " + ", ".join(missing) + " (scripts/setup installs openssh-server)"
    if os.geteuid() != 0:
        return False, "network namespaces and sshd need root"
    return True, ""


def _host_pattern(address: str, port: int) -> str:
    """How known_hosts (and ListenAddress) name an address and port."""
    bracketed = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    return bracketed if port == 22 else f"[{address}]:{port}"


def _quote(path: Path) -> str:
    return '"' + str(path) + '"'


class SshKeys:
    """The run's keys and client configuration, made once in ``run_dir`` (kept if already there).

    ``config`` is an ssh_config a plain ``ssh -F config root@ADDR cmd`` uses: the client key
    only, the host key checked strictly against ``known_hosts`` (no trust on first use), never
    a prompt, and a host that stops answering noticed within a few seconds."""

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.client_key = self.run_dir / "client_ed25519"
        self.host_key = self.run_dir / "host_ed25519"
        self.authorized_keys = self.run_dir / "authorized_keys"
        self.known_hosts = self.run_dir / "known_hosts"
        self.config = self.run_dir / "ssh_config"
        self._lock = threading.Lock()
        for key, comment in ((self.client_key, "lumion-hil harness"), (self.host_key, "lumion-hil host")):
            if not key.exists():
                subprocess.run(["ssh-keygen", "-t", "ed25519", "-N", "", "-q", "-C", comment, "-f", str(key)],
                               check=True, stdin=subprocess.DEVNULL, capture_output=True)
        self.authorized_keys.write_text(self.client_key.with_suffix(".pub").read_text())
        self.known_hosts.touch()
        self.config.write_text(self._client_config())

    def _client_config(self) -> str:
        return "\n".join([
            "# lumion-hil: the harness's ssh to the rack in a box (made by instruments/emulators/sshd.py)",
            "Host *",
            "    User root",
            f"    IdentityFile {_quote(self.client_key)}",
            "    IdentitiesOnly yes",
            "    IdentityAgent none",
            f"    UserKnownHostsFile {_quote(self.known_hosts)}",
            "    GlobalKnownHostsFile /dev/null",
            "    StrictHostKeyChecking yes",
            "    UpdateHostKeys no",
            "    CheckHostIP no",
            "    BatchMode yes",
            "    PasswordAuthentication no",
            "    KbdInteractiveAuthentication no",
            "    GSSAPIAuthentication no",
            "    LogLevel ERROR",
            f"    ConnectTimeout {CONNECT_TIMEOUT_S}",
            f"    ServerAliveInterval {ALIVE_INTERVAL_S}",
            f"    ServerAliveCountMax {ALIVE_COUNT_MAX}",
            "    ControlMaster no",
            "    ControlPath none",
            "    ForwardAgent no",
            "    ForwardX11 no",
            "    RequestTTY no",
            "",
        ])

    def host_public_key(self) -> str:
        """The host key's public half: "ssh-ed25519 AAAA..."."""
        algorithm, blob = self.host_key.with_suffix(".pub").read_text().split()[:2]
        return f"{algorithm} {blob}"

    def trust(self, address: str, port: int = 22) -> None:
        """Add the host key for ``address`` (and ``port``) to known_hosts (once)."""
        line = f"{_host_pattern(address, port)} {self.host_public_key()}\n"
        with self._lock:
            if line not in self.known_hosts.read_text().splitlines(keepends=True):
                with self.known_hosts.open("a") as f:
                    f.write(line)

    def ssh_argv(self, destination: str, port: int | None = None) -> list[str]:
        """``ssh -F ssh_config destination``: append the remote command's words."""
        return ["ssh", "-F", str(self.config), *(["-p", str(port)] if port not in (None, 22) else []), destination]


def netns_pids(netns: str) -> list[int]:
    """Processes whose network namespace is ``netns`` (what ``ip netns pids`` lists)."""
    try:
        target = os.stat(f"/run/netns/{netns}")
    except FileNotFoundError:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:  # gone, or a kernel thread
            continue
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            pids.append(int(entry))
    return pids


def _is_sshd(pid: int) -> bool:
    """An sshd process (the listener, or a connection's: sshd, sshd-session, sshd-auth)."""
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("sshd")
    except OSError:  # gone, or a zombie
        return False


@functools.cache
def _sshd_knows(option: str, value: str) -> bool:
    """This sshd accepts ``option value`` (newer ones have options older ones refuse)."""
    with tempfile.TemporaryDirectory() as tmp:
        key = Path(tmp) / "key"
        subprocess.run(["ssh-keygen", "-t", "ed25519", "-N", "", "-q", "-f", str(key)], check=True,
                       capture_output=True)
        config = Path(tmp) / "sshd_config"
        config.write_text(f"HostKey {key}\n{option} {value}\n")
        return subprocess.run([SSHD, "-t", "-f", str(config)], capture_output=True).returncode == 0


class HostSshd:
    """The sshd of one host: listens on ``address:port`` inside network namespace ``netns``,
    logs in root with the run's client key only. Its config and log are in the run folder
    (``sshd-<host>.conf``, ``sshd-<host>.log``). ``env`` is set in every session (SetEnv), e.g. a
    PATH whose ``python3`` has lumion-hil."""

    def __init__(self, host: str, netns: str, address: str, keys: SshKeys, *, port: int = 22,
                 env: dict[str, str] | None = None, start_timeout_s: float = 10.0):
        self.host, self.netns, self.address, self.port = host, netns, address, port
        self.keys = keys
        self.env = dict(env or {})
        self.start_timeout_s = start_timeout_s
        self.config = keys.run_dir / f"sshd-{host}.conf"
        self.log = keys.run_dir / f"sshd-{host}.log"
        self.pid_file = keys.run_dir / f"sshd-{host}.pid"
        self._proc: subprocess.Popen | None = None
        self._up = threading.Event()  # set once a started listener has answered; cleared by stop

    @property
    def argv(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns, SSHD, "-D", "-e", "-f", str(self.config)]

    @property
    def destination(self) -> str:
        return f"root@{self.address}"

    def ssh_argv(self) -> list[str]:
        """``ssh ... root@address``: append the remote command's words."""
        return self.keys.ssh_argv(self.destination, self.port)

    def sshd_config(self) -> str:
        lines = [
            f"# lumion-hil: sshd of host {self.host} in network namespace {self.netns}",
            f"ListenAddress {_host_pattern(self.address, 22)}:{self.port}",
            f"HostKey {_quote(self.keys.host_key)}",
            f"PidFile {_quote(self.pid_file)}",
            f"AuthorizedKeysFile {_quote(self.keys.authorized_keys)}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",  # the run folder is the test's, not root's own ~/.ssh
            "UseDNS no",
            "LoginGraceTime 10",
            "MaxStartups 100",
            "MaxSessions 100",
            "ClientAliveInterval 2",  # a harness that vanished: its sessions end within ~6 s
            "ClientAliveCountMax 3",
            "AcceptEnv LUMION_HIL_* NCCL_*",
            "PrintMotd no",
            "PrintLastLog no",
            "X11Forwarding no",
            "Subsystem sftp internal-sftp",
            "LogLevel INFO",
        ]
        if _sshd_knows("PerSourcePenalties", "no"):
            lines.append("PerSourcePenalties no")  # OpenSSH >= 9.8: killed sessions must not ban the harness
        lines += [f'SetEnv "{name}={value}"' for name, value in self.env.items()]
        return "\n".join(lines) + "\n"

    # -- life -------------------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """The listener is running (it may not answer yet: see ``wait_up``)."""
        return self._proc is not None and self._proc.poll() is None

    def wait_up(self, timeout_s: float) -> bool:
        """Wait until the listener answers (``start`` has seen its SSH banner), as after a power
        loss whose timer starts it again; False if it does not within ``timeout_s``."""
        return self._up.wait(timeout_s) and self.alive

    @property
    def pid(self) -> int | None:
        """The listener's pid (``ip netns exec`` execs sshd: one process)."""
        return self._proc.pid if self._proc is not None and self.alive else None

    def start(self) -> None:
        """Start the listener and wait until a connection to it from here (the harness's network
        namespace, as the harness will connect) gets its SSH banner."""
        if self.alive:  # started, or being started by another thread: wait for it to answer
            self._up.wait(self.start_timeout_s)
            return
        os.makedirs(PRIVSEP_DIR, mode=0o755, exist_ok=True)
        self.keys.trust(self.address, self.port)
        self.config.write_text(self.sshd_config())
        with self.log.open("ab") as log:
            log_from = log.tell()
            try:
                proc = self._proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                                     start_new_session=True)
            except OSError as exc:
                raise InstrumentError(f"sshd of {self.host}", shlex.join(self.argv),
                                      f"cannot start: {exc.strerror or exc}") from None
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            if self._proc is not proc:  # stopped meanwhile (a power-loss timer's start beside a close)
                return
            code = proc.poll()
            if code is not None:
                self._fail(f"exited with status {code}", log_from)
            if self._answers(min(1.0, max(0.05, deadline - time.monotonic()))):
                self._up.set()
                return
            if time.monotonic() >= deadline:
                self.stop()
                self._fail(f"not answering on {self.address}:{self.port} within {self.start_timeout_s:g} s",
                           log_from)
            time.sleep(0.02)

    def _answers(self, timeout_s: float) -> bool:
        """A connection to the listener gets an SSH banner."""
        try:
            with socket.create_connection((self.address, self.port), timeout=timeout_s) as sock:
                return sock.recv(64).startswith(b"SSH-")
        except OSError:
            return False

    def _fail(self, reason: str, log_from: int) -> None:
        with self.log.open("rb") as log:
            log.seek(log_from)
            said = log.read().decode("utf-8", "replace").strip().splitlines()[-8:]
        raise InstrumentError(f"sshd of {self.host} (netns {self.netns})", shlex.join(self.argv),
                              f"{reason}; sshd said: {' | '.join(said) or 'nothing'}")

    def sessions(self) -> list[int]:
        """Pids of the connections' sshd processes in the namespace (not the listener's)."""
        listener = self.pid
        return [pid for pid in netns_pids(self.netns) if pid != listener and _is_sshd(pid)]

    def kill_sessions(self, timeout_s: float = 2.0) -> list[int]:
        """Kill every connection's sshd (SIGKILL), not the listener: each client sees its session
        dropped, as when the link to a host is lost. Commands the sessions ran are left running,
        as on a real host; they see their stdin close. Returns the pids killed."""
        pids = self.sessions()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout_s
        while any(_is_sshd(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.01)
        return pids

    def stop(self, sessions: bool = True) -> None:
        """Stop the listener and (``sessions``) the connections' sshd processes. Safe twice."""
        if sessions:
            self.kill_sessions()
        self._up.clear()
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    def restart(self, sessions: bool = True) -> None:
        self.stop(sessions)
        self.start()

    def __enter__(self) -> "HostSshd":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"HostSshd({self.host!r}, netns={self.netns!r}, {self.address}:{self.port}, alive={self.alive})"
