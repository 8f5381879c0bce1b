"""nccl-tests output: text (any version seen: with or without a root column, #wrong or an old
error column, us or ms units, a trailing #iters column and test name) and the JSON that
``-J FILE`` writes. Garbage is rejected with the line and the reason.

algbw = bytes / time; busbw for all-reduce = algbw * 2(n-1)/n (the tests print both).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any


class NcclParseError(ValueError):
    def __init__(self, source: str, reason: str, line: int | None = None):
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {reason}")


@dataclass
class Perf:
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: float | None  # wrong elements; None when checking was off ("N/A")


@dataclass
class Row:
    size_bytes: int
    count: int
    type: str
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def max_busbw_gbps(self) -> float:
        return max((p.busbw_gbps for r in self.rows for p in (r.out_of_place, r.in_place) if p), default=0.0)

    @property
    def total_wrong(self) -> float | None:
        counts = [p.wrong for r in self.rows for p in (r.out_of_place, r.in_place) if p]
        return None if any(c is None for c in counts) else sum(counts)


def parse(text: str, source: str = "<nccl-tests output>") -> NcclResult:
    stripped = text.lstrip()
    if stripped.startswith("{"):
        return parse_json(stripped, source)
    return parse_text(text, source)


_TIME_COLUMNS = ("time", "cputime")


def parse_text(text: str, source: str = "<nccl-tests output>") -> NcclResult:
    lines = text.splitlines()
    header_at = next((i for i, line in enumerate(lines) if line.startswith("#")
                      and {"size", "count", "algbw", "busbw"} <= set(line[1:].split())), None)
    if header_at is None:
        raise NcclParseError(source, "no column header (# size count type ... algbw busbw) found")
    columns = lines[header_at][1:].split()
    units = lines[header_at + 1][1:].split() if header_at + 1 < len(lines) and lines[header_at + 1].startswith("#") else []
    unit = next((u.strip("()") for u in units if u in ("(us)", "(ms)")), None)
    if unit is None:
        raise NcclParseError(source, "no units row with (us) or (ms) under the column header", header_at + 2)
    scale = 1000.0 if unit == "ms" else 1.0
    try:
        first_time = next(i for i, c in enumerate(columns) if c in _TIME_COLUMNS)
    except StopIteration:
        raise NcclParseError(source, "the column header has no time column", header_at + 1) from None
    lead = columns[:first_time]
    groups = [i for i, c in enumerate(columns) if c in _TIME_COLUMNS]
    rows: list[Row] = []
    avg = oob = None
    devices = [line[1:].strip() for line in lines[:header_at] if re.match(r"#\s+Rank\s+\d+", line)]
    for n, line in enumerate(lines[header_at + 2:], start=header_at + 3):
        if not line.strip():
            continue
        if line.startswith("#"):
            m = re.match(r"#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)", line)
            if m:
                avg = float(m.group(1))
            m = re.match(r"#\s*Out of bounds values\s*:\s*(\d+)", line)
            if m:
                oob = int(m.group(1))
            continue
        tokens = line.split()
        if not tokens[0].isdigit():
            continue  # a warning or log line between rows (NCCL INFO ...)
        if len(tokens) < len(columns) - (1 if columns[-1] == "#iters" else 0):
            raise NcclParseError(source, f"expected {len(columns)} columns, found {len(tokens)}", n)
        try:
            values = dict(zip(lead, tokens))
            perfs = [_perf(tokens[g:g + 4], columns[g + 3], scale) for g in groups]
            rows.append(Row(int(values["size"]), int(values["count"]), values.get("type", "?"), values.get("redop"),
                            int(values["root"]) if "root" in values else None, perfs[0], perfs[1] if len(perfs) > 1 else None))
        except (ValueError, KeyError, IndexError) as exc:
            raise NcclParseError(source, f"not a result row ({exc})", n) from None
    if not rows:
        raise NcclParseError(source, "no result rows under the column header")
    return NcclResult(rows, avg, oob, unit, "text", devices)


def _perf(tokens: list[str], wrong_column: str, scale: float) -> Perf:
    time, algbw, busbw, wrong = tokens
    return Perf(float(time) * scale, float(algbw), float(busbw),
                None if wrong == "N/A" else float(wrong))


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
    return NcclResult(rows, avg_value, oob, "us", "json", devices)


def _json_perf(p: dict | None) -> Perf | None:
    if p is None:
        return None
    time = p.get("time", p.get("cpu_time"))
    return Perf(float(time), float(p["alg_bw"]), float(p["bus_bw"]),
                None if p.get("nwrong") is None else float(p["nwrong"]))


def bus_bandwidth_factor(collective: str, ranks: int) -> float:
    """busbw / algbw for each collective, as nccl-tests computes it."""
    n = ranks
    if collective in ("all_reduce",):
        return 2 * (n - 1) / n
    if collective in ("reduce_scatter", "all_gather", "alltoall", "all_to_all"):
        return (n - 1) / n
    return 1.0
