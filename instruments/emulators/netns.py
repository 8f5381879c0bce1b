"""The namespaced bench, a rack in a box (``backend: netns``): the emulated world of
:class:`~lumion_hil.instruments.emulators.bench.EmulatedBench` driving a data plane of real
kernel parts on this machine, so that the code a real bench runs runs here too.

- Each GPU host is a network namespace with its own sshd on a management network; the harness
  reaches its agent through real ssh, and the agent reads its links from its own
  /sys/class/net, woken by netlink, and runs its job as real processes (its GPUs are the
  world's, through the emulated NVML, as on the other emulated benches).
- Each optical NIC is a veth into a switch namespace. The emulated switch's circuits are made
  there as bridges (a NIC pair is joined while both of its circuits are lit), and each NIC's
  carrier follows the world's light: the switch end of its veth is set up when the world's link
  state machine says the link is up (light above the receiver's sensitivity, then lock and
  bring-up), down when the light goes.
- Links are shaped with tbf to the bench file's rates times ``netns.rate_scale``; the electrical
  rack is a bridge per rack joined through uplinks shaped to the racks' oversubscribed rate.
- The job (instruments/emulators/ring_job.py) and nccl-tests (ring_perf.py, started on every
  rank through ssh by launch.py) move real bytes through real sockets, so bandwidth here is
  measured, not computed.

Setting up and tearing down is idempotent; a rack left by a run killed outright is found by its
state file and removed by the next run, or by ``lumion-hil bench restore``.

The data plane that keeps the rack where the world says it is: netns_plane.py; the program the
bandwidth tests' scripts on the hosts run: netns_perf.py.
"""

from __future__ import annotations

import json
import math
import shlex
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lumion_hil.instruments.backend import AGENT_FAULTS
from lumion_hil.instruments.collectives import Fabric, Link, bus_factor, collective_cost, rack_fabric
from lumion_hil.instruments.emulators import rack_machine
from lumion_hil.instruments.emulators import sshd as sshds
from lumion_hil.instruments.emulators.bench import EmulatedBench
from lumion_hil.instruments.emulators.nccl_tests import PROGRAMS
from lumion_hil.instruments.emulators.netns_perf import FOLDERS
from lumion_hil.instruments.emulators.netns_plane import DataPlane
from lumion_hil.instruments.emulators.rack import Rack
from lumion_hil.instruments.emulators.rack_spec import FABRIC_IFNAME, RackHost, RackNic, RackSpec

PERF_PORT_OFFSET = 1  # nccl-tests' rendezvous: the job's master port + 1, so both can run
# The bandwidth tests' libraries (netns.collectives), as the run record describes them (their
# programs' folders in the run folder: netns_perf.FOLDERS).
LIBRARIES = {"ring": "lumion-hil ring (ssh launcher)", "gloo": "torch.distributed gloo (ssh launcher)",
                 "mpi": "Open MPI, mpi4py (mpirun)"}


class NetnsUnavailable(RuntimeError):
    """The namespaced bench cannot be built on this machine (not Linux, not root, no sshd...)."""


def available() -> tuple[bool, str]:
    """Whether a namespaced bench can be built here, and if not, why."""
    for check in (rack_machine.available, sshds.available):
        ok, why = check()
        if not ok:
            return False, why
    return True, "network namespaces, veths, bridges, tbf and sshd are available"


