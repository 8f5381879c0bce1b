"""The morning report, seen as a person sees it: two runs on the emulated bench, the second
with a slower switch; the summary flags the timing regression; the Allure report, opened in
headless Chromium, shows the recovery test with its timeline, the summary, the failing test
under its category with the earlier run in its history. A screenshot is kept with the test's
output (results/test-output/report.png)."""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import ROOT, needs

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ALLURE = ROOT / "node_modules" / ".bin" / "allure"
pytestmark = needs("browser", CHROMIUM is not None and ALLURE.exists(),
                   "needs Debian's chromium and the Allure CLI: `scripts/setup --report --browser` installs both")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _run(results: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LUMION_HIL_LOCK_DIR": str(results)}
    return subprocess.run([sys.executable, "-m", "lumion_hil", "run", "--results", str(results), "--time-scale", "0.2",
                           "-q", "-p", "no:randomly", "-k", "circuit_make or (test_recovery_time and gpu_failure)", *extra],
                          capture_output=True, text=True, timeout=600, env=env)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _page(url: str, profile: Path) -> str:
    """The page's text once its scripts have run."""
    dom = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=15000",
                          "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    dom = re.sub(r"<(script|style).*?</\1>", " ", dom, flags=re.S)
    return " ".join(re.sub(r"<[^>]+>", " ", dom).split())


def _test_id(report: Path, name: str) -> str:
    for path in (report / "awesome" / "data" / "test-results").glob("*.json"):
        if json.loads(path.read_text()).get("name") == name:
            return path.stem
    raise AssertionError(f"no test named {name!r} in the report")


def test_two_runs_a_regression_and_the_report_that_shows_it(tmp_path):
    results = tmp_path / "results"
    first = _run(results)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    second = _run(results, "--defect", "slow_switch=10")
    assert second.returncode == 1, second.stdout[-2000:] + second.stderr[-2000:]

    summary = json.loads((results / "summary.json").read_text())
    assert summary["defects"] == ["slow_switch=10"] and summary["time_scale"] == 0.2
    regressed = {r["name"]: r for r in summary["regressions"]}
    assert "switch_completion_time" in regressed and regressed["switch_completion_time"]["cause"] == "timing regression"
    assert "was passing, now fails" in regressed["switch_completion_time"]["why"]
    assert "## Regressions since the previous run" in (results / "summary.md").read_text()
    assert "regressed: " in second.stdout
    assert len((results / "history.jsonl").read_text().splitlines()) == 2  # Allure's trend: two runs

    report = results / "allure-report"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(report)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/awesome/index.html"
    try:
        front = _page(base, tmp_path / "profile")
        # The tree opens the groups with failures; the recovery (green in both runs) is a group.
        assert re.search(r"recovery \d+", front) and "regression summary" in front, front[:2000]
        categories = _page(f"{base}#/categories", tmp_path / "profile")
        assert re.search(r"Timing regressions \d+", categories), categories[:2000]
        recovery = _test_id(report, "recovery from gpu_failure")
        attachments = _page(f"{base}#/{recovery}/attachments", tmp_path / "profile")
        assert "recovery-timeline.png" in attachments, attachments[:2000]
        slow = _test_id(report, "circuit (1, 20): dark when removed, light within budget when made")
        page = _page(f"{base}#/{slow}", tmp_path / "profile")
        assert "Category: Timing regressions" in page and "History 1" in page, page[:2000]
        history = _page(f"{base}#/{slow}/history", tmp_path / "profile")
        earlier = json.loads((report / "awesome" / "data" / "test-results" / f"{slow}.json").read_text())["history"]
        assert [h["status"] for h in earlier] == ["passed"], earlier  # the first run, in the trend
        assert re.search(r"\d+/\d+/\d+ at [\d:]+ (?:AM |PM )?\d+m?s", history), history[:2000]
        summary_page = _page(f"{base}#/{_test_id(report, 'regression summary')}/attachments", tmp_path / "profile")
        assert "summary.md" in summary_page, summary_page[:2000]
        shot = ROOT / "results" / "test-output" / "report.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=15000",
                        "--window-size=1400,1000", f"--screenshot={shot}", f"{base}#/{slow}"],
                       capture_output=True, timeout=120)
        assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 10_000
        print(f"screenshot: {shot}")
    finally:
        server.shutdown()
