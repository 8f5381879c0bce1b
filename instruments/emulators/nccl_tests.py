"""Emulated nccl-tests: ``all_reduce_perf`` and its siblings, with the real programs' flags and
output (text, and JSON with ``-J``), their figures taken from the world's current circuits (or
its electrical rack) through the collective cost model, with the latency of small messages and
a little noise. Each size really takes its time (warm-up plus iterations, in and out of place,
at the bench's time scale), so a sweep lasts as long as it would; the times and bandwidths it
prints are the fabric's own (physical), the same at every time scale.

The emulated bench puts one executable per collective on the emulated hosts' PATH (see
:func:`install`); they run this module. The ranks come from ``LUMION_HIL_RANKS`` (what ``mpirun
-H`` would say on a bench), the fabric from ``NCCL_SOCKET_IFNAME`` as NCCL would take it.

Output follows nccl-tests 2.17 (src/common.cu, src/util.cu): the version line, "Collective
test starting", the parameters line, the devices, the column header and units row, one row per
size, "Out of bounds values", "Avg bus bandwidth", "Collective test concluded". That formatting
(:class:`Report`) and the flags are shared with lumion-hil's real ring over sockets
(ring_perf.py)."""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

from lumion_hil.instruments.collectives import bus_factor
from lumion_hil.instruments.emulators.world_client import WorldClient

PROGRAMS = {"all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather",
            "reduce_scatter_perf": "reduce_scatter", "broadcast_perf": "broadcast", "reduce_perf": "reduce",
            "alltoall_perf": "alltoall"}
_TYPES = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "half": 2, "float16": 2,
          "float": 4, "float32": 4, "double": 8, "float64": 8, "bfloat16": 2}
_REDUCTIONS = ("sum", "prod", "max", "min", "avg")
NOISE = 0.01  # relative spread of the times printed (assumption: a quiet machine)


