"""nccl-tests output, as labs really have it: the text of every vintage (a root column or none,
``#wrong`` counts or an old ``error`` magnitude, us or ms, a trailing ``#iters`` column, empty
fields), with launcher prefixes (Slurm ``--label``'s ``0: ``, Open MPI ``--tag-output``'s
``[1,0]<stdout>:``, with or without a launcher's own prefix before it such as SkyPilot's
``(head, rank=0, pid=3808)``), NCCL INFO/WARN and MPI lines anywhere, inside Markdown or indented, several
tests in one log (several runs, never merged); and the JSON that ``-J FILE`` writes. Garbage is
rejected with the line and the reason.

algbw = bytes / time; busbw = algbw x the collective's factor (:func:`bus_bandwidth_factor`).
The bandwidths are the log's own (nccl-tests computes them from the unrounded time), except
where it printed 0.00: there they come from the printed time, and ``Perf.bandwidth_from`` says so.
Below 1 GB/s a busbw with more digits, from the time, stands beside the printed one where it
rounds to it (``Perf.busbw_from_time_gbps``); the harness judges by it (``busbw_best_gbps``).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall", "scatter",
               "gather", "sendrecv", "hypercube")


class NcclParseError(ValueError):
    def __init__(self, source: str, reason: str, line: int | None = None):
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {reason}")


@dataclass
class Perf:
    time_us: float
    algbw_gbps: float  # GB/s, as the tests print it
    busbw_gbps: float
    wrong: int | None  # elements found wrong (#wrong); None when checking was off (N/A) or not counted
    error: float | None = None  # old versions: the largest error magnitude instead of a count
    # Where algbw and busbw come from: "printed" (the log's own figures, computed by nccl-tests
    # from the unrounded time) or "time" (the log printed 0.00: size / the printed time instead).
    bandwidth_from: str = "printed"
    # Below 1 GB/s the two printed decimals keep one or two digits (a shaped fabric's 0.02),
    # while the time column keeps more: busbw from the size and the printed time, given only
    # where it rounds to the printed figure (it never contradicts the log); None elsewhere.
    busbw_from_time_gbps: float | None = None

    @property
    def busbw_best_gbps(self) -> float:
        """The busbw to judge by: the one from the time where the log's rounding would hide its
        digits, else the log's own."""
        return self.busbw_from_time_gbps if self.busbw_from_time_gbps is not None else self.busbw_gbps


@dataclass
class Row:
    size_bytes: int
    count: int
    type: str | None
    redop: str | None
    root: int | None
    out_of_place: Perf | None
    in_place: Perf | None


@dataclass
class NcclResult:
    rows: list[Row]
    avg_busbw_gbps: float | None
    out_of_bounds: int | None
    source_time_unit: str
    format: str  # "text" or "json"
    devices: list[str] = field(default_factory=list)
    collective: str | None = None  # all_reduce, all_gather, ... where the log says
    launcher: str | None = None  # "slurm", "openmpi", "worker" (a SkyPilot / Ray prefix alone), or None
    first_line: int | None = None  # where the run's column header is in the log

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def ranks(self) -> int | None:
        return len(self.devices) or None

    @property
    def max_busbw_gbps(self) -> float:
        return max((p.busbw_gbps for r in self.rows for p in (r.out_of_place, r.in_place) if p), default=0.0)

    @property
    def total_wrong(self) -> int | None:
        """Wrong elements over every row; None when any row was not checked (N/A or error magnitude)."""
        counts = [p.wrong for r in self.rows for p in (r.out_of_place, r.in_place) if p]
        return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)

    def busbw_by_size(self, place: str = "out_of_place") -> dict[int, float]:
        return {r.size_bytes: getattr(r, place).busbw_best_gbps for r in self.rows if getattr(r, place) is not None}


# --- text -------------------------------------------------------------------------------------------

