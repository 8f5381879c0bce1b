"""The morning summary: what a run measured against the published numbers, and what got worse
since the previous run.

Written by ``lumion-hil report`` (and ``lumion-hil run``) next to the HTML report, as Markdown
and JSON, from the newest run record; each run's values are appended to
``summary-history.jsonl`` so the next summary can compare. A measurement has regressed when it
is shown to have moved the bad way (up for an upper limit, down for a lower one, away from the
middle of a range; a recorded figure's own good direction) by more than ``NOISE_FLOOR`` of its
value, against the nights before it: a statistical decision (harness/decisions.py) on
tonight's value (the median of its samples, where a run or a merge of shards took several)
against the last ``HISTORY_RUNS`` nights' (the interval of a new observation: the nights' own
spread is the noise), at a false-alarm rate of ``SUMMARY_ALPHA`` for the whole summary, over
every row (Bonferroni). With fewer than ``MIN_NIGHTS`` nights before it, the noise is not known
and the change is shown, not judged. A verdict that went from pass to fail is a regression
whatever the size. The summary also goes into the Allure results as a result of its own, so the
report shows it, under its category, with its history.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from lumion_hil.harness import decisions
from lumion_hil.harness.records import read_record

NOISE_FLOOR = 0.10  # the smallest change that counts as a regression: this fraction of the value
HISTORY_RUNS = 10  # nights the noise is estimated from
MIN_NIGHTS = 3  # fewer nights before: the night-to-night noise is not known, the change is not judged


@dataclass
class Row:
    key: str
    name: str
    test: str
    value: float | None
    unit: str
    low: float | None
    high: float | None
    verdict: str
    cause: str
    published: str | None = None
    published_value: float | None = None
    ratio: float | None = None  # value / published value
    previous: float | None = None
    previous_verdict: str | None = None
    change: float | None = None  # relative, signed; positive: larger than before
    noise: float | None = None  # the smallest change judged a regression (the decision's margin), in the unit
    samples: int = 1  # tonight's samples of it (several where the run or its shards took several)
    decision: dict | None = None  # tonight against the nights before (harness/decisions.py)
    regression: bool = False
    why: str = ""
    basis: str = "measured"  # or "model": an emulated bench computed it (never a confirmation)
    predicted: float | None = None  # what the bench file alone predicts (harness/predictions.py)
    not_comparable: str = ""  # why the limit does not apply on this bench (verdict "not comparable")
    prediction: str = ""  # and why
    better: str | None = None  # a recorded (unjudged) figure's good direction
    until: str = ""  # where the figure's clock stopped, where the suite says (the job running again, ...)
    follows_from: str = ""  # what the harness itself set that the figure follows from (a bench's shaping)


def _key(m: dict, with_bench: bool = False) -> str:
    test = m["test"].split("::")[-1]
    if with_bench and m.get("part_bench"):  # a merged record of several benches (reports/merge.py)
        test = f"{m['part_bench']}/{test}"
    attrs = {k: v for k, v in (m.get("attrs") or {}).items()
             if k in ("detector", "port", "interface", "host", "connections") and isinstance(v, (str, int))}
    extra = ",".join(f"{k}={v}" for k, v in sorted(attrs.items()))
    return f"{test}:{m['name']}" + (f"{{{extra}}}" if extra else "")


def _badness(row: Row):
    """How a value of the row reads as worse-is-larger (a range's distance from its middle, a
    lower limit's or a "higher is better" figure's value negated); None where nothing is worse."""
    if row.high is None and row.low is None and row.better:
        return (lambda v: -v) if row.better == "higher" else (lambda v: v)
    if row.high is not None and row.low is None:
        return lambda v: v
    if row.low is not None and row.high is None:
        return lambda v: -v
    if row.low is not None and row.high is not None:
        middle = (row.low + row.high) / 2
        return lambda v: abs(v - middle)
    return None


def summarize(record: Path, history: list[dict]) -> dict:
    """The summary of one run record, compared with the runs in ``history`` (oldest first)."""
    lines = list(read_record(record))
    head = next((line for line in lines if line.get("type") == "run"), {})
    end = next((line for line in reversed(lines) if line.get("type") == "end"), None)
    before = [h for h in history if h.get("record") != str(record)][-HISTORY_RUNS:]
    parts = head.get("merged_from") or []
    several = len({p.get("bench") for p in parts}) > 1
    rows: dict[str, Row] = {}
    samples: dict[str, list[float]] = {}
    for m in lines:
        if m.get("type") != "measurement" or (m.get("low") is None and m.get("high") is None and not m.get("better")):
            continue  # judged figures, and recorded ones with a good direction (busbw at every size)
        row = Row(_key(m, several), m["name"], m["test"], m.get("value"), m["unit"], m.get("low"), m.get("high"),
                  m["verdict"], m.get("cause", ""), m.get("published"), m.get("published_value"),
                  basis=m.get("basis", "measured"), better=m.get("better"), not_comparable=m.get("not_comparable", ""))
        attrs = m.get("attrs") or {}
        row.until, row.follows_from = str(attrs.get("until") or ""), str(attrs.get("follows_from") or "")
        if isinstance(attrs.get("predicted"), (int, float)) and "observed" not in attrs:
            row.predicted, row.prediction = float(attrs["predicted"]), str(attrs.get("prediction", ""))
        if row.published_value and row.value is not None:
            row.ratio = row.value / row.published_value
        if row.value is not None:
            samples.setdefault(row.key, []).append(row.value)
        if row.key in rows and rows[row.key].verdict == "fail":
            row.verdict = "fail"  # one of tonight's samples failed: the row did
        rows[row.key] = row
    family = decisions.Family(decisions.SUMMARY_ALPHA, "the summary's regressions")
    judged: dict[str, tuple] = {}
    for key, row in rows.items():
        if samples.get(key):
            row.samples = len(samples[key])
            row.value = statistics.median(samples[key])
            if row.published_value:
                row.ratio = row.value / row.published_value
        past = [h["values"][key] for h in before if h.get("values", {}).get(key) is not None]
        past_verdicts = [h.get("verdicts", {}).get(key) for h in before if h.get("verdicts", {}).get(key)]
        if not past:
            continue
        row.previous = past[-1]
        row.previous_verdict = past_verdicts[-1] if past_verdicts else None
        if row.value is not None and row.previous:
            row.change = (row.value - row.previous) / abs(row.previous)
        worse = _badness(row)
        if row.value is None or worse is None:
            continue
        row.noise = NOISE_FLOOR * max(abs(statistics.mean(past)), 1e-12)
        nights = past if len(past) >= MIN_NIGHTS else []  # fewer: shown, not judged (too few to decide)
        family.add(key, [worse(v) for v in nights], [worse(row.value)], margin=row.noise, what=key, unit=row.unit)
        judged[key] = (len(past),)
    decided = family.decide()
    for key, row in rows.items():
        if row.previous is not None and row.value is None:
            row.regression, row.why = True, "no valid reading now"
        decision = decided.get(key)
        if decision is not None:
            row.decision = decision.as_dict()
            nights = judged[key][0]
            if decision.above:
                row.regression = True
                row.why = (f"worse by {decision.effect:.4g} {row.unit} ({decision.low:.4g} .. {decision.high:.4g} at "
                           f"{1 - 2 * decision.alpha:.4%}; a regression is more than {row.noise:.4g} {row.unit}, "
                           f"{NOISE_FLOOR:.0%} of the value; {nights} nights before)")
            elif nights < MIN_NIGHTS:
                row.why = f"not judged: {nights} night(s) before it, fewer than {MIN_NIGHTS} (the noise is not known)"
        if row.previous_verdict == "pass" and row.verdict == "fail":
            row.regression = True
            row.why = (row.why + "; " if row.why else "") + "was passing, now fails"
    ordered = list(rows.values())
    return {
        "record": str(record),
        "bench": head.get("bench"),
        "time_scale": head.get("time_scale"),
        "defects": head.get("defects") or [],
        "started": head.get("started"),
        "outcome": end["outcome"] if end else "crashed (no closing line)",
        "counts": end.get("counts") if end else None,
        "previous_record": before[-1]["record"] if before else None,
        "nights_before": len(before),
        "false_alarm_rate": decisions.SUMMARY_ALPHA,
        "rows": [asdict(r) for r in ordered],
        "regressions": [asdict(r) for r in ordered if r.regression],
        "failed": [asdict(r) for r in ordered if r.verdict == "fail"],
        "parts": [{k: p.get(k) for k in ("folder", "bench", "outcome")} for p in parts],
        "exploration": _exploration(lines),
    }


def _exploration(lines: list[dict]) -> dict | None:
    """The failure sequences explored, added up over the run's shards (and over the parts of a
    merged run): distinct stories told to the end, sequences run, and each shard's seed."""
    shards = [m for m in lines if m.get("type") == "measurement" and m.get("name") == "sequences_explored"]
    if not shards:
        return None
    attrs = [m.get("attrs") or {} for m in shards]
    return {"sequences_explored": sum(m["value"] or 0 for m in shards),
            "sequences_run": sum(a.get("sequences_run") or 0 for a in attrs),
            "shards": sorted((a.get("profile"), a.get("shard"), a.get("seed")) for a in attrs),
            "failed_shards": sum(m["verdict"] == "fail" for m in shards)}