class NetnsBench(EmulatedBench):
    """Start with :meth:`start`; :meth:`stop` tears everything down (also after a failed start)."""

    kind = "netns"
    real_traffic = True  # real sockets, queues, bridges and tbf
    shaped_by = ("the link rates and oversubscribed uplinks the bench file sets, as tbf queues on the rack's veths: "
                 "measured through real sockets, but set by the harness")

    def __init__(self, bench: Any):
        super().__init__(bench)
        self.settings = bench.netns
        self.rack: Rack | None = None
        self.keys: sshds.SshKeys | None = None
        self.sshd: dict[str, sshds.HostSshd] = {}
        self.plane: DataPlane | None = None
        self._power_timers: list[threading.Timer] = []

    # -- life ---------------------------------------------------------------------------------

    def start(self) -> "NetnsBench":
        ok, why = available()
        if not ok:
            raise NetnsUnavailable(f"bench {self.bench.name!r}: the namespaced bench cannot be built here: {why}")
        try:
            Rack.clean_up_stale()  # what a run killed outright left behind
            self.rack = Rack(rack_spec(self.bench)).build()
            self.world_service_host = self.rack.mgmt_gateway
            super().start()  # the instruments' emulators and the world's service, on the management network
            hosts = self.bench.topology.hosts
            self.keys = sshds.SshKeys(self._run_dir / "ssh")
            for host in hosts:
                self.sshd[host.name] = sshds.HostSshd(host.name, self.rack.netns(host.name),
                                                      self.rack.mgmt_address(host.name), self.keys)
            with ThreadPoolExecutor(len(self.sshd)) as pool:  # every host's sshd at once
                list(pool.map(lambda server: server.start(), self.sshd.values()))
            self.plane = DataPlane(self.world, self.rack, self.bench).start()
            self._write_rack_map()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for timer in self._power_timers:
            timer.cancel()
        if self.plane is not None:
            self.plane.stop()
            self.plane = None
        for server in self.sshd.values():
            server.stop()
        self.sshd.clear()
        super().stop()
        if self.rack is not None:
            self.rack.teardown()  # its scratch folder (our files) with it
            self.rack = None

    @property
    def _rack(self) -> Rack:
        """The rack :meth:`start` builds."""
        if self.rack is None:
            raise RuntimeError(f"bench {self.bench.name!r}: the namespaced bench is not started (no rack)")
        return self.rack

    @property
    def _run_dir(self) -> Path:
        """The run's files (ssh keys, job logs, checkpoints): the rack's scratch folder, removed
        with the rack, and by `bench restore` after a kill -9."""
        if self.rack is None or self.rack.scratch is None:
            raise RuntimeError(f"bench {self.bench.name!r}: the namespaced bench is not started (no run folder)")
        return self.rack.scratch

    @property
    def _keys(self) -> sshds.SshKeys:
        if self.keys is None:
            raise RuntimeError(f"bench {self.bench.name!r}: the namespaced bench is not started (no ssh keys)")
        return self.keys

    # -- how things are started here ---------------------------------------------------------

    def destination(self, host: str) -> str:
        """``user@address`` of a host's sshd on the management network."""
        return f"{self.settings.user}@{self._rack.mgmt_address(host)}"

    def agent_argv(self, host, *extra: str) -> list[str]:
        """The agent through real ssh, with its links from the host's own /sys/class/net."""
        host = self.bench.host(host) if isinstance(host, str) else host
        faults = [f"--fault={fault}" for fault in host.emulation.faults]
        remote = [sys.executable, "-m", "lumion_hil.instruments.emulators.agent", "--world", self._world_address(),
                  "--host", host.name, "--links", "sysfs", "--log-dir", str(self._run_dir / "jobs" / host.name),
                  *faults, *extra]
        return self._keys.ssh_argv(self.destination(host.name)) + [shlex.join(remote)]

    def job_kind(self, job) -> str:
        if self._torch_job():
            return ("PyTorch DDP on gloo, started by torchrun on every host (instruments/emulators/torch_job.py), "
                    "checkpoints on shared storage")
        return "the light ring job (instruments/emulators/ring_job.py)"

    def collective_libraries(self) -> list[str]:
        return list(self.settings.collectives)

    def describe_library(self, library: str) -> str:
        return LIBRARIES[library]

    def _torch_job(self) -> bool:
        return self.settings.job == "torch" and not self.light_job and not (self.bench.job and self.bench.job.command)

    def collective_rings(self, library: str | None = None) -> int | None:
        """gloo's all-reduce, and Open MPI's ring (the tuned component's algorithm 4, which
        mpirun is told to use here), move the buffer one way round one ring (measured here:
        busbw one link's rate, where lumion-hil's ring, two rings one each way, gets both
        directions)."""
        if library is None:
            library = "gloo" if self._torch_job() else "ring"
        return {"gloo": 1, "mpi": 1}.get(library)

    def not_comparable(self, what: str) -> str | None:
        """``job``; a library (against the published ratio); ``LIBRARY:model`` (against the
        cost model's prediction); ``job:model`` (the job's step rates against the cost model's:
        the PyTorch job all-reduces its gradients with gloo, the light ring job with lumion-hil's
        ring, which is the model's)."""
        if what == "job:model":
            if not self._torch_job():
                return None
            gloo = self.not_comparable("gloo:model")
            assert gloo is not None  # said below
            return "the PyTorch job all-reduces its gradients with gloo: " + gloo
        if what == "job":
            return (None if not self._torch_job() else
                    "a PyTorch job on gloo over TCP on a 2-core CPU machine, its GPU compute emulated: each start "
                    "costs torchrun's and the worker's `import torch` (seconds of CPU a host) and gloo's full mesh, "
                    "against Morphlux's NCCL job on GPUs")
        if what == "gloo:model":
            return ("the cost model's ring pipelines its chunks; gloo's waits on each step of its ring, so the "
                    "electrical ring's deep shared-uplink queue costs it more than the model says (its electrical "
                    "busbw 0.87-0.92 of the model's, the ratio 1.09-1.24 against 1.00 in three runs)")
        if what == "mpi:model":
            return ("the cost model's ring pipelines its chunks; Open MPI's ring all-reduce does not (its "
                    "electrical busbw in one rack 0.85 of gloo's and the model's, 0.0204 against 0.024 GB/s)")
        if what == "gloo":
            return ("gloo's all-reduce over TCP on CPU buffers, one ring one way round, at the bench file's rates "
                    "shaped to 1%: the published ratio is NCCL's, two rings on GPUs; the ratio here follows from "
                    "the shaping and gloo's one ring")
        if what == "mpi":
            return ("Open MPI's ring all-reduce over TCP on CPU buffers, one ring one way round, at the bench file's "
                    "rates shaped to 1%: the published ratio is NCCL's, two rings on GPUs; the ratio here follows "
                    "from the shaping and Open MPI's one ring")
        return None

    def scale_uplinks(self, factor: float) -> bool:
        if self.bench.electrical is None:
            return False
        self._rack.set_uplink_mbit({rack: mbit * factor for rack, mbit in uplink_mbit(self.bench).items()})
        return True

    def fabric_env(self, host, fabric: str) -> dict[str, str]:
        """gloo and Open MPI bind one address per host: the host's fabric address on the
        optical circuits (rack.py routes it over them), its electrical NIC on the rack."""
        ifname = self.bench.electrical.interface if fabric == "electrical" else FABRIC_IFNAME
        return {"GLOO_SOCKET_IFNAME": ifname, "OMPI_MCA_btl_tcp_if_include": ifname}

    def job_argv(self, job, ranks: list[str]) -> list[str]:
        if self._torch_job():
            return self.torch_job_argv(job, ranks)
        return self.ring_job_argv(job, ranks)

    def torch_job_argv(self, job, ranks: list[str]) -> list[str]:
        """The PyTorch job as a lab launches its own: torchrun on every host of the rank map,
        its static rendezvous at rank 0's host on the management network (failing after the
        job's NCCL timeout when a node never comes), no restarts of its own (the controller
        restarts the job)."""
        scale = self.world.time_scale
        # LOGLEVEL=INFO: torchrun says when its rendezvous completes (the agent reads that line)
        return ["env", "LOGLEVEL=INFO", sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(ranks)),
                "--node-rank", "{rank}",
                "--nproc-per-node", "1", "--master-addr", "{master_addr}", "--master-port", "{master_port}",
                "--max-restarts", "0", "--rdzv-conf", f"timeout={max(1, round(job.nccl_timeout_s * scale))}",
                # SIGTERM is not torchrun's to handle: the agent's stop ends it at once, as a scheduler's
                # kill does, and its workers die with it (torch_job.py; torchrun's own forward, wait
                # and report took 2.6 s, counted as the controller's)
                "--signals-to-handle", "SIGINT",
                # its own logs in the run's folder (left to itself, each launch leaves a torchelastic_* in /tmp)
                "--log-dir", str(self._run_dir / "torchrun"),
                "-m", "lumion_hil.instruments.emulators.torch_job", "--world", self._world_address(),
                "--ranks", ",".join(ranks),
                "--gradient-bytes", str(int(job.gradient_bytes * self.settings.rate_scale * scale)),
                "--compute-time-s", str(job.compute_time_s), "--batch", str(job.batch_per_rank),
                "--timeout-s", str(job.nccl_timeout_s), "--checkpoint-dir", str(self._run_dir / "checkpoints"),
                "--checkpoint-every", str(self.settings.checkpoint_every)]

    def ring_job_argv(self, job, ranks: list[str]) -> list[str]:
        """The real training job: compute emulated, its all-reduce real bytes over real sockets."""
        return [sys.executable, "-m", "lumion_hil.instruments.emulators.ring_job", "--world", self._world_address(),
                "--ranks", ",".join(ranks), "--rank", "{rank}", "--master-addr", "{master_addr}",
                "--master-port", "{master_port}",
                # a buffer that takes, at the shaped rates, what the gradients take at the bench file's
                # (and at its time scale: a tenth of the time, a tenth of the bytes)
                "--gradient-bytes", str(int(job.gradient_bytes * self.settings.rate_scale * self.world.time_scale)),
                "--compute-time-s", str(job.compute_time_s), "--batch", str(job.batch_per_rank),
                "--nccl-timeout-s", str(job.nccl_timeout_s)]

    def nccl_tests_folder(self, host, library: str = "ring") -> str | None:
        if library not in FOLDERS:
            raise ValueError(f"no {library!r} bandwidth tests on the namespaced bench; it has {', '.join(FOLDERS)}")
        return str(self._run_dir / FOLDERS[library])

    def local_address(self, host) -> bool:
        return False

    def master_address(self, host) -> str:
        return self._rack.mgmt_address(host.name)

    def _write_rack_map(self) -> None:
        """What the nccl-tests programs on the hosts need: each host's ssh destination, the
        launcher's ssh configuration, the rendezvous port."""
        job_port = self.bench.job.master_port if self.bench.job is not None else 29500
        rack_map = {"hosts": {h.name: self.destination(h.name) for h in self.bench.topology.hosts},
                    "mgmt": {h.name: self._rack.mgmt_address(h.name) for h in self.bench.topology.hosts},
                    "ssh_config": str(self._keys.config), "port": job_port + PERF_PORT_OFFSET,
                    "python": sys.executable, "run_dir": str(self._run_dir)}
        path = self._run_dir / "rack.json"
        path.write_text(json.dumps(rack_map, indent=1), encoding="utf-8")
        for library, name in FOLDERS.items():
            folder = self._run_dir / name
            folder.mkdir(exist_ok=True)
            for program in PROGRAMS:
                script = folder / program
                script.write_text(f"#!/bin/sh\nexec {sys.executable} -m lumion_hil.instruments.emulators.netns_perf"
                                  f" nccl-tests --rack {path} --library {library} --program {program} \"$@\"\n",
                                  encoding="utf-8")
                script.chmod(0o755)

    # -- faults --------------------------------------------------------------------------------

    def set_fault(self, part: str, fault: str) -> None:
        """A host's faults are made for real here: ``drop`` ends its agent's ssh session,
        ``power_loss=S`` kills every process in its namespace (its sshd too) for S seconds
        (default 1), ``mgmt_kbit=R`` shapes its management link to R kbit/s (replies queue:
        a slow agent link). Instruments' faults are the emulated bench's."""
        if part not in self.sshd:
            return super().set_fault(part, fault)
        name, _, value = fault.partition("=")
        if name == "drop":
            self.sshd[part].kill_sessions()
        elif name == "power_loss":
            self._rack.kill_processes(part)
            self.sshd[part].stop()
            timer = threading.Timer(float(value) if value else 1.0, self.sshd[part].start)
            timer.daemon = True
            self._power_timers.append(timer)
            timer.start()
        elif name == "mgmt_kbit":
            self._rack.slow_mgmt(part, float(value) if value else None)
        else:
            known = ", ".join(("drop", "power_loss", "mgmt_kbit"))
            hint = f" (an emulated agent's fault: {', '.join(AGENT_FAULTS)}; set it through the agent)" \
                if name in AGENT_FAULTS else ""
            raise ValueError(f"{part}: unknown host fault {name!r} on the namespaced bench; known: {known}{hint}")

    def clear_faults(self, part: str) -> None:
        if part not in self.sshd:
            return super().clear_faults(part)
        self._rack.slow_mgmt(part, None)
        if not self.sshd[part].alive:
            self.sshd[part].start()

    # -- the cost model for the rates shaped here -----------------------------------------------

    def fabric(self, kind: str, ranks: list[str]) -> Fabric:
        """The fabric the cost model (instruments/collectives.py) sees for the rates shaped on
        this rack now, in Gb/s: the circuits lit now, or the electrical racks and their uplinks
        (as ``scale_uplinks`` left them)."""
        scale = self.settings.rate_scale
        if kind == "electrical":
            rack = self.bench.electrical
            uplinks: dict[str, float | None] = dict(uplink_mbit(self.bench))  # the bench file's, as the rack is built
            if self.rack is not None:  # as shaped now: one rate, or rack -> rate (None, or a rack left out: unshaped)
                shaped = self.rack.uplink_mbit
                uplinks = {name: shaped.get(name) if isinstance(shaped, dict) else shaped for name in uplinks}
            return rack_fabric(ranks, rack.nic_gbps.value * scale, rack.hop_latency_us.value, 1.0, rack.rack_of,
                               uplink_gbps={name: math.inf if mbit is None else mbit / 1000
                                            for name, mbit in uplinks.items()})
        net = self.world.optical_fabric()
        return Fabric({key: Link(link.capacity_gbps * scale, link.latency_us) for key, link in net.links.items()},
                      net.route)

    def predicted_busbw_gbps(self, collective: str, ranks: list[str], size_bytes: int, kind: str) -> float:
        """busbw (GB/s, as nccl-tests prints it) the cost model predicts for the shaped rates."""
        settings = self.bench.collectives
        cost = collective_cost(collective, ranks, size_bytes, self.fabric(kind, ranks),
                               step_latency_us=settings.step_latency_us.value, rings=settings.rings)
        return size_bytes / cost.time_s / 1e9 * bus_factor(collective, len(ranks))