# Open MPI's --tag-output, after whatever a launcher above it put first (SkyPilot and Ray write
# "(head, rank=0, pid=3808) " before it): everything up to the tag is the launchers'.
_OPENMPI = re.compile(r"^.*?\[\d+,\d+\]<std(?:out|err)>:")
_SLURM = re.compile(r"^\s*\d+:\s")
_WORKER = re.compile(r"^\s*\([^()]*\bpid=\d+[^()]*\)\s")  # a SkyPilot / Ray worker's prefix alone
_STARTING = re.compile(r"#\s*Collective test starting:\s*(\S+)")
_COMMAND = re.compile(r"\b(" + "|".join(COLLECTIVES) + r")_perf\b")
_TIME_COLUMNS = ("time", "cputime")
_WRONG_COLUMNS = ("#wrong", "error")


def _strip_launcher(line: str) -> tuple[str, str | None]:
    m = _OPENMPI.match(line)
    if m:
        return line[m.end():], "openmpi"
    m = _SLURM.match(line)
    if m:
        return line[m.end():], "slurm"
    m = _WORKER.match(line)
    if m:
        return _strip_launcher(line[m.end():])[0], "worker"
    return line, None


def parse(text: str, source: str = "<nccl-tests output>") -> NcclResult:
    """The one run in ``text`` (text or JSON). A log with several runs is refused: use
    :func:`parse_runs`, which keeps them apart."""
    runs = parse_runs(text, source)
    if len(runs) != 1:
        raise NcclParseError(source, f"{len(runs)} runs in one log (lines {', '.join(str(r.first_line) for r in runs)}); "
                             "read them with parse_runs, one result each")
    return runs[0]


