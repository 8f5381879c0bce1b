"""The pytest plugin as a suite author meets it."""

from __future__ import annotations

import json

from conftest import BENCHES

SUITE = """
from lumion_hil.harness.measurements import Spec

def test_measures(measure, optical_switch):
    optical_switch.disconnect([(1, 20)])
    measure(Spec("too_slow", "s").at_most(1.0, "made up"), 2.5)
    measure(Spec("fine", "s").at_most(1.0, "made up"), 0.5)

def test_after(optical_switch, world):
    assert optical_switch.connections() == {i: e for i, e in world.bench.safety.baseline}
"""


# labgrid's own pytest plug-in (installed with the labgrid extra) starts a process-wide logger in
# its pytest_configure that refuses to start twice: in-process runs leave it out, as the suites do.
NO_LABGRID = ("-p", "no:labgrid")


def test_failed_measurement_fails_the_test_after_all_are_recorded(pytester):
    pytester.makepyfile(test_suite=SUITE)
    record = pytester.path / "record.jsonl"
    result = pytester.runpytest(*NO_LABGRID, "--bench", str(BENCHES / "emulated.yaml"), "--time-scale", "0.1",
                                "--run-record", str(record), "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*measurement out of limits*", "*too_slow = 2.5 s (model): fail (limit <= 1 s; made up)*"])
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert lines[0]["type"] == "run" and lines[0]["bench"] == "emulated-prototype"
    names = [(m["name"], m["verdict"]) for m in lines if m["type"] == "measurement"]
    assert names == [("too_slow", "fail"), ("fine", "pass")]


def test_hardware_marker_skips_on_an_emulated_bench(pytester):
    pytester.makepyfile("""
        import pytest
        @pytest.mark.hardware
        def test_needs_the_lab(bench):
            raise AssertionError("must not run")
    """)
    result = pytester.runpytest(*NO_LABGRID, "--bench", str(BENCHES / "emulated.yaml"))
    result.assert_outcomes(skipped=1)


def test_a_broken_bench_stops_the_run_with_its_problems(pytester):
    pytester.makepyfile("def test_x(bench): pass")
    bad = BENCHES.parent / "tests" / "bad_benches" / "04-port-out-of-range.yaml"
    result = pytester.runpytest(*NO_LABGRID, "--bench", str(bad))
    assert result.ret == 4  # pytest's usage error: nothing ran
    result.stderr.fnmatch_lines(["*04-port-out-of-range.yaml:*: topology.hosts[[]1[]].nics[[]0[]].tx_port: "
                                 "port 40 is not an ingress port*"])


FIGURE_SUITE = """
import sys

from lumion_hil.reports import allure_glue


def test_figure():
    made = []

    def make():
        from lumion_hil.reports.plots import busbw_figure

        made.append(1)
        return busbw_figure({"optical": {1024: 1.0, 2048: 2.0}})

    allure_glue.attach_figure("busbw", make)
    print("FIGURES MADE", len(made), "MATPLOTLIB", "matplotlib" in sys.modules)
"""


def test_a_figure_is_made_only_where_a_report_keeps_it(pytester, tmp_path):
    """Without --alluredir an attachment goes nowhere: the figure is not drawn, and matplotlib is
    not even imported (half a second of CPU a process). With a report it is there, PNG and SVG."""
    pytester.makepyfile(test_figure=FIGURE_SUITE)
    bare = pytester.runpytest_subprocess(*NO_LABGRID, "-s", "-p", "no:randomly")
    bare.assert_outcomes(passed=1)
    bare.stdout.fnmatch_lines(["*FIGURES MADE 0 MATPLOTLIB False*"])
    report = tmp_path / "allure-results"
    kept = pytester.runpytest_subprocess(*NO_LABGRID, "-s", "-p", "no:randomly", f"--alluredir={report}")
    kept.assert_outcomes(passed=1)
    kept.stdout.fnmatch_lines(["*FIGURES MADE 1 MATPLOTLIB True*"])
    assert sorted(p.suffix for p in report.iterdir() if p.suffix in (".png", ".svg")) == [".png", ".svg"]
