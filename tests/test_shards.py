"""The nightly spread over machines: ``--explore-shard K/N`` runs a part of a profile's shards,
and ``lumion-hil report PARTS... --results OUT`` merges the parts into one summary whose
exploration adds up to what the unsplit profile explores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lumion_hil.harness.exploration import shards_of_part

from conftest import BENCHES

# Stories told at a fiftieth of real time: on a core of their own, one worker (scripts/tests).
pytestmark = pytest.mark.scaled

SEED = "20261202"
# The nightly profile's 8 shards, one sequence each: what is explored, not how much, is checked.
NIGHTLY = ["--explore", "nightly", "--explore-sequences", "8", "--explore-seed", SEED]


def _cli(tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "LUMION_HIL_LOCK_DIR": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "lumion_hil", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=tmp_path, env=env)


def _explore(tmp_path: Path, results: Path, *extra: str) -> subprocess.CompletedProcess:
    return _cli(tmp_path, "run", "--bench", str(BENCHES / "exploration.yaml"), "--results", str(results),
                "--no-report", "-q", *NIGHTLY, *extra, "-k", "failure_sequences")


def _shards(results: Path) -> list[tuple]:
    record = next((results / "records").glob("run-*.jsonl"))
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    return sorted((m["attrs"]["shard"], m["attrs"]["seed"], m["attrs"]["sequences_run"]) for m in lines
                  if m["type"] == "measurement" and m["name"] == "sequences_explored")


def test_parts_take_every_shard_once():
    parts = [shards_of_part("nightly", f"{k}/3") for k in (1, 2, 3)]
    assert sorted(i for part in parts for i in part) == list(range(8))
    assert parts[0] == [0, 3, 6]
    assert shards_of_part("nightly", None) == list(range(8))
    assert [shards_of_part("ci", f"{k}/2") for k in (1, 2)] == [[0], [1]]
    with pytest.raises(ValueError, match="has 2 shard"):
        shards_of_part("ci", "1/3")
    with pytest.raises(ValueError, match="has 1 shard"):
        shards_of_part("bench", "1/2")
    for bad in ("0/4", "5/4", "x/4", "3"):
        with pytest.raises(ValueError):
            shards_of_part("nightly", bad)


def _whole_profile() -> list[tuple]:
    """What the unsplit profile runs: every shard, with the seed and the sequences the suite
    gives it (test_failure_sequences.py: the profile's seed + shard, sequences // shards)."""
    from lumion_hil.harness.exploration import profile

    whole = profile("nightly", int(SEED), Path("."), 8)
    return [(i, whole.seed + i, whole.sequences // whole.shards) for i in range(whole.shards)]


def test_four_parts_explore_what_the_whole_profile_explores_and_report_adds_them_up(tmp_path):
    parts = []
    for k in range(1, 5):
        folder = tmp_path / f"part{k}"
        proc = _explore(tmp_path, folder, "--explore-shard", f"{k}/4")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        assert [s[0] for s in _shards(folder)] == [k - 1, k + 3], f"part {k}/4 ran {_shards(folder)}"
        parts.append(folder)
    # The same shards, each with the seed and the number of sequences it has in the whole profile.
    assert sorted(s for p in parts for s in _shards(p)) == _whole_profile()

    merged = _cli(tmp_path, "report", *map(str, parts), "--results", str(tmp_path / "nightly"))
    assert "merged 4 results" in merged.stdout, merged.stdout + merged.stderr
    summary = json.loads((tmp_path / "nightly" / "summary.json").read_text())
    explored = summary["exploration"]
    told = sum(m["value"] for p in parts for m in map(json.loads, next((p / "records").glob("run-*.jsonl"))
               .read_text().splitlines()) if m["type"] == "measurement" and m["name"] == "sequences_explored")
    assert explored["sequences_explored"] == told > 0
    assert explored["sequences_run"] == sum(s[2] for s in _whole_profile())
    assert [tuple(s[1:]) for s in explored["shards"]] == [(s[0], s[1]) for s in _whole_profile()]
    assert len(summary["parts"]) == 4 and summary["outcome"] == "passed"
    assert summary["counts"] == {"passed": 8}
    markdown = (tmp_path / "nightly" / "summary.md").read_text()
    assert f"{told:g} distinct stories told to the end" in markdown and "in 8 shard(s)" in markdown
    # Every part's Allure results, less their own summaries (the merged run has one, its own).
    results = [json.loads(p.read_text()) for p in (tmp_path / "nightly" / "allure-results").glob("*-result.json")]
    assert sum(r.get("historyId") == "lumion-hil-regression-summary" for r in results) == 1
    assert sum("test_failure_sequences" in r.get("fullName", "") for r in results) == 8


def test_a_part_without_a_seed_or_of_too_many_parts_is_refused(tmp_path):
    unseeded = _cli(tmp_path, "run", "--bench", str(BENCHES / "exploration.yaml"), "--no-report", "--explore",
                    "nightly", "--explore-shard", "1/4", "-k", "failure_sequences")
    assert unseeded.returncode == 4 and "--explore-shard needs --explore-seed" in unseeded.stderr
    too_many = _explore(tmp_path, tmp_path / "r", "--explore-shard", "1/9")
    assert too_many.returncode == 4 and "cannot be cut into 9 parts" in too_many.stdout + too_many.stderr


def test_report_names_a_folder_that_is_not_results(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = _cli(tmp_path, "report", str(tmp_path / "empty"), "--results", str(tmp_path / "out"))
    assert proc.returncode != 0 and "no run record" in proc.stderr and "empty" in proc.stderr


def _paths_line(record: Path, over_parts: bool = False) -> dict:
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    return next(m for m in lines if m["type"] == "measurement" and m["name"] == "paths_not_reached"
                and bool(m.get("over_parts")) == over_parts)


def test_the_ci_profiles_paths_are_judged_over_its_parts_not_in_each(tmp_path):
    """A part of the ci profile on a bench that makes every fault does not go red for a path
    another part may take: it records its paths beside the limit, not comparable, and the
    report that merges the parts judges them together (here three stories a shard, too few to
    take every path: the merged run is red, and says which paths no part took)."""
    parts = []
    for k in (1, 2):
        folder = tmp_path / f"part{k}"
        proc = _cli(tmp_path, "run", "--bench", str(BENCHES / "exploration.yaml"), "--results", str(folder),
                    "--no-report", "-q", "--explore", "ci", "--explore-sequences", "6", "--explore-seed", SEED,
                    "--explore-shard", f"{k}/2", "-k", "failure_sequences")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        mine = _paths_line(next((folder / "records").glob("run-*.jsonl")))
        assert mine["verdict"] == "not comparable" and mine["high"] == 0 and mine["attrs"]["part"] == f"{k}/2", mine
        assert mine["value"] > 0, "three stories take every path: the test shows nothing"
        parts.append(folder)
    merged = _cli(tmp_path, "report", *map(str, parts), "--results", str(tmp_path / "ci"))
    assert merged.returncode == 1, merged.stdout[-2000:] + merged.stderr[-2000:]
    line = _paths_line(next((tmp_path / "ci" / "records").glob("run-merged-*.jsonl")), over_parts=True)
    assert line["verdict"] == "fail" and line["attrs"]["parts"] == ["1/2", "2/2"] and line["attrs"]["shards"] == [0, 1]
    assert line["value"] == len(line["attrs"]["missed"]) > 0
    assert f"missed {', '.join(line['attrs']['missed'])}" in merged.stderr
    summary = json.loads((tmp_path / "ci" / "summary.json").read_text())
    assert summary["outcome"] == "failed", summary["outcome"]


def _part(folder: Path, part: str, shards: list[int], reached: dict[str, int], bench: str = "exploration") -> Path:
    """A results folder of one part of the ci profile, as its run record says it (reports/merge.py
    reads nothing else of it)."""
    (folder / "records").mkdir(parents=True)
    lines = [{"type": "run", "bench": bench, "time_scale": 0.02},
             {"type": "measurement", "test": f"test_failure_sequences.py::test_failure_sequences[shard{shards[-1]}]",
              "name": "paths_not_reached", "value": 1.0, "unit": "paths", "low": None, "high": 0.0,
              "verdict": "not comparable", "attrs": {
                  "missed": [], "reached": reached, "shards": shards, "part": part, "every": True, "profile_shards": 2,
                  "reference": ["detected: xid", "degraded", "resume after a repair"]}},
             {"type": "end", "outcome": "passed", "exit_status": 0, "counts": {"passed": 1}}]
    (folder / "records" / "run-1.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


def test_merged_parts_that_together_take_every_path_pass_and_a_missing_part_is_not_comparable(tmp_path):
    from lumion_hil.reports.merge import merge_results

    one = _part(tmp_path / "one", "1/2", [0], {"detected: xid (agent)": 3, "degraded": 1})
    two = _part(tmp_path / "two", "2/2", [1], {"resume after a repair": 2})
    line = _paths_line(merge_results([one, two], tmp_path / "both"), over_parts=True)
    assert line["verdict"] == "pass" and line["value"] == 0 and line["attrs"]["reached"]["degraded"] == 1, line
    alone = _paths_line(merge_results([one], tmp_path / "alone"), over_parts=True)
    assert alone["verdict"] == "not comparable" and "shard(s) [1]" in alone["not_comparable"], alone
    assert alone["attrs"]["missed"] == ["resume after a repair"]
    # Parts of another bench are judged apart; a merged folder merged again is judged as before.
    other = _part(tmp_path / "other", "2/2", [1], {"resume after a repair": 2}, bench="served")
    record = merge_results([other, tmp_path / "both"], tmp_path / "again")
    over = [json.loads(line) for line in record.read_text().splitlines() if '"over_parts": true' in line]
    by_bench = {m["part_bench"]: (m["verdict"], m["attrs"]["parts"]) for m in over}
    assert by_bench == {"exploration": ("pass", ["1/2", "2/2"]), "served": ("not comparable", ["2/2"])}, by_bench