def parse_runs(text: str, source: str = "<nccl-tests output>") -> list[NcclResult]:
    """Every run in a log, in order."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        return [parse_json(stripped, source)]
    return _parse_text(text, source)


class _Run:
    def __init__(self, header: str, header_at: int, launcher: str | None, collective: str | None,
                 devices: list[str], source: str):
        bare = header.replace("#", " ", 1)
        self.columns = bare.split()
        # Each column's right edge: nccl-tests right-aligns headers and values alike (printf widths).
        self.edges = [m.end() for m in re.finditer(r"\S+", bare)]
        self.header_at, self.launcher, self.collective, self.devices = header_at, launcher, collective, devices
        self.source = source
        self.unit: str | None = None
        self.rows: list[Row] = []
        self.avg: float | None = None
        self.oob: int | None = None
        self.closed = False
        times = [i for i, c in enumerate(self.columns) if c in _TIME_COLUMNS]
        if not times:
            raise NcclParseError(source, "the column header has no time column", header_at)
        self.groups = times
        self.lead = self.columns[:times[0]]

    def result(self) -> NcclResult:
        if not self.rows:
            raise NcclParseError(self.source, "no result rows under the column header", self.header_at)
        known = bus_bandwidth_factor(self.collective, len(self.devices)) if self.collective and self.devices else None
        _refine(self.rows, known)
        return NcclResult(self.rows, self.avg, self.oob, self.unit or "us", "text", self.devices, self.collective,
                          self.launcher, self.header_at)

    def fields(self, line: str, n: int) -> list[str | None]:
        """The row's values by column. Tokens go to columns in order when every column has one;
        otherwise each token goes to the column whose right edge it ends at (an empty field)."""
        tokens = [(m.group(), m.end()) for m in re.finditer(r"\S+", line)]
        wanted = len(self.columns) - (1 if self.columns[-1] == "#iters" else 0)
        if len(tokens) >= wanted:
            return [t for t, _ in tokens[:len(self.columns)]] + [None] * max(0, len(self.columns) - len(tokens))
        placed: list[str | None] = [None] * len(self.columns)
        for token, end in tokens:
            best = min(range(len(self.edges)), key=lambda i: abs(self.edges[i] - end))
            if abs(self.edges[best] - end) > 2 or placed[best] is not None:
                raise NcclParseError(self.source, f"expected {wanted} columns, found {len(tokens)}", n)
            placed[best] = token
        missing = [self.columns[i] for i, v in enumerate(placed) if v is None and self.columns[i] not in ("redop", "type", "#iters")]
        if missing:
            raise NcclParseError(self.source, f"expected {wanted} columns, found {len(tokens)} (no {', '.join(missing)})", n)
        return placed

    def add_row(self, line: str, n: int) -> None:
        values = self.fields(line, n)
        by_name = dict(zip(self.lead, values))
        scale = 1000.0 if self.unit == "ms" else 1.0
        try:
            perfs = [_perf(values[g:g + 4], self.columns[g + 3], scale) for g in self.groups]
            root = by_name.get("root")
            size, count = by_name["size"], by_name["count"]
            if size is None or count is None:
                raise ValueError("the size or count column is empty")
            self.rows.append(Row(int(size), int(count), by_name.get("type"),
                                 by_name.get("redop"), int(root) if root is not None else None,
                                 perfs[0], perfs[1] if len(perfs) > 1 else None))
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise NcclParseError(self.source, f"not a result row ({exc})", n) from None


def _parse_text(text: str, source: str) -> list[NcclResult]:
    runs: list[_Run] = []
    current: _Run | None = None
    collective: str | None = None
    devices: list[str] = []
    pending_units_for: _Run | None = None
    for n, raw in enumerate(text.splitlines(), start=1):
        line, launcher = _strip_launcher(raw)
        content = line.strip()
        if not content:
            continue
        m = _STARTING.search(content)
        if m:
            collective = _collective_name(m.group(1))
            devices = []
            current = None
            continue
        if content.startswith("#"):
            body = content[1:].split()
            if {"size", "count", "algbw", "busbw"} <= set(body):
                if current is not None and not current.rows and not current.closed:
                    runs.pop()  # a header repeated before any row: the later one stands
                current = _Run(line, n, launcher, collective, devices, source)
                runs.append(current)
                pending_units_for = current
                continue
            if pending_units_for is not None:
                units = [u.strip("()") for u in body if u in ("(us)", "(ms)")]
                pending_units_for = None
                if units:
                    assert current is not None  # the run whose column header this row is under
                    current.unit = units[0]
                    continue
                raise NcclParseError(source, "no units row with (us) or (ms) under the column header", n)
            if re.match(r"#\s*nThread\b", content):
                if current is not None:
                    current.closed = True
                current, devices = None, []
                continue
            if re.match(r"#\s+Rank\s+\d+", content):
                devices.append(content[1:].strip())
                continue
            if current is not None:
                avg = re.match(r"#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)", content)
                if avg:
                    current.avg = float(avg.group(1))
                    current.closed = True
                oob = re.match(r"#\s*Out of bounds values\s*:\s*(\d+)", content)
                if oob:
                    current.oob = int(oob.group(1))
            continue
        if pending_units_for is not None:
            pending_units_for = None
            raise NcclParseError(source, "no units row with (us) or (ms) under the column header", n)
        command = _COMMAND.search(content)
        if command and not content[0].isdigit():
            collective = command.group(1)  # the command line that ran the test
            continue
        if current is None or current.closed or not content[0].isdigit() or set(content) <= {"."}:
            continue  # log lines, MPI help, NCCL INFO/WARN, an elided stretch ("...")
        first = content.split()[0]
        if not first.isdigit():
            continue  # a host:pid:tid NCCL log line, not a row
        current.add_row(line, n)
    if not runs:
        raise NcclParseError(source, "no column header (# size count type ... algbw busbw) found")
    return [run.result() for run in runs]


def _collective_name(program: str) -> str:
    name = program.rsplit("/", 1)[-1].removesuffix("_perf").removesuffix("_perf_mpi")
    return name


def _perf(tokens: list[str | None], wrong_column: str, scale: float) -> Perf:
    time, algbw, busbw, wrong = tokens
    if time is None or algbw is None or busbw is None:
        raise ValueError("a time or bandwidth column is empty")
    if wrong_column == "error":  # old versions: the largest error, not a count
        return Perf(float(time) * scale, float(algbw), float(busbw), None, None if wrong in (None, "N/A") else float(wrong))
    if wrong in (None, "N/A"):
        return Perf(float(time) * scale, float(algbw), float(busbw), None)
    count = float(wrong)
    if count != int(count) or count < 0:
        raise ValueError(f"#wrong is a count of elements, not {wrong!r}")
    return Perf(float(time) * scale, float(algbw), float(busbw), int(count))


# --- JSON (-J) --------------------------------------------------------------------------------------


def parse_json(text: str, source: str = "<nccl-tests json>") -> NcclResult:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NcclParseError(source, f"not valid JSON: {exc.msg}", exc.lineno) from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise NcclParseError(source, "JSON without a 'results' list (not nccl-tests -J output)")
    rows = []
    for i, r in enumerate(data["results"]):
        try:
            root = str(r.get("root", "")).strip()
            rows.append(Row(int(r["size"]), int(r["count"]), str(r["type"]), r.get("redop"),
                            int(root) if root.lstrip("-").isdigit() else None,
                            _json_perf(r.get("out_of_place")), _json_perf(r.get("in_place"))))
        except (KeyError, TypeError, ValueError) as exc:
            raise NcclParseError(source, f"results[{i}]: {exc!r}") from None
    if not rows:
        raise NcclParseError(source, "the 'results' list is empty")
    avg = (data.get("average_bus_bandwidith") or data.get("average_bus_bandwidth") or {})
    avg_value = avg.get("bandwidith", avg.get("bandwidth")) if isinstance(avg, dict) else None
    oob = (data.get("out_of_bounds") or {}).get("count")
    devices = [f"Rank {d.get('rank')} on {d.get('hostname')} device {d.get('device')} {d.get('device_info', '')}".strip()
               for d in (data.get("config", {}).get("devices") or data.get("devices") or [])]
    program = next((_COMMAND.search(a) for a in data.get("args", []) if isinstance(a, str) and _COMMAND.search(a)), None)
    return NcclResult(rows, avg_value, oob, "us", "json", devices, program.group(1) if program else None)


def _json_perf(p: dict | None) -> Perf | None:
    if p is None:
        return None
    time = p.get("time", p.get("cpu_time"))
    if time is None:
        raise ValueError("neither time nor cpu_time")
    wrong = p.get("nwrong")
    return Perf(float(time), float(p["alg_bw"]), float(p["bus_bw"]), None if wrong is None else int(wrong))


def _refine(rows: list[Row], factor: float | None) -> None:
    """nccl-tests prints GB/s with two decimals, computed from the unrounded time: that figure is
    kept wherever it says something. Where it printed 0.00 (below 5 MB/s: small messages, a
    shaped or stalled fabric) the bandwidths are taken from the size and the printed time, and
    say so. busbw / algbw is the collective's factor where the log names the collective and its
    ranks, else the ratio the log itself printed for its largest row."""
    if factor is None:
        printed = [p for r in rows for p in (r.out_of_place, r.in_place) if p and p.algbw_gbps > 0 and p.busbw_gbps > 0]
        largest = max(printed, key=lambda p: p.algbw_gbps, default=None)
        factor = largest.busbw_gbps / largest.algbw_gbps if largest else None
    for row in rows:
        for perf in (row.out_of_place, row.in_place):
            if perf is None or perf.time_us <= 0:
                continue
            algbw = row.size_bytes / perf.time_us / 1e3
            if perf.algbw_gbps != 0.0 or perf.busbw_gbps != 0.0:
                if factor is not None and 0 < perf.busbw_gbps < 1.0 and abs(algbw * factor - perf.busbw_gbps) < 0.005:
                    perf.busbw_from_time_gbps = algbw * factor  # more digits, the same figure to its rounding
                continue
            perf.algbw_gbps, perf.bandwidth_from = algbw, "time"
            if factor is not None:
                perf.busbw_gbps = algbw * factor


def bus_bandwidth_factor(collective: str, ranks: int) -> float:
    """busbw / algbw for each collective, as nccl-tests computes it (doc/PERFORMANCE.md)."""
    n = ranks
    if collective in ("all_reduce",):
        return 2 * (n - 1) / n
    if collective in ("reduce_scatter", "all_gather", "alltoall", "all_to_all", "scatter", "gather"):
        return (n - 1) / n
    return 1.0  # broadcast, reduce, sendrecv
