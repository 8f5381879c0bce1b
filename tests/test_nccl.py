"""The nccl-tests parser on real output shapes and on broken ones, and its command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from instruments.gpu_host.nccl import NcclParseError, bus_bandwidth_factor, parse

OUT = Path(__file__).resolve().parent / "nccl_outputs"


def test_current_text_two_ranks():
    r = parse((OUT / "new-us-2gpu.txt").read_text())
    assert r.format == "text" and r.source_time_unit == "us" and len(r.devices) == 2
    assert [row.size_bytes for row in r.rows] == [8, 1024, 1048576, 134217728]
    last = r.rows[-1]
    assert last.type == "float" and last.redop == "sum" and last.root == -1
    assert last.out_of_place.time_us == 116004 and last.out_of_place.busbw_gbps == 1.16
    assert last.in_place.wrong == 0 and r.avg_busbw_gbps == 0.5645 and r.out_of_bounds == 0


def test_checking_off_is_none_not_zero_and_iters_column():
    r = parse((OUT / "unchecked-iters.txt").read_text())
    assert all(row.out_of_place.wrong is None for row in r.rows) and r.total_wrong is None
    assert r.rows[2].in_place.busbw_gbps == 140.44 and len(r.devices) == 4
    assert r.max_busbw_gbps == 140.44


def test_old_format_in_milliseconds_without_root():
    r = parse((OUT / "old-ms-noroot.txt").read_text())
    assert r.source_time_unit == "ms"
    assert r.rows[0].root is None
    assert r.rows[2].out_of_place.time_us == pytest.approx(52.0)  # 0.052 ms
    assert r.rows[2].out_of_place.wrong == 0.0


def test_log_lines_between_rows_are_skipped():
    r = parse((OUT / "alltoall-with-noise.txt").read_text())
    assert [row.redop for row in r.rows] == ["none", "none"]


def test_json_output():
    r = parse((OUT / "new.json").read_text())
    assert r.format == "json" and len(r.rows) == 2 and r.rows[0].root == -1
    assert r.rows[1].out_of_place.wrong is None and r.rows[0].in_place.time_us == 27.9
    assert r.avg_busbw_gbps == 0.015 and r.out_of_bounds == 0
    assert r.devices[0].startswith("Rank 0 on host0")


@pytest.mark.parametrize("name,reason", [
    ("broken-garbage.txt", "no column header"),
    ("broken-truncated.txt", "expected 13 columns, found 7"),
    ("broken-no-units.txt", "no units row"),
    ("broken-nonnumeric.txt", "not a result row"),
    ("broken-empty.json", "'results' list is empty"),
    ("broken-cut.json", "not valid JSON"),
])
def test_broken_outputs_are_rejected_with_the_reason(name, reason):
    with pytest.raises(NcclParseError, match=reason):
        parse((OUT / name).read_text(), name)


def test_bus_bandwidth_factors():
    assert bus_bandwidth_factor("all_reduce", 4) == 1.5
    assert bus_bandwidth_factor("all_gather", 4) == 0.75
    assert bus_bandwidth_factor("broadcast", 4) == 1.0


def test_cli_prints_json_and_names_broken_files():
    ok = subprocess.run([sys.executable, "-m", "harness", "nccl", "parse", str(OUT / "new-us-2gpu.txt")],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0
    data = json.loads(ok.stdout)
    assert data["rows"][1]["out_of_place"]["algbw_gbps"] == 0.03 and data["avg_busbw_gbps"] == 0.5645
    bad = subprocess.run([sys.executable, "-m", "harness", "nccl", "parse", str(OUT / "broken-truncated.txt")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "broken-truncated.txt:3: expected 13 columns" in bad.stderr
