"""The nccl-tests parser on real output shapes and on broken ones, and its command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lumion_hil.instruments.gpu_host.nccl import NcclParseError, bus_bandwidth_factor, parse, parse_runs

OUT = Path(__file__).resolve().parent / "nccl_outputs"
PUBLISHED = OUT / "published"  # real outputs; SOURCES.md says where each came from


def test_current_text_two_ranks():
    r = parse((OUT / "new-us-2gpu.txt").read_text())
    assert r.format == "text" and r.source_time_unit == "us" and len(r.devices) == 2
    assert [row.size_bytes for row in r.rows] == [8, 1024, 1048576, 134217728]
    last = r.rows[-1]
    assert last.type == "float" and last.redop == "sum" and last.root == -1
    assert last.out_of_place.time_us == 116004 and last.out_of_place.busbw_gbps == 1.16
    assert last.in_place.wrong == 0 and r.avg_busbw_gbps == 0.5645 and r.out_of_bounds == 0


def _row(result, size):
    return next(r for r in result.rows if r.size_bytes == size)


def test_published_current_vintage_after_a_quoted_command():
    r = parse((PUBLISHED / "a3mega-h100-16rank-all_reduce.md").read_text())
    assert r.collective == "all_reduce" and r.ranks == 16 and r.launcher is None and len(r.rows) == 31
    first, last = r.rows[0], r.rows[-1]
    assert (first.size_bytes, first.count, first.type, first.redop, first.root) == (8, 2, "float", "sum", -1)
    assert first.out_of_place.time_us == 135.8 and first.in_place.time_us == 123.5
    assert last.size_bytes == 8589934592 and last.out_of_place.time_us == 47535 and last.out_of_place.busbw_gbps == 338.82
    assert _row(r, 1048576).in_place.algbw_gbps == 5.06 and r.total_wrong == 0 and r.avg_busbw_gbps == 70.742


def test_published_openmpi_tagged_rows_with_uneven_headers():
    r = parse((PUBLISHED / "aws-batch-openmpi-p5-all_reduce.txt").read_text())
    assert r.launcher == "openmpi" and len(r.rows) == 32 and r.avg_busbw_gbps == 156.742
    assert _row(r, 17179869184).in_place.busbw_gbps == 483.35 and _row(r, 8388608).in_place.algbw_gbps == 100.80
    assert _row(r, 32).out_of_place.time_us == 22.25 and r.total_wrong == 0


def test_published_old_vintage_error_magnitude_is_not_a_wrong_count():
    """NCCL 2.8 era: no root column, an `error` magnitude; hundreds of NCCL INFO and launcher
    lines from 16 ranks around and inside the table."""
    r = parse((PUBLISHED / "aws-efa-eks-p4d-openmpi-nccl2.8.txt").read_text())
    assert r.launcher == "openmpi" and r.ranks == 16 and len(r.rows) == 30
    row = _row(r, 8)
    assert row.root is None and row.redop == "sum" and row.out_of_place.time_us == 179.1
    assert row.out_of_place.wrong is None and row.out_of_place.error == 2e-07 and row.in_place.error == 1e-07
    assert r.total_wrong is None, "an error magnitude is no count of wrong elements"
    assert _row(r, 4294967296).out_of_place.busbw_gbps == 43.81 and r.avg_busbw_gbps == 11.2432


def test_published_document_with_three_runs_keeps_them_apart():
    runs = parse_runs((PUBLISHED / "awsome-readme-three-runs.md").read_text())
    assert [(r.launcher, len(r.rows)) for r in runs] == [("slurm", 29), ("slurm", 32), ("openmpi", 7)]
    p4de, p5, eks = runs
    assert p4de.avg_busbw_gbps is None and _row(p4de, 2147483648).out_of_place.busbw_gbps == 78.33
    assert _row(p5, 17179869184).in_place.time_us == 66109 and _row(p5, 16).out_of_place.time_us == 72.64
    assert eks.rows[0].size_bytes == 0 and _row(eks, 134217728).in_place.busbw_gbps == 145.83
    assert eks.avg_busbw_gbps == 52.9753 and eks.collective == "all_reduce"
    with pytest.raises(NcclParseError, match="3 runs in one log"):
        parse((PUBLISHED / "awsome-readme-three-runs.md").read_text())


def test_published_issue_78_old_all_reduce_and_alltoall_with_an_empty_field():
    ar = parse((PUBLISHED / "nccl-tests-issue78-all_reduce.txt").read_text())
    assert [r.size_bytes for r in ar.rows] == [268435456, 536870912]
    assert ar.rows[1].out_of_place.time_us == 244833 and ar.rows[1].in_place.error == 2e-06
    a2a = parse((PUBLISHED / "nccl-tests-issue78-alltoall-empty-redop.txt").read_text())
    row = a2a.rows[0]
    assert (row.type, row.redop, row.root) == ("float", None, None)
    assert row.out_of_place.time_us == 520935 and row.out_of_place.busbw_gbps == 0.51
    assert row.out_of_place.error == 0.0 and row.in_place.error == 1.0 and a2a.avg_busbw_gbps == 0.507636


def test_published_elided_rows_and_slurm_scatter():
    p5en = parse((PUBLISHED / "p5en-elided-all_reduce.txt").read_text())
    assert [r.size_bytes for r in p5en.rows] == [8, 16, 17179869184] and p5en.avg_busbw_gbps == 84.0569
    scatter = parse((PUBLISHED / "slurm-label-scatter.txt").read_text())
    assert scatter.launcher == "slurm" and len(scatter.rows) == 29
    assert scatter.rows[0].size_bytes == 0 and (scatter.rows[3].redop, scatter.rows[3].root) == ("none", 0)
    assert scatter.rows[3].out_of_place.time_us == 88.38 and _row(scatter, 2147483648).in_place.busbw_gbps == 79.63


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
    assert r.rows[2].out_of_place.wrong is None and r.rows[2].out_of_place.error == 0.0


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
    ("broken-wrong-not-a-count.txt", "#wrong is a count of elements"),
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
    ok = subprocess.run([sys.executable, "-m", "lumion_hil", "nccl", "parse", str(OUT / "new-us-2gpu.txt")],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0
    data = json.loads(ok.stdout)
    assert len(data["runs"]) == 1
    run = data["runs"][0]
    assert run["rows"][1]["out_of_place"]["algbw_gbps"] == 0.03 and run["avg_busbw_gbps"] == 0.5645
    assert run["rows"][1]["out_of_place"]["bandwidth_from"] == "printed"  # as printed, and said so
    tagged = (PUBLISHED / "aws-batch-openmpi-p5-all_reduce.txt").read_text()
    prefixed = "\n".join(f"(head, rank=0, pid=3808) {line}" for line in tagged.splitlines())
    piped = subprocess.run([sys.executable, "-m", "lumion_hil", "nccl", "parse", "-"], input=prefixed,
                           capture_output=True, text=True, timeout=60)
    assert piped.returncode == 0, piped.stderr
    assert [r["size_bytes"] for r in json.loads(piped.stdout)["runs"][0]["rows"]] == \
        [r.size_bytes for r in parse(tagged).rows]
    several = subprocess.run([sys.executable, "-m", "lumion_hil", "nccl", "parse", str(PUBLISHED / "awsome-readme-three-runs.md")],
                             capture_output=True, text=True, timeout=60)
    assert several.returncode == 0 and len(json.loads(several.stdout)["runs"]) == 3
    bad = subprocess.run([sys.executable, "-m", "lumion_hil", "nccl", "parse", str(OUT / "broken-truncated.txt")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "broken-truncated.txt:3: expected 13 columns" in bad.stderr


def test_printed_bandwidths_are_kept_and_only_0_00_is_taken_from_the_time():
    """nccl-tests computes GB/s from the unrounded time, so what it printed is kept (0.20 stays
    0.20 where size / printed time gives 0.2050); where it printed 0.00 the bandwidths come from
    the printed time, and each figure says where it came from."""
    head = ["# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library=0",
            "# Collective test starting: all_reduce_perf", "#", "# Using devices"]
    head += [f"#  Rank {r:2d} Group  0 Pid   3358 on         h{r} device  0 [0x00] socket ring" for r in range(3)]
    head += ["#", "#                                                              out-of-place                       in-place",
             "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
             "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)"]
    rows = ["     4194304       1048576     float     sum      -1    20460    0.20    0.27       0    20460    0.20    0.27       0",
            "   268435456      67108864     float     sum      -1    11500   23.34   31.12       0    11510   23.32   31.09       0",
            "        1024           256     float     sum      -1   238133    0.00    0.00       0   254000    0.00    0.00       0"]
    result = parse("\n".join(head + rows + ["# Avg bus bandwidth    : 0.02 ", "#"]))
    small, large, stalled = result.rows
    assert 4194304 / 20460e-6 / 1e9 == pytest.approx(0.2050, abs=1e-4)  # what recomputing would have given
    assert (small.out_of_place.algbw_gbps, small.out_of_place.busbw_gbps) == (0.20, 0.27)
    assert small.out_of_place.bandwidth_from == "printed" and large.in_place.busbw_gbps == 31.09
    assert stalled.out_of_place.bandwidth_from == stalled.in_place.bandwidth_from == "time"
    assert stalled.out_of_place.algbw_gbps == pytest.approx(1024 / 238133e-6 / 1e9)
    assert stalled.out_of_place.busbw_gbps == pytest.approx(1024 / 238133e-6 / 1e9 * 4 / 3)
    assert stalled.in_place.busbw_gbps == pytest.approx(1024 / 254000e-6 / 1e9 * 4 / 3)
    # Beside a printed 0.27 (two digits), the busbw from the time keeps more, rounding to it; the
    # harness judges by that one. Above 1 GB/s the printed figure is precise enough on its own.
    assert small.out_of_place.busbw_from_time_gbps == pytest.approx(0.2050 * 4 / 3, abs=1e-4)
    assert small.out_of_place.busbw_best_gbps == small.out_of_place.busbw_from_time_gbps
    assert large.out_of_place.busbw_from_time_gbps is None and large.out_of_place.busbw_best_gbps == 31.12
    off = parse("\n".join(head + [rows[0].replace("20460", "20000", 1), "#"])).rows[0].out_of_place
    assert off.busbw_from_time_gbps is None and off.busbw_best_gbps == 0.27  # 0.2796 would contradict the log


def test_a_launcher_prefix_before_open_mpi_tags_is_parsed_row_for_row():
    """SkyPilot (and Ray) write their own prefix before Open MPI's tag output; the table under
    it is the same table."""
    tagged = (PUBLISHED / "aws-batch-openmpi-p5-all_reduce.txt").read_text()
    prefixed = "\n".join(f"({'head' if i % 2 else 'worker1'}, rank={i % 2}, pid={3808 + i % 2}) {line}"
                         for i, line in enumerate(tagged.splitlines()))
    plain, skypilot = parse(tagged), parse(prefixed)
    assert len(skypilot.rows) == len(plain.rows) == 32
    assert skypilot.rows == plain.rows and skypilot.avg_busbw_gbps == plain.avg_busbw_gbps
    assert skypilot.launcher == "openmpi"
    # No rank list in this log: a 0.00 row takes busbw / algbw from the largest row it printed.
    small = plain.rows[0].out_of_place
    assert small.bandwidth_from == "time" and small.algbw_gbps == pytest.approx(plain.rows[0].size_bytes / small.time_us / 1e3)
    assert small.busbw_gbps / small.algbw_gbps == pytest.approx(1.75, rel=1e-4)  # 2(n-1)/n: the log's 8 ranks, as it prints
    alone = "\n".join(f"(head, rank=0, pid=3808) {line}" for line in (OUT / "new-us-2gpu.txt").read_text().splitlines())
    assert parse(alone).rows == parse((OUT / "new-us-2gpu.txt").read_text()).rows
