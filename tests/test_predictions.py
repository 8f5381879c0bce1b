"""What the bench file alone predicts, and the summary that puts it beside what a run observed:
on the default bench the optical/electrical ratios follow from the spare's place behind the 2:1
uplink; on a bench whose spare sits in the job's rack they are about 1, and the summary says why.
The ratio rows are marked `model`, and a model figure never confirms a paper."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from lumion_hil.harness.config import load_bench
from lumion_hil.harness import predictions
from lumion_hil.reports.summary import summarize, to_markdown

from conftest import BENCHES, ROOT

SUITES = ROOT / "test_suites"
LARGEST = 134217728


def same_rack_bench(tmp_path):
    data = yaml.safe_load((BENCHES / "emulated.yaml").read_text())
    data["name"] = "emulated-same-rack"
    data["electrical"]["racks"] = {}  # the spare in the job's rack: no uplink on the way
    out = tmp_path / "same-rack.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def test_the_default_bench_predicts_the_ratios_from_the_spare_behind_the_uplink():
    bench = load_bench(BENCHES / "emulated.yaml")
    busbw, throughput = predictions.busbw_ratio(bench, LARGEST), predictions.throughput_ratio(bench)
    assert busbw.value == pytest.approx(2.0, rel=0.01) and throughput.value == pytest.approx(1.81, rel=0.01)
    assert "crosses the 2:1 uplink" in busbw.why and "host3" in busbw.why


def test_a_spare_in_the_same_rack_predicts_about_1(tmp_path):
    bench = load_bench(same_rack_bench(tmp_path))
    busbw = predictions.busbw_ratio(bench, LARGEST)
    assert busbw.value == pytest.approx(1.0, rel=0.02)
    assert "never crosses" in busbw.why


def _summary(tmp_path, bench_path):
    record = tmp_path / "record.jsonl"
    proc = subprocess.run([sys.executable, "-m", "pytest", str(SUITES / "test_collective_bandwidth.py"),
                           str(SUITES / "test_training_throughput.py"), "-p", "no:cacheprovider", "--rootdir",
                           str(SUITES), "--bench", str(bench_path), "--time-scale", "0.1", "--run-record", str(record),
                           "-q", "-p", "no:randomly"], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "LUMION_HIL_LOCK_DIR": str(tmp_path)})
    summary = summarize(record, [])
    return proc, summary, to_markdown(summary)


def _row(summary, name):
    return next(r for r in summary["rows"] if r["name"] == name)


@pytest.mark.parametrize("bench", ["default", "same-rack"])
def test_the_summary_marks_ratios_model_and_shows_the_prediction(tmp_path, bench):
    path = BENCHES / "emulated.yaml" if bench == "default" else same_rack_bench(tmp_path)
    proc, summary, markdown = _summary(tmp_path, path)
    ratio = _row(summary, "allreduce_busbw_optical_over_electrical")
    assert ratio["basis"] == "model" and ratio["predicted"] is not None, json.dumps(ratio)
    assert ratio["value"] == pytest.approx(ratio["predicted"], rel=0.05), "observed agrees with the bench file"
    lumion = _row(summary, "throughput_optical_over_electrical_lumion")
    assert lumion["published"] == "lumion.throughput_vs_electrical"
    line = next(line for line in markdown.splitlines() if line.startswith("| test_busbw_ratio_optical_over_electrical:"
                                                                           "allreduce_busbw_optical_over_electrical |"))
    assert "| model |" in line and "confirms nothing" in line
    assert "## Predicted from the bench file alone" in markdown
    # the suites ran (0 or 1): their timing verdicts (step intervals beside another test worker) are
    # CI's main job's to judge on the default bench, not this test's
    assert proc.returncode in (0, 1), proc.stdout[-3000:]
    if bench == "default":
        assert ratio["verdict"] != "fail", json.dumps(ratio)
        assert ratio["value"] == pytest.approx(2.0, rel=0.05)
        assert "crosses the 2:1 uplink" in markdown
    else:
        # Morphlux's 1.8x and LUMION's ~2x are not what this bench's layout gives: red, and the
        # summary says why.
        assert ratio["value"] == pytest.approx(1.0, rel=0.05) and ratio["verdict"] == "fail"
        assert "never crosses the 2:1 uplink" in markdown
        assert _row(summary, "allreduce_busbw_ratio_over_bench_prediction")["verdict"] != "fail"


def test_a_small_message_regression_reaches_the_summary(tmp_path):
    """busbw at every size is in the run record; a drop at one small size, shown beyond the
    nights' noise, is a regression in the summary although no limit judges it. With one night
    before it, the same drop is shown, not judged: the noise is not known."""
    from lumion_hil.harness.measurements import Spec

    def record(path, small):
        lines = [{"type": "run", "bench": "b", "time_scale": 1.0}]
        for size, busbw in ((8, small), (134217728, 2.4)):
            m = Spec(f"busbw_after_{size}B", "GB/s", better="higher").measure(busbw)
            lines.append({"type": "measurement", "test": "t.py::test_busbw_by_size", **m.to_dict()})
        path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
        return path

    history = []
    for night, small in enumerate((0.00110, 0.00107, 0.00112, 0.00109)):
        done = summarize(record(tmp_path / f"night{night}.jsonl", small), history)
        history.append({"record": done["record"], "values": {r["key"]: r["value"] for r in done["rows"]},
                        "verdicts": {r["key"]: r["verdict"] for r in done["rows"]}})
    assert done["regressions"] == []
    dropped = summarize(record(tmp_path / "b.jsonl", 0.0005), history)
    assert [r["name"] for r in dropped["regressions"]] == ["busbw_after_8B"], dropped["regressions"]
    row = next(r for r in dropped["regressions"])
    assert row["decision"]["verdict"] == "differs" and row["decision"]["alpha"] < dropped["false_alarm_rate"]
    steady = summarize(record(tmp_path / "c.jsonl", 0.00108), history)
    assert steady["regressions"] == []
    unknown = summarize(record(tmp_path / "d.jsonl", 0.0005), history[:1])
    assert unknown["regressions"] == []
    assert "fewer than 3" in next(r for r in unknown["rows"] if r["name"] == "busbw_after_8B")["why"]


def test_a_limit_that_does_not_apply_is_recorded_not_comparable_with_why(tmp_path):
    """A figure judged against a published one from a prototype this bench cannot be compared
    with: its verdict is "not comparable" (not a failure), the limit and the reason beside it in
    the record and the summary's published table."""
    from lumion_hil.harness.measurements import Verdict
    from lumion_hil.harness.published import upper_limit
    from lumion_hil.harness.records import RunRecord

    why = "a CPU job on 2 cores against NCCL on GPUs"
    spec = upper_limit("recovery_to_first_step", "morphlux.first_step_s")
    far_over = spec.high * 3
    assert spec.measure(far_over).verdict is Verdict.FAIL
    taken = spec.not_comparable_because(why).measure(far_over)
    assert taken.verdict is Verdict.NOT_COMPARABLE and taken.passed and why in taken.describe()
    assert spec.not_comparable_because(None).measure(far_over).verdict is Verdict.FAIL
    record = RunRecord(tmp_path / "record.jsonl", bench="b")
    record.measurement(taken, "test_recovery_time.py::test_recovery_time[gpu_failure]")
    record.close()
    summary = summarize(tmp_path / "record.jsonl", [])
    row = _row(summary, "recovery_to_first_step")
    assert row["verdict"] == "not comparable" and row["not_comparable"] == why and not summary["failed"]
    assert f"not comparable: {why}" in to_markdown(summary)