def _size(text: str) -> int:
    """nccl-tests' size syntax: 8, 1K, 128M, 2G (powers of 1024)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    text = text.strip().upper()
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def parser_for(program: str, *, emulated: bool = True) -> argparse.ArgumentParser:
    """nccl-tests' flags (src/common.cu); ``emulated`` adds the world's address (required)."""
    kind = "emulated" if emulated else "lumion-hil ring"
    p = argparse.ArgumentParser(prog=program, description=f"{kind} {program} (nccl-tests)")
    p.add_argument("-t", "--nthreads", type=int, default=1)
    p.add_argument("-g", "--ngpus", type=int, default=1)
    p.add_argument("-b", "--minbytes", type=_size, default=32 << 20)
    p.add_argument("-e", "--maxbytes", type=_size, default=32 << 20)
    p.add_argument("-i", "--stepbytes", type=_size, default=1 << 20)
    p.add_argument("-f", "--stepfactor", type=int, default=1)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup_iters", type=int, default=5)
    p.add_argument("-m", "--agg_iters", type=int, default=1)
    p.add_argument("-c", "--check", type=int, default=1)
    p.add_argument("-o", "--op", default="sum")
    p.add_argument("-d", "--datatype", default="float")
    p.add_argument("-r", "--root", type=int, default=0)
    p.add_argument("-a", "--average", type=int, default=1)
    p.add_argument("-z", "--blocking", type=int, default=0)
    p.add_argument("-G", "--cudagraph", type=int, default=0)
    p.add_argument("-p", "--parallel_init", type=int, default=0)
    p.add_argument("-J", "--output_file", default=None, help="also write the results as JSON to this file")
    if emulated:
        p.add_argument("--world", required=True, help=argparse.SUPPRESS)
    p.add_argument("--program", default=program, help=argparse.SUPPRESS)
    return p


def program_name(argv: list[str], default: str = "all_reduce_perf") -> str:
    """The program a run stands for: ``--program NAME`` where given, else ``default``."""
    return next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--program"), default)


def sizes(args) -> list[int]:
    out, size = [], args.minbytes
    while size <= args.maxbytes:
        out.append(size)
        size = size * args.stepfactor if args.stepfactor > 1 else size + args.stepbytes
        if args.stepfactor <= 1 and args.stepbytes <= 0:
            break
    return out


def _time_text(us: float) -> str:
    return f"{us:7.0f}" if us >= 10000 else f"{us:7.1f}" if us >= 100 else f"{us:7.2f}"


def device_line(rank: int, pid: int, host: str, index: int, name: str, hex_id: str = "0x17") -> str:
    """One "# Using devices" line."""
    return f"#  Rank {rank:2d} Group  0 Pid {pid:6d} on {host:>10s} device {index:2d} [{hex_id}] {name}"


class Report:
    """One run's output as nccl-tests 2.17 prints it (src/common.cu, src/util.cu): the header,
    one row per size (out of place, then in place), the footer, and the JSON of ``-J``. Shared
    by the emulated programs and lumion-hil's ring (ring_perf.py); ``build`` says which in the
    version line."""

    def __init__(self, program: str, args, nranks: int, build: str, nccl_version: int = 22807):
        self.program, self.args, self.nranks, self.build, self.nccl_version = program, args, nranks, build, nccl_version
        self.collective = PROGRAMS[program]
        self.redop = args.op if self.collective in ("all_reduce", "reduce_scatter", "reduce") else "none"
        self.root = args.root if self.collective in ("broadcast", "reduce") else -1
        self.results: list[dict] = []
        self.busbws: list[float] = []
        self.wrong_total = 0

    def shape(self, size: int) -> tuple[int, int]:
        """(count, bytes) of the row for ``size``: nccl-tests counts one rank's share for the
        collectives whose buffers differ in size between input and output."""
        word = _TYPES[self.args.datatype]
        if self.collective in ("all_gather", "reduce_scatter", "alltoall"):
            count = size // word // self.nranks
            return count, count * word * self.nranks
        count = size // word
        return count, count * word

    def header(self, device_lines: list[str]) -> str:
        args = self.args
        step = args.stepfactor if args.stepfactor > 1 else args.stepbytes
        out = [f"# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library={self.nccl_version} ({self.build})",
               f"# Collective test starting: {self.program}",
               f"# nThread {args.nthreads} nGpus {args.ngpus} minBytes {args.minbytes} maxBytes {args.maxbytes} "
               f"step: {step}({'factor' if args.stepfactor > 1 else 'bytes'}) warmup iters: {args.warmup_iters} "
               f"iters: {args.iters} agg iters: {args.agg_iters} validation: {1 if args.check else 0} "
               f"graph: {args.cudagraph}",
               "#", "# Using devices", *device_lines]
        out += ["#", f"# {'':10s}  {'':12s}  {'':8s}  {'':6s}  {'':6s}           out-of-place                       in-place          ",
                f"# {'size':>10s}  {'count':>12s}  {'type':>8s}  {'redop':>6s}  {'root':>6s}  {'time':>7s}  {'algbw':>6s}  "
                f"{'busbw':>6s}  {'#wrong':>6s}  {'time':>7s}  {'algbw':>6s}  {'busbw':>6s}  {'#wrong':>6s}",
                f"# {'(B)':>10s}  {'(elements)':>12s}  {'':>8s}  {'':>6s}  {'':>6s}  {'(us)':>7s}  {'(GB/s)':>6s}  "
                f"{'(GB/s)':>6s}  {'':>6s}  {'(us)':>7s}  {'(GB/s)':>6s}  {'(GB/s)':>6s}  {'':>6s}"]
        return "\n".join(out)

    def row(self, nbytes: int, count: int, places: list[tuple[float, int | None]]) -> str:
        """The row for one size from (seconds per operation, wrong elements or None when not
        checked) out of place and in place; algbw = bytes / time, busbw = algbw x bus_factor."""
        row = {"size": nbytes, "count": count, "type": self.args.datatype, "redop": self.redop,
               "root": f"{self.root:6d}"}
        line = f"{nbytes:12d}  {count:12d}  {self.args.datatype:>8s}  {self.redop:>6s}  {self.root:6d}"
        for place, (seconds, wrong) in zip(("out_of_place", "in_place"), places):
            algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
            busbw = algbw * bus_factor(self.collective, self.nranks)
            self.wrong_total += wrong or 0
            line += f"  {_time_text(seconds * 1e6)}  {algbw:6.2f}  {busbw:6.2f}  " + (f"{wrong:6d}" if wrong is not None else "   N/A")
            row[place] = {"time": seconds * 1e6, "alg_bw": algbw, "bus_bw": busbw, "nwrong": wrong,
                          "side_comp_bw": None, "estimated_time": None}
            self.busbws.append(busbw)
        self.results.append(row)
        return line

    @property
    def average_busbw(self) -> float:
        return sum(self.busbws) / len(self.busbws) if self.busbws else 0.0

    def footer(self) -> str:
        return "\n".join([f"# Out of bounds values : {self.wrong_total} {'FAILED' if self.wrong_total else 'OK'}",
                          f"# Avg bus bandwidth    : {self.average_busbw:g} ",
                          "#",
                          f"# Collective test concluded: {self.program}",
                          "#"])

    def document(self, argv: list[str], devices: list[dict]) -> dict:
        """What ``-J FILE`` writes; ``devices`` as its config lists them (rank, hostname, ...)."""
        args = self.args
        return {"args": [self.program, *argv], "nccl_version": self.nccl_version,
                "config": {"nthreads": args.nthreads, "ngpus": args.ngpus, "minimum_bytes": args.minbytes,
                           "maximum_bytes": args.maxbytes, "step_factor": args.stepfactor,
                           "warmup_iters": args.warmup_iters, "iterations": args.iters,
                           "aggregated_iterations": args.agg_iters, "validation": 1 if args.check else 0,
                           "graph": args.cudagraph, "blocking_collectives": bool(args.blocking),
                           "parallel_init": bool(args.parallel_init), "devices": devices},
                "results": self.results, "out_of_bounds": {"count": self.wrong_total, "okay": self.wrong_total == 0},
                "average_bus_bandwidith": {"bandwidith": self.average_busbw, "okay": "unchecked"}, "errors": []}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    program = program_name(argv)
    if program not in PROGRAMS:
        print(f"{program}: no such emulated nccl-tests program; known: {', '.join(PROGRAMS)}", file=sys.stderr)
        return 2
    args = parser_for(program).parse_args(argv)
    collective = PROGRAMS[program]
    if args.datatype not in _TYPES:
        print(f"Invalid datatype '{args.datatype}'", file=sys.stderr)
        return 1
    if args.op not in _REDUCTIONS:
        print(f"Invalid reduction op '{args.op}'", file=sys.stderr)
        return 1
    ranks = [r for r in os.environ.get("LUMION_HIL_RANKS", "").split(",") if r]
    if not ranks:
        print(f"{program}: LUMION_HIL_RANKS names no hosts (the emulated launcher sets it)", file=sys.stderr)
        return 2
    world = WorldClient(args.world)
    ifname = os.environ.get("NCCL_SOCKET_IFNAME")
    rng = random.Random(int(os.environ.get("LUMION_HIL_SEED", "1")) + len(ranks))
    report = Report(program, args, len(ranks), "emulated by lumion-hil")

    gpus = {h: world.call("gpus", host=h) for h in set(ranks)}
    lines = []
    for rank, host in enumerate(ranks):
        gpu = (gpus.get(host) or [{"name": "emulated GPU", "index": 0}])[0]
        lines.append(device_line(rank, os.getpid(), host, gpu["index"], gpu["name"]))
    print(report.header(lines), flush=True)

    for size in sizes(args):
        count, nbytes = report.shape(size)
        places = []
        for _place in ("out_of_place", "in_place"):
            while True:
                cost = world.call("collective", collective=collective, ranks=ranks, size_bytes=nbytes, socket_ifname=ifname)
                if cost["time_s"] is not None:
                    break
                print(f"{ranks[0]}:{os.getpid()}:{os.getpid()} [0] NCCL WARN waiting: {cost['stalled']}", file=sys.stderr,
                      flush=True)
                world.call("wait_change", timeout_s=1.0)  # NCCL waits on a peer that does not answer
            time.sleep(cost["time_s"] * (args.warmup_iters + args.iters) * args.agg_iters)  # at the time scale
            seconds = cost["physical_s"] * max(0.2, 1 + rng.gauss(0.0, NOISE))  # reported as the real fabric's
            places.append((seconds, (count if cost.get("corrupt") else 0) if args.check else None))
        print(report.row(nbytes, count, places), flush=True)
    print(report.footer(), flush=True)
    if args.output_file:
        devices = [{"rank": r, "group": 0, "pid": os.getpid(), "hostname": h, "device": 0, "device_hex": "0x17",
                    "device_info": (gpus.get(h) or [{"name": ""}])[0]["name"]} for r, h in enumerate(ranks)]
        Path(args.output_file).write_text(json.dumps(report.document(argv, devices)), encoding="utf-8")
    return 1 if report.wrong_total else 0


def install(folder: Path, world_address: str) -> Path:
    """Put one executable per program in ``folder``, each running this module against the world
    at ``world_address``: what an emulated host has where a real one has its build/ folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for program in PROGRAMS:
        script = folder / program
        script.write_text(f"#!/bin/sh\nexec {sys.executable} -m lumion_hil.instruments.emulators.nccl_tests "
                          f"--world {world_address} --program {program} \"$@\"\n", encoding="utf-8")
        script.chmod(0o755)
    return folder


if __name__ == "__main__":
    sys.exit(main())