def rack_spec(bench) -> RackSpec:
    """The rack the bench file describes, at ``netns.rate_scale`` of its rates."""
    scale = bench.netns.rate_scale
    rack = bench.electrical
    hosts = []
    for host in bench.topology.hosts:
        nics = [RackNic(host.name, nic.name, nic.interface or nic.name,
                        nic.rate_gbps * 1000 * scale * host.emulation.link_rate_factor) for nic in host.nics]
        hosts.append(RackHost(host.name, nics, rack=rack.rack_of(host.name) if rack else "rack0",
                              electrical_ifname=rack.interface if rack else None))
    return RackSpec(hosts, electrical_mbit=rack.nic_gbps.value * 1000 * scale if rack else None,
                    uplink_mbit=uplink_mbit(bench) if rack else None)


def uplink_mbit(bench) -> dict[str, float]:
    """Each rack's uplink to the spine, shaped: its servers' NIC rates over the
    oversubscription ratio (2:1: half), times ``netns.rate_scale``."""
    rack = bench.electrical
    members: dict[str, int] = {}
    for host in bench.topology.hosts:
        members[rack.rack_of(host.name)] = members.get(rack.rack_of(host.name), 0) + 1
    return {name: count * rack.nic_gbps.value * 1000 * bench.netns.rate_scale / rack.oversubscription.value
            for name, count in members.items()}
