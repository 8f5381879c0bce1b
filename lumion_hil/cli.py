"""The ``lumion-hil`` command: its click commands (run, report, emulate, replay, fidelity,
calibrate, defects, nccl; the bench group is in lumion_hil/cli_bench.py). What they do beyond
reading their options is elsewhere: the suites' process (lumion_hil/supervision.py), the hold
on a labgrid place (lumion_hil/place_holding.py), the report (lumion_hil/html_report.py), and
how a command ends on an error (lumion_hil/exits.py)."""

from __future__ import annotations

import datetime
import json
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import click

from lumion_hil.cli_bench import bench
from lumion_hil.cli_options import bench_option, defect_option, scale_option
from lumion_hil.exits import fail, load_or_exit, read_transcript_or_exit
from lumion_hil.harness.errors import BenchFileError
from lumion_hil.harness.exit_codes import ExitCode
from lumion_hil.harness.records import how_it_ended, read_record
from lumion_hil.html_report import build_report
from lumion_hil.place_holding import holding_place
from lumion_hil.supervision import run_suites, suites_dir


class _Cli(click.Group):
    """Click's usage errors exit 2, which lumion-hil keeps for "interrupted": they exit 4."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> NoReturn:
        # always standalone: click's errors are handled here, and it exits (standalone_mode is click's signature's)
        try:
            status = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as exc:  # typos, missing or refused arguments
            exc.show()
            sys.exit(ExitCode.BENCH_OR_USAGE_ERROR)
        except click.ClickException as exc:  # a command that could not do its work (a broken input file)
            exc.show()
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            fail("Aborted!", ExitCode.INTERRUPTED, prefix="")
        sys.exit(status if isinstance(status, int) else 0)


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lumion-hil")
def main() -> None:
    """Hardware-in-the-loop tests for reconfigurable optical fabrics that swap a failed GPU for a
    spare through light paths.

    \b
    Start with:
      lumion-hil run                      the suites against the emulated bench, with a report
      lumion-hil emulate                  serve the emulated bench for any VISA tool
      lumion-hil bench check FILE         validate your own bench file
    """


# --- run ------------------------------------------------------------------------------------------


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@bench_option
@scale_option
@defect_option
@click.option("--results", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True, help="Folder for Allure results, run records and the HTML report.")
@click.option("--report/--no-report", default=True, show_default=True,
              help="Build the Allure HTML report after the run (needs Node 20 and `npm ci`).")
@click.option("--stop-within", type=click.FloatRange(min=1), default=None, metavar="SECONDS",
              help="After Ctrl-C or SIGTERM, how long to wait for the suites to restore the bench and "
                   "stop [default: twice deadlines.opc_s plus 30 s].")
@click.option("--explore", type=click.Choice(["ci", "nightly", "bench"]), default=None,
              help="How much the failure-sequence suite explores: ci (a thousand sequences, or as many as the "
                   "bench file's emulator.explore says, in 2 shards: add -n 2 to run them at once), nightly "
                   "(thousands, in 8 shards: add -n auto to spread them over workers, or --explore-shard K/N "
                   "--explore-seed S to run a part of them on each of N machines), bench (a few; the default).")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="For a bench that is a labgrid place: wait this long for the place, showing who holds it "
                   "[default: do not wait; busy: exit status 6].")
@click.option("--record", "record_transcript", is_flag=True,
              help="Record every instrument exchange and agent request and reply, with both clocks, to "
                   "RESULTS/records/transcript-<stamp>.jsonl (attached to the report): what lumion-hil "
                   "fidelity replays and lumion-hil calibrate fits a twin to.")
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
def run(bench_path: Path, time_scale: float | None, defects: tuple[str, ...], results: Path, report: bool,
        stop_within: float | None, explore: str | None, wait_s: float | None, record_transcript: bool,
        pytest_args: tuple[str, ...]) -> None:
    """Run the suites against a bench. Extra arguments go to pytest (e.g. -k recovery -x).

    Writes Allure results to RESULTS/allure-results and a run record (one JSON object a line,
    each measurement as it is taken, and a closing line saying how the run ended) to
    RESULTS/records/.

    Ctrl-C or SIGTERM stops the run at a safe point: the recovery in progress ends, the job
    stops, the baseline is restored and read back, then the run exits 2. A second Ctrl-C only
    cuts the waiting short, never a switch command.

    A bench that is a labgrid place (its place: section, or LG_PLACE and LG_COORDINATOR) is
    reserved and acquired on the lab's coordinator for the run (--wait to queue for it), and
    released at the end, whatever the end; the run record says who held it and when.

    \b
    Exit status:
      0  every test passed          4  bench or usage error
      1  a test failed              5  nothing collected
      2  interrupted                6  bench busy (another run holds it)
      3  the harness crashed
    """
    bench = load_or_exit(bench_path, time_scale, defects)
    suites = suites_dir()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    record = results / "records" / f"run-{stamp}.jsonl"
    allure_results = results / "allure-results"
    # pytest empties the results folder itself once the options are known to be good, so a
    # mistyped option never wipes the last run's results.
    cmd = [sys.executable, "-m", "pytest", str(suites), "--bench", str(bench_path), "--alluredir", str(allure_results),
           "--clean-alluredir", "--run-record", str(record), "--results-dir", str(results), "-p", "no:cacheprovider",
           "--rootdir", str(suites),
           # labgrid's own pytest plug-in (the labgrid extra) is not the suites' business: lumion-hil
           # holds the place itself (harness/places.py)
           "-p", "no:labgrid"]
    if time_scale is not None:
        cmd += ["--time-scale", str(time_scale)]
    for defect in defects:
        cmd += ["--defect", defect]
    if explore:
        cmd += ["--explore", explore]
    transcript_path = results / "records" / f"transcript-{stamp}.jsonl"
    if record_transcript:
        cmd += ["--transcript", str(transcript_path)]
    cmd += list(pytest_args)
    click.echo(f"lumion-hil: bench {bench.name!r} ({bench_path})")
    grace = stop_within if stop_within is not None else 2 * bench.deadlines.opc_s + 30
    with holding_place(bench, wait_s) as place_env:
        status = run_suites(cmd, grace, place_env)
        held = place_env.get("LUMION_HIL_PLACE")
    if held and record.exists():  # the record says when the place was let go, after the run's own end
        with record.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"type": "note", "text": "place released", "place": json.loads(held)["place"],
                                 "time": datetime.datetime.now().isoformat(timespec="milliseconds")}) + "\n")
    if record.exists():
        click.echo(f"lumion-hil: run record {record} ({how_it_ended(record)})")
    if record_transcript and transcript_path.exists():
        click.echo(f"lumion-hil: transcript {transcript_path}")
    if status == ExitCode.NOTHING_COLLECTED:
        click.echo("lumion-hil: no test was collected, or every one was skipped (above), so nothing was judged: "
                   "treating it as a failure", err=True)
    elif status == ExitCode.BENCH_OR_USAGE_ERROR:
        click.echo("lumion-hil: usage or bench error (above); nothing was run and no results were changed", err=True)
    elif status == ExitCode.INTERRUPTED:
        click.echo("lumion-hil: interrupted; the bench was restored to its baseline", err=True)
    if report and status not in (ExitCode.BENCH_OR_USAGE_ERROR, ExitCode.BENCH_BUSY) and allure_results.is_dir():
        report_status = build_report(results, required=False)
        if report_status != 0 and status == 0:
            status = report_status
    sys.exit(status)


# --- report -----------------------------------------------------------------------------------------


@main.command("report")
@click.argument("parts", nargs=-1, type=click.Path(file_okay=False, path_type=Path))
@click.option("--results", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True, help="Folder given to `lumion-hil run --results`; with PARTS, the folder the "
                                      "merged results are written to.")
def report_cmd(parts: tuple[Path, ...], results: Path) -> None:
    """Summarize the newest run (RESULTS/summary.md and summary.json: each published number's
    measured value, ratio and verdict, and what regressed since the previous run) and build the
    Allure HTML report (RESULTS/allure-report) with history from earlier runs.

    With PARTS (results folders of several runs: the parts of a profile spread over a CI matrix
    with --explore-shard K/N, or several benches), merge their run records, Allure results and
    stories into RESULTS first, and summarize them as one run: the failure sequences explored are
    added up over every shard, and the reference paths they took are judged over every part (in
    the ci profile on a bench that makes every fault, none may be missed). It then exits as the
    merged run ended: as its worst part did, or 1 where a path was missed over every part.

    \b
    Example (four machines each ran one part of the nightly profile):
      lumion-hil report part1 part2 part3 part4 --results nightly
    """
    ended = 0  # without PARTS: as the report's build ends
    if parts:
        from lumion_hil.reports.merge import MergeError, merge_results

        try:
            merged = merge_results(list(parts), results)
        except MergeError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"lumion-hil: merged {len(parts)} results into {results} ({merged})")
        lines = list(read_record(merged))
        for m in lines:  # what only the parts together show (reports/merge.py)
            if m.get("over_parts") and m.get("verdict") == "fail":
                click.echo(f"lumion-hil: over every part, {m['name']} = {m['value']:g} (limit {m['high']:g}): "
                           f"{m['test']}: missed {', '.join(m['attrs']['missed'])}", err=True)
        # as the merged run ended (its worst part, a path missed over every part)
        ended = next((m["exit_status"] for m in reversed(lines) if m.get("type") == "end"), int(ExitCode.CRASHED))
    built = build_report(results)
    sys.exit(ended or built)


# --- emulate --------------------------------------------------------------------------------------


@main.command()
@bench_option
@scale_option
@defect_option
@click.option("--bench-out", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write a bench file pointing at what is served: runs against it treat the "
                   "emulated bench like a real one that outlives them.")
@click.option("--fault", "faults", multiple=True, metavar="NAME=FAULT[=SECONDS]",
              help="Serve an instrument (or an emulated host's agent) misbehaving, e.g. ocs=stall, "
                   "pm-lab=delay=30, ocs=power_loss=2, host1=drop (repeatable). Instrument faults: "
                   "drop, stall, delay, partial, garbage, errors, out_of_range, busy, power_loss; "
                   "a host's take effect through --bench-out.")
def emulate(bench_path: Path, time_scale: float | None, defects: tuple[str, ...], bench_out: Path | None,
            faults: tuple[str, ...]) -> None:
    """Serve the emulated instruments (and hosts) of a bench in the foreground.

    Prints each instrument's VISA resource string, so any VISA tool or script can talk to it
    (pyvisa: ResourceManager('@py').open_resource(..., read_termination='\\n')), and for those
    that also speak VXI-11 (the N77xx) a line `vxi11 NAME RESOURCE`: TCPIP0::127.0.0.N::inst0::INSTR
    where this can serve the port mapper (port 111: as root), else pyvisa-py's
    TCPIP0::127.0.0.N,PORT::inst0::INSTR. Ctrl-C stops."""
    import yaml

    from lumion_hil.harness.backends import load_backend
    from lumion_hil.instruments.emulators.bench import EmulatedBench

    bench = load_or_exit(bench_path, time_scale, defects)
    if not bench.any_emulated:
        raise click.ClickException(f"bench {bench.name!r} has no emulated instrument (resource: emulated)")
    instrument_faults, bench = _faults(bench, faults)
    stop = threading.Event()
    # Ctrl-C and SIGTERM stop it, also where SIGINT was ignored when it started (a script's
    # background job inherits SIGINT ignored, and `kill -INT` would otherwise do nothing)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with load_backend(bench) as emulated:
        if not isinstance(emulated, EmulatedBench):
            raise click.ClickException(f"bench {bench.name!r}: its backend ({type(emulated).__name__}) serves no "
                                       "emulated bench")
        for name, fault in instrument_faults:
            emulated.set_fault(name, fault)
            click.echo(f"lumion-hil: {name}: fault {fault}", err=True)
        click.echo(f"lumion-hil: emulating bench {bench.name!r} (time scale {bench.emulator.time_scale:g})")
        for name, resource in emulated.resources.items():
            spec = bench.instruments[name]
            click.echo(f"{name}\t{spec.model}\t{resource}")
        for name, spec in bench.instruments.items():
            if not spec.emulated:
                click.echo(f"{name}\t{spec.model}\t(not emulated: {spec.resource})")
        for name, server in getattr(emulated, "vxi11", {}).items():
            click.echo(f"vxi11\t{name}\t{server.resource}")  # the same instrument, over VXI-11
        if emulated.world_service is not None:
            click.echo(f"hosts\tworld\t{emulated.world_service.address}")
            for host in bench.topology.hosts:  # each as `bench discover --host NAME=ADDRESS` takes it
                if host.emulated:
                    click.echo(f"host\t{host.name}\tworld:{emulated.world_service.address}")
        if bench_out:
            bench_out.write_text(yaml.safe_dump(emulated.served_bench(), sort_keys=False), encoding="utf-8")
            click.echo(f"lumion-hil: wrote {bench_out}", err=True)
        click.echo("lumion-hil: ready; Ctrl-C to stop", err=True)
        sys.stdout.flush()
        while not stop.wait(0.5):
            pass
    click.echo("lumion-hil: stopped", err=True)


def _faults(bench, faults: tuple[str, ...]):
    """``NAME=FAULT[=SECONDS]`` options: (instrument, fault) pairs to switch on once served, and the
    bench with each named host's agent faults added. A wrong name or fault is a usage error."""
    from lumion_hil.instruments.backend import AGENT_FAULTS, INSTRUMENT_FAULTS as FAULTS

    instrument_faults: list[tuple[str, str]] = []
    host_faults: dict[str, list[str]] = {}
    for option in faults:
        name, sep, fault = option.partition("=")
        kind, _, value = fault.partition("=")
        if not sep or not fault:
            raise click.BadParameter(f"{option!r}: expected NAME=FAULT[=SECONDS], e.g. ocs=stall", param_hint="--fault")
        hosts = {h.name: h for h in bench.topology.hosts if h.emulated}
        known = FAULTS if name in bench.instruments else AGENT_FAULTS if name in hosts else None
        if known is None:
            names = ", ".join([n for n, i in bench.instruments.items() if i.emulated] + list(hosts))
            raise click.BadParameter(f"{option!r}: no emulated instrument or host {name!r} in bench "
                                     f"{bench.name!r}; emulated: {names}", param_hint="--fault")
        if name in bench.instruments and not bench.instruments[name].emulated:
            raise click.BadParameter(f"{option!r}: {name} is not emulated ({bench.instruments[name].resource})",
                                     param_hint="--fault")
        if kind not in known:
            raise click.BadParameter(f"{option!r}: unknown fault {kind!r}; known: {', '.join(known)}",
                                     param_hint="--fault")
        try:
            float(value) if value else None
        except ValueError:
            raise click.BadParameter(f"{option!r}: {value!r} is not a number of seconds", param_hint="--fault") from None
        if name in bench.instruments:
            instrument_faults.append((name, fault))
        else:
            host_faults.setdefault(name, []).append(fault)
    if host_faults:
        faulty = [h.model_copy(update={"emulation": h.emulation.model_copy(
                      update={"faults": [*h.emulation.faults, *host_faults.get(h.name, [])]})})
                  for h in bench.topology.hosts]
        bench = bench.model_copy(update={"topology": bench.topology.model_copy(update={"hosts": faulty})})
    return instrument_faults, bench


