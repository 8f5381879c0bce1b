"""Many runs' results as one: the parts of a profile spread over a CI matrix
(``--explore-shard K/N``), or several benches run the same night, merged into one results
folder that ``lumion-hil report`` summarizes and builds one HTML report from.

What is merged, from each input folder (what ``lumion-hil run --results`` wrote):
- its newest run record, whose lines go into one merged record (``records/run-merged-*.jsonl``):
  one ``run`` line naming every part, every other line tagged with its part's bench and folder,
  and one closing line (the worst outcome, the counts added up);
- its Allure results (each result has its own uuid), less its own regression summary (the
  merged summary replaces those);
- the stories its exploration saved (``stories/``).
The inputs are read, never changed.

What only the parts together can show is judged here: the failure sequences' reference paths.
A part (``--explore-shard K/N``) records the paths its shards took beside the profile's limit,
not comparable; the merged record adds one ``paths_not_reached`` over every part
(``"over_parts": true``), judged against that limit, and a red one makes the merged run red."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from lumion_hil.harness.exit_codes import MEANING, ExitCode
from lumion_hil.harness.exploration import EVERY_PATH, is_a_part, missed_of
from lumion_hil.harness.measurements import Spec, Verdict
from lumion_hil.harness.records import read_record
from lumion_hil.reports.summary import newest_record

# Worst first: the merged run ended as its worst part did (a record without a closing line is of
# a run that crashed or was killed).
WORST_FIRST = [ExitCode.CRASHED, ExitCode.BENCH_OR_USAGE_ERROR, ExitCode.INTERRUPTED, ExitCode.BENCH_BUSY,
               ExitCode.NOTHING_COLLECTED, ExitCode.TESTS_FAILED, ExitCode.PASSED]


class MergeError(Exception):
    pass


def _newest_record(folder: Path) -> Path:
    record = newest_record(folder)
    if record is None:
        raise MergeError(f"{folder}: no run record in {folder / 'records'} (is it a folder `lumion-hil run "
                         "--results` wrote?)")
    return record


def _is_own_summary(path: Path) -> bool:
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("historyId") == "lumion-hil-regression-summary"
    except (OSError, json.JSONDecodeError, AttributeError):
        return False


def _paths_over_parts(bodies: list[list[dict]]) -> list[dict]:
    """``paths_not_reached`` over every part of a profile (one line for each test and bench): the
    paths each part's shards took, added up, against the reference paths and the limit the parts
    recorded (in the ci profile on a bench that makes every fault: none missed). Where shards of
    the profile are in no part merged, what the parts explored is not the profile: not comparable."""
    groups: dict[tuple, list[dict]] = {}
    for body in bodies:
        for line in body:
            attrs = line.get("attrs") or {}
            if line.get("type") == "measurement" and line.get("name") == "paths_not_reached" \
                    and not line.get("over_parts") and is_a_part(attrs.get("part")):
                key = (line.get("test", "").split("[")[0], line.get("part_bench"), tuple(attrs["reference"]))
                groups.setdefault(key, []).append(line)
    out = []
    for (test, bench, reference), lines in groups.items():
        reached: dict[str, int] = {}
        for line in lines:
            for path, times in line["attrs"]["reached"].items():
                reached[path] = reached.get(path, 0) + times
        shards = sorted({shard for line in lines for shard in line["attrs"]["shards"]})
        missed = missed_of(reached, reference)
        spec = Spec("paths_not_reached", "paths", description="paths of the reference controller no story took, "
                    "in every shard of the parts merged")
        if all(line["attrs"].get("every") for line in lines):
            spec = spec.at_most(0, f"{EVERY_PATH}, over every part").with_marginal(0.0)
            absent = sorted(set(range(lines[0]["attrs"]["profile_shards"])) - set(shards))
            if absent:
                spec = spec.not_comparable_because(f"shard(s) {absent} of the profile are in no part merged: what "
                                                   "the parts explored is not the whole profile")
        m = spec.measure(float(len(missed)), missed=missed, reached=dict(sorted(reached.items())), shards=shards,
                         parts=sorted(line["attrs"]["part"] for line in lines))
        out.append({"type": "measurement", "test": test, **m.to_dict(), "part_bench": bench, "over_parts": True})
    return out


def merge_results(inputs: list[Path], out: Path) -> Path:
    """Merge ``inputs`` into ``out``; returns the merged run record's path."""
    inputs = [Path(p) for p in inputs]
    out = Path(out)
    for folder in inputs:
        if not folder.is_dir():
            raise MergeError(f"{folder}: no such results folder")
        if folder.resolve() == out.resolve():
            raise MergeError(f"{folder}: the merged results need a folder of their own (--results), not one of the "
                             "inputs")
    records = [_newest_record(folder) for folder in inputs]
    heads: list[dict[str, Any]] = []
    bodies, ends = [], []
    for folder, record in zip(inputs, records):
        lines = list(read_record(record))
        head = next((line for line in lines if line.get("type") == "run"), {})
        end = next((line for line in reversed(lines) if line.get("type") == "end"), None)
        heads.append({"folder": str(folder), "record": str(record), "bench": head.get("bench"),
                      "started": head.get("started"), "time_scale": head.get("time_scale"),
                      "defects": head.get("defects") or [], "outcome": end["outcome"] if end else "crashed",
                      "exit_status": end["exit_status"] if end else int(ExitCode.CRASHED)})
        part = {"part_bench": head.get("bench"), "part": str(folder)}
        # (a line of a folder merged before keeps the part it came from)
        bodies.append([{**part, **line} for line in lines if line.get("type") not in ("run", "end")])
        ends.append(end)
    benches = sorted({h["bench"] for h in heads if h["bench"]})
    scales = {h["time_scale"] for h in heads}
    defects = sorted({d for h in heads for d in h["defects"]})
    over_parts = _paths_over_parts(bodies)
    counts: dict[str, int] = {}
    for end in ends:
        for kind, n in ((end or {}).get("counts") or {}).items():
            counts[kind] = counts.get(kind, 0) + n
    rank = {int(code): i for i, code in enumerate(WORST_FIRST)}
    statuses = [h["exit_status"] for h in heads]
    if any(m["verdict"] == Verdict.FAIL.value for m in over_parts):
        statuses.append(int(ExitCode.TESTS_FAILED))
    status = min(statuses, key=lambda s: rank.get(s, 0))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    merged = out / "records" / f"run-merged-{stamp}.jsonl"
    merged.parent.mkdir(parents=True, exist_ok=True)
    with merged.open("w", encoding="utf-8") as fh:
        head = {"type": "run", "bench": " + ".join(benches) or None,
                "started": min((h["started"] for h in heads if h["started"]), default=None),
                "time_scale": scales.pop() if len(scales) == 1 else None, "defects": defects, "merged_from": heads}
        fh.write(json.dumps(head) + "\n")
        for body in [*bodies, over_parts]:
            for line in body:
                fh.write(json.dumps(line, default=str) + "\n")
        outcome = MEANING.get(ExitCode(status), f"exit {status}") if status in rank else f"exit {status}"
        fh.write(json.dumps({"type": "end", "outcome": outcome, "exit_status": status, "counts": counts,
                             "parts": len(inputs)}) + "\n")
    allure_out = out / "allure-results"
    allure_out.mkdir(parents=True, exist_ok=True)
    for folder in inputs:
        for path in sorted((folder / "allure-results").glob("*")):
            if path.is_file() and not (path.name.endswith("-result.json") and _is_own_summary(path)):
                shutil.copy2(path, allure_out / path.name)
        stories = folder / "stories"
        if stories.is_dir():
            for story in stories.glob("*"):
                (out / "stories").mkdir(parents=True, exist_ok=True)
                shutil.copy2(story, out / "stories" / story.name)
    return merged