def _fmt(value, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        text = f"{value:.4g}"
    else:
        text = str(value)
    return f"{text} {unit}".strip()


def to_markdown(summary: dict) -> str:
    out = [f"# lumion-hil summary: {summary['bench']}", ""]
    scale = summary["time_scale"]
    out.append(f"Run {summary['started']} ({summary['record']}): **{summary['outcome']}**"
               + (f", {', '.join(f'{v} {k}' for k, v in summary['counts'].items())}" if summary["counts"] else ""))
    out.append(f"Time scale {scale:g}" if isinstance(scale, (int, float)) else "Time scale: not recorded")
    if summary["defects"]:
        out.append(f"Defects: {', '.join(summary['defects'])}")
    out.append(f"Compared with: {summary['previous_record'] or 'no earlier run'}")
    if summary.get("parts"):
        out.append(f"Merged from {len(summary['parts'])} results: "
                   + ", ".join(f"{p['folder']} ({p['bench']}, {p['outcome']})" for p in summary["parts"]))
    explored = summary.get("exploration")
    if explored:
        out.append(f"Failure sequences: {explored['sequences_explored']:g} distinct stories told to the end, "
                   f"{explored['sequences_run']} sequences run, in {len(explored['shards'])} shard(s)"
                   + (f", {explored['failed_shards']} of them red" if explored["failed_shards"] else ""))
    out += ["", f"## Regressions since the previous run ({len(summary['regressions'])})", "",
            f"Tonight against the last {summary.get('nights_before', 0)} night(s): a regression is shown to be worse "
            f"by more than {NOISE_FLOOR:.0%} of the value (or a verdict that went from pass to fail), at a false-alarm "
            f"rate of {summary.get('false_alarm_rate', decisions.SUMMARY_ALPHA):.0%} for the whole summary; with fewer "
            f"than {MIN_NIGHTS} nights before, changes are shown, not judged.", ""]
    if summary["regressions"]:
        out += ["| measurement | now | before | change | why |", "|---|---|---|---|---|"]
        for r in summary["regressions"]:
            out.append(f"| {r['key']} | {_fmt(r['value'], r['unit'])} | {_fmt(r['previous'], r['unit'])} | "
                       f"{_fmt(None if r['change'] is None else r['change'] * 100, '%')} | {r['cause']}: {r['why']} |")
    else:
        out.append("None beyond run-to-run noise.")
    published = [r for r in summary["rows"] if r["published"]]
    out += ["", f"## Published numbers ({len(published)} measurements)", "",
            "A `model` figure is what an emulated bench computed from its own physics and settings: it can agree "
            "with a paper, it never confirms it. Only a `measured` figure from a real bench can, and not one that "
            "follows from what the harness itself set (a bench's own link shaping).", "",
            "| measurement | value | basis | published | ratio | verdict | change |", "|---|---|---|---|---|---|---|"]
    for r in published:
        verdict, agrees = r["verdict"], "agrees" if r["verdict"] != "fail" else "disagrees"
        if r.get("not_comparable"):
            verdict = f"{verdict}: {r['not_comparable']}"
        elif r.get("basis") == "model":
            verdict = f"{verdict} (model: {agrees}, confirms nothing)"
        elif r.get("follows_from"):
            verdict = f"{verdict} (follows from the bench's own shaping: {agrees}, confirms nothing)"
        basis = r.get("basis", "measured") + (f"; follows from {r['follows_from']}" if r.get("follows_from") else "")
        key = r["key"] + (f" (until {r['until']})" if r.get("until") else "")
        out.append(f"| {key} | {_fmt(r['value'], r['unit'])} | {basis} | "
                   f"{_fmt(r['published_value'], r['unit'])} ({r['published']}) | {_fmt(r['ratio'])} | {verdict} | "
                   f"{_fmt(None if r['change'] is None else r['change'] * 100, '%')} |")
    predicted = [r for r in summary["rows"] if r.get("predicted") is not None]
    if predicted:
        out += ["", f"## Predicted from the bench file alone ({len(predicted)})", "",
                "What the bench file predicts before anything runs, beside what the run observed: the gap, not "
                "the figure, is what the run adds.", "",
                "| measurement | observed | predicted | observed / predicted | basis | why |", "|---|---|---|---|---|---|"]
        for r in predicted:
            gap = r["value"] / r["predicted"] if r["value"] is not None and r["predicted"] else None
            out.append(f"| {r['key']} | {_fmt(r['value'], r['unit'])} | {_fmt(r['predicted'], r['unit'])} | "
                       f"{_fmt(gap)} | {r.get('basis', 'measured')} | {r['prediction']} |")
    out += ["", f"## Failed verdicts ({len(summary['failed'])})", ""]
    if summary["failed"]:
        out += ["| measurement | value | limits | cause |", "|---|---|---|---|"]
        for r in summary["failed"]:
            limits = f"{_fmt(r['low'])} .. {_fmt(r['high'])}"
            out.append(f"| {r['key']} | {_fmt(r['value'], r['unit'])} | {limits} {r['unit']} | {r['cause']} |")
    else:
        out.append("None.")
    return "\n".join(out) + "\n"


def newest_record(results: Path) -> Path | None:
    records = sorted((results / "records").glob("run-*.jsonl"), key=lambda p: p.stat().st_mtime)
    return records[-1] if records else None


def write_summary(results: Path) -> dict | None:
    """Summarize the newest run under ``results``: summary.md and summary.json beside the report,
    the run's values appended to summary-history.jsonl, and an Allure result carrying the
    summary (when there are Allure results). None when there is no run record."""
    record = newest_record(results)
    if record is None:
        return None
    history_path = results / "summary-history.jsonl"
    history = []
    if history_path.exists():
        for line in history_path.read_text(encoding="utf-8").splitlines():
            try:
                history.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    summary = summarize(record, history)
    (results / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    markdown = to_markdown(summary)
    (results / "summary.md").write_text(markdown, encoding="utf-8")
    if not any(h.get("record") == str(record) for h in history):
        entry = {"record": str(record), "time": summary["started"],
                 "values": {r["key"]: r["value"] for r in summary["rows"]},
                 "verdicts": {r["key"]: r["verdict"] for r in summary["rows"]}}
        with history_path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")
    allure_results = results / "allure-results"
    if allure_results.is_dir():
        _allure_result(allure_results, summary, markdown)
    return summary


def _allure_result(folder: Path, summary: dict, markdown: str) -> None:
    """The summary as an Allure result of its own (the Allure 2 results format, which Allure 3
    reads): failed when something regressed, with the summary attached."""
    attachment = f"{uuid.uuid4()}-attachment.md"
    (folder / attachment).write_text(markdown, encoding="utf-8")
    data = f"{uuid.uuid4()}-attachment.json"
    (folder / data).write_text(json.dumps(summary, indent=1), encoding="utf-8")
    regressions = summary["regressions"]
    now = int(time.time() * 1000)
    result = {
        "uuid": str(uuid.uuid4()), "historyId": "lumion-hil-regression-summary", "testCaseId": "lumion-hil-summary",
        "name": "regression summary", "fullName": "lumion-hil regression summary",
        "status": "failed" if regressions else "passed",
        "statusDetails": {"message": (f"{len(regressions)} regression(s) since the previous run: "
                                      + "; ".join(f"{r['key']} {r['why']}" for r in regressions[:10]))
                          if regressions else "no regression beyond run-to-run noise"},
        "stage": "finished", "start": now, "stop": now,
        "labels": [{"name": "feature", "value": "regression summary"}, {"name": "suite", "value": "summary"}]
        + ([{"name": "cause", "value": "regression summary"}] if regressions else []),
        "attachments": [{"name": "summary.md", "source": attachment, "type": "text/markdown"},
                        {"name": "summary.json", "source": data, "type": "application/json"}],
    }
    (folder / f"{result['uuid']}-result.json").write_text(json.dumps(result), encoding="utf-8")