@main.command("replay")
@click.argument("story_file", metavar="STORY", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@bench_option
@scale_option
@defect_option
def replay_cmd(story_file: Path, bench_path: Path, time_scale: float | None, defects: tuple[str, ...]) -> None:
    """Tell a failure sequence again, step by step, on any bench that has the hosts and NICs it
    names (a real one included), and judge every promise after each step. STORY is a story file
    written by the failure-sequence suite (RESULTS/stories/).

    Exit status: 0 every promise kept, 1 one was broken (the story reproduces), 4 the story or
    the bench cannot be read, or the bench lacks a part the story names, 6 bench busy."""
    from lumion_hil.harness.errors import BenchInUseError, HarnessError
    from lumion_hil.harness.explorer import replay
    from lumion_hil.harness.interrupts import INTERRUPTS
    from lumion_hil.harness.session import BenchSession
    from lumion_hil.harness.stories import Story, StoryError

    bench = load_or_exit(bench_path, time_scale, defects)
    try:
        story = Story.load(story_file)
    except StoryError as exc:
        fail(str(exc))
    click.echo(f"lumion-hil: story {story_file} ({len(story.steps)} step(s), told on {story.bench!r}"
               f"{f', seed {story.seed}' if story.seed is not None else ''}) on bench {bench.name!r}")
    if story.broke:
        click.echo(f"lumion-hil: it broke there: {story.broke}")
    INTERRUPTS.install()
    try:
        with BenchSession.open(bench) as session:
            kept = replay(story, session, log=click.echo)
    except BenchInUseError as exc:
        fail(str(exc), ExitCode.BENCH_BUSY)
    except (StoryError, HarnessError) as exc:
        fail(str(exc))
    click.echo("lumion-hil: every promise kept" if kept else "lumion-hil: a promise was broken (above)")
    sys.exit(ExitCode.PASSED if kept else ExitCode.TESTS_FAILED)


@main.command("fidelity")
@click.argument("transcript_file", metavar="TRANSCRIPT", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@bench_option
@scale_option
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the report as JSON to this file.")
def fidelity_cmd(transcript_file: Path, bench_path: Path, time_scale: float | None, json_out: Path | None) -> None:
    """How far an emulated bench is from a recorded one. Replays TRANSCRIPT (lumion-hil run
    --record) against the bench's emulators, every exchange in order and at its recorded time,
    and reports side by side: the replies that differ (text; errors on one side only), and as
    decisions with a stated false-alarm rate (0.5% for the whole report) the timing of each kind
    of exchange (switch per connection and its spread, light arrival, link up per host, agent
    round trip, job start) and the light at each detector, each with its effect, interval and
    margin; the bench-file parameters the differences point at, and the differences none of
    calibrate's parameters explains.

    The bench runs at the transcript's time scale unless --time-scale says otherwise.

    \b
    Exit status: 0 no difference beyond its margin is shown, 1 one is,
    4 the transcript or the bench cannot be read (or the bench is not emulated)."""
    from lumion_hil.harness.fidelity import fidelity, render

    header = read_transcript_or_exit(transcript_file)
    bench = load_or_exit(bench_path, time_scale if time_scale is not None else header.get("time_scale"))
    click.echo(f"lumion-hil: replaying {transcript_file} (recorded on {header.get('bench')!r}) against bench "
               f"{bench.name!r} ({bench_path})")
    try:
        report = fidelity(bench, transcript_file)
    except ValueError as exc:
        fail(str(exc))
    click.echo(render(report), nl=False)
    if json_out is not None:
        json_out.write_text(json.dumps(report, indent=1))
    sys.exit(0 if report["match"] else 1)


@main.command("calibrate")
@click.argument("transcript_files", metavar="TRANSCRIPT...", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@bench_option
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Where to write the twin's bench file.")
@click.option("--refine/--no-refine", default=True, show_default=True,
              help="Replay the first transcript against the first fit once and correct each timing by what "
                   "still differs (the software time the twin adds on its own).")
def calibrate_cmd(transcript_files: tuple[Path, ...], bench_path: Path, output: Path, refine: bool) -> None:
    """A digital twin of a recorded bench: BENCH's emulation sections fitted to the TRANSCRIPTs
    (lumion-hil run --record): switching time per connection (mean and spread), loss per port
    pair, meter and monitor noise, NIC lock and bring-up per host, the job's start-up. Every
    fitted number is written with its source (the transcripts, how many samples). The twin is an
    emulated bench: run the suites on it, or lumion-hil fidelity against the recording.

    \b
    Exit status: 0 the twin was written, 4 a transcript or the bench cannot be read."""
    from lumion_hil.harness.calibrate import calibrate
    from lumion_hil.harness.config import parse_bench

    for path in transcript_files:
        read_transcript_or_exit(path)
    load_or_exit(bench_path, None)

    def load(text: str, scale: float):
        return parse_bench(text, str(bench_path), time_scale=scale)

    try:
        text = calibrate(bench_path, list(transcript_files), load, refine_once=refine)
    except (ValueError, BenchFileError) as exc:
        fail(str(exc))
    output.write_text(text)
    fitted = [line for line in text.splitlines() if line.startswith("#   ")]
    click.echo(f"lumion-hil: twin {output} ({len(fitted)} numbers fitted from {len(transcript_files)} transcript(s))")
    for line in fitted:
        click.echo(line[4:])


@main.command("defects")
def defects_cmd() -> None:
    """List the defects an emulated bench (or the controller) can be given, to see which verdict
    each turns red: lumion-hil run --defect NAME[=VALUE]."""
    from lumion_hil.harness.defects import CATALOGUE

    width = max(len(n) for n in CATALOGUE)
    for defect in CATALOGUE.values():
        default = f" (default {defect.default})" if defect.default else ""
        kind = "device" if defect.device else "controller"
        click.echo(f"{defect.name:{width}s}  {kind:10s}  {defect.description}{default}")


# --- bench (lumion_hil/cli_bench.py) ----------------------------------------------------------------

main.add_command(bench)


# --- nccl ----------------------------------------------------------------------------------------


@main.group()
def nccl() -> None:
    """Work with nccl-tests output."""


@nccl.command("parse")
@click.argument("file", type=click.File("r"))
def nccl_parse(file) -> None:
    """Parse nccl-tests output (text from any version, with launcher prefixes and log lines, or
    the JSON of -J) and print it as JSON: {"runs": [...]}, one entry per test in the log, each
    with its sizes, times in microseconds, algbw and busbw in GB/s as printed (from the time
    only where the log printed 0.00: each figure's bandwidth_from says which), wrong counts (or
    the old error magnitudes), the average. FILE may be - for standard input."""
    import json

    from lumion_hil.instruments.gpu_host.nccl import NcclParseError, parse_runs

    try:
        runs = parse_runs(file.read(), file.name)
    except NcclParseError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps({"runs": [run.to_dict() for run in runs]}, indent=1))
