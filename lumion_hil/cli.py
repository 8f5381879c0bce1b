"""The ``lumion-hil`` command."""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import click

from lumion_hil.harness.config import port_ranges, bench_json_schema, load_bench
from lumion_hil.harness.errors import BenchFileError
from lumion_hil.harness.exit_codes import ExitCode
from lumion_hil.harness.records import how_it_ended

from lumion_hil.benches import bench_file

# A checkout holds the Allure CLI (node_modules) and its configuration; an installed package
# looks for them in the working directory instead.
_CHECKOUT = Path(__file__).resolve().parent.parent
PROJECT_ROOT = _CHECKOUT if (_CHECKOUT / "allurerc.mjs").exists() else Path.cwd()
DEFAULT_BENCH = bench_file("emulated.yaml")

_bench_option = click.option(
    "--bench", "bench_path", type=click.Path(dir_okay=False, path_type=Path),
    default=lambda: os.environ.get("LUMION_HIL_BENCH", str(DEFAULT_BENCH)), show_default="benches/emulated.yaml",
    help="Bench file (env LUMION_HIL_BENCH).")
_scale_option = click.option(
    "--time-scale", type=click.FloatRange(min=0, min_open=True), default=None,
    help="Multiply every emulated latency by this factor (0.1 runs ten times faster).")
_defect_option = click.option(
    "--defect", "defects", multiple=True, metavar="NAME[=VALUE]",
    help="A defect of the emulated bench or the controller (repeatable); `lumion-hil defects` lists them.")


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
            click.echo("Aborted!", err=True)
            sys.exit(ExitCode.INTERRUPTED)
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
@_bench_option
@_scale_option
@_defect_option
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
    bench = _load_or_exit(bench_path, time_scale, defects)
    suites = _suites_dir()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    record = results / "records" / f"run-{stamp}.jsonl"
    allure_results = results / "allure-results"
    # pytest empties the results folder itself once the options are known to be good, so a
    # mistyped option never wipes the last run's results.
    cmd = [sys.executable, "-m", "pytest", str(suites), "--bench", str(bench_path), "--alluredir", str(allure_results),
           "--clean-alluredir", "--run-record", str(record), "-p", "no:cacheprovider", "--rootdir", str(suites),
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
    with _holding_place(bench, wait_s) as place_env:
        status = _run_suites(cmd, grace, place_env)
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
        report_status = _build_report(results, required=False)
        if report_status != 0 and status == 0:
            status = report_status
    sys.exit(status)


@contextlib.contextmanager
def _holding_place(bench, wait_s: float | None):
    """For a bench that is a labgrid place: reserve, wait for (``wait_s``) and acquire it, and
    release it at the end whatever happens. Yields the environment that tells the suites what
    the place gives (empty for a bench without one). Busy: exit 6; a bad place: exit 4."""
    from lumion_hil.harness.places import PLACE_ENV, PlaceBusy, PlaceError, hold, place_spec, wanted_from_place

    spec = place_spec(bench)
    if spec is None:
        yield {}
        return
    try:
        place, info = hold(spec, wanted_from_place(bench), wait_s,
                           lambda text: click.echo(f"lumion-hil: {text}", err=True))
    except PlaceBusy as exc:
        click.echo(f"lumion-hil: bench busy: {exc}", err=True)
        sys.exit(ExitCode.BENCH_BUSY)
    except PlaceError as exc:
        click.echo(f"lumion-hil: {exc}", err=True)
        sys.exit(ExitCode.BENCH_OR_USAGE_ERROR)
    click.echo(f"lumion-hil: acquired {spec.describe().replace(repr(spec.name), repr(info['place']), 1)} as "
               f"{info['acquired_by']}" + (f", switch ports {port_ranges(info['ports'])}" if info["ports"] else ""))
    try:
        yield {PLACE_ENV: json.dumps(info)}
    finally:
        try:
            place.release()
            click.echo(f"lumion-hil: released place {info['place']!r}")
        except PlaceError as exc:
            click.echo(f"lumion-hil: could not release place {info['place']!r}: {exc}; `lumion-hil bench release` "
                       "releases it", err=True)
        finally:
            place.close()


def _run_suites(cmd: list[str], grace_s: float, extra_env: dict[str, str] | None = None) -> int:
    """Run pytest in its own process group, so a terminal's Ctrl-C reaches this wrapper alone;
    forward SIGINT and SIGTERM to pytest (which stops at a safe point), and wait for it, at
    most ``grace_s`` after the first signal. Only then, or if this wrapper is killed, is the
    whole group killed. Returns pytest's exit status."""
    env = dict(os.environ, LUMION_HIL_RUN=os.environ.get("LUMION_HIL_RUN") or f"{os.getpid()}-{time.time_ns()}",
               LUMION_HIL_WRAPPER_PID=str(os.getpid()), **(extra_env or {}))
    child = subprocess.Popen(cmd, start_new_session=True, env=env)
    signals: list[int] = []
    first_at: list[float] = []

    def forward(signum, frame) -> None:
        signals.append(signum)
        if len(signals) == 1:
            first_at.append(time.monotonic())
            click.echo(f"\nlumion-hil: {signal.Signals(signum).name}: stopping at a safe point (restoring the "
                       f"baseline); waiting up to {grace_s:g} s; Ctrl-C again to cut the waits short", err=True)
        elif len(signals) == 2:
            click.echo("lumion-hil: second interrupt: cutting the waits short (switch commands still finish)",
                       err=True)
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                return child.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
            if first_at and time.monotonic() - first_at[0] > grace_s:
                click.echo(f"lumion-hil: the suites did not stop within {grace_s:g} s; killing them. The switch "
                           "may not be at its baseline: run `lumion-hil bench restore` before the next run", err=True)
                _kill_group(child)
                return ExitCode.INTERRUPTED
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _kill_group(child)


def _kill_group(child: subprocess.Popen) -> None:
    """Kill whatever is left of the suites' process group (pytest, agents it started)."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    child.wait()


def _suites_dir() -> Path:
    spec = importlib.util.find_spec("lumion_hil.test_suites")
    if spec is None or not spec.submodule_search_locations:
        raise click.ClickException("the test_suites package is not installed; run `pip install -e .`")
    return Path(list(spec.submodule_search_locations)[0])


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
    added up over every shard.

    \b
    Example (four machines each ran one part of the nightly profile):
      lumion-hil report part1 part2 part3 part4 --results nightly
    """
    if parts:
        from lumion_hil.reports.merge import MergeError, merge_results

        try:
            merged = merge_results(list(parts), results)
        except MergeError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"lumion-hil: merged {len(parts)} results into {results} ({merged})")
    sys.exit(_build_report(results))


def _build_report(results: Path, required: bool = True) -> int:
    """Write the summary, then build the HTML report. Without the Allure CLI installed,
    ``lumion-hil run`` only warns (the suites' verdict stands); ``lumion-hil report`` fails."""
    from lumion_hil.reports.summary import write_summary

    summary = write_summary(results)
    if summary is not None:
        regressions = summary["regressions"]
        click.echo(f"lumion-hil: summary {results / 'summary.md'}: {len(regressions)} regression(s) since "
                   f"{summary['previous_record'] or 'no earlier run'}")
        for r in regressions[:10]:
            click.echo(f"lumion-hil:   regressed: {r['key']}: {r['value']} {r['unit']} (was {r['previous']}): {r['why']}")
    allure_results = results / "allure-results"
    if not allure_results.is_dir() or not any(allure_results.iterdir()):
        click.echo(f"lumion-hil: no Allure results in {allure_results}; run the suites first", err=True)
        return 1
    allure_bin = PROJECT_ROOT / "node_modules" / ".bin" / "allure"
    if not allure_bin.exists():
        click.echo("lumion-hil: the Allure CLI is not installed; run `npm ci` in the project root "
                   "(Node 20) to get the HTML report", err=True)
        return 1 if required else 0
    output = results / "allure-report"
    env = dict(os.environ, ALLURE_NO_ANALYTICS="true",
               LUMION_HIL_HISTORY=str((results / "history.jsonl").resolve()))
    cmd = [str(allure_bin), "generate", str(allure_results.resolve()), "--config",
           str(PROJECT_ROOT / "allurerc.mjs"), "--output", str(output.resolve())]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=PROJECT_ROOT)
    if proc.returncode != 0:
        click.echo(f"lumion-hil: allure generate failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}", err=True)
        return proc.returncode
    click.echo(f"lumion-hil: report {output / 'index.html'} (history {results / 'history.jsonl'})")
    return 0


# --- emulate --------------------------------------------------------------------------------------


@main.command()
@_bench_option
@_scale_option
@_defect_option
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

    bench = _load_or_exit(bench_path, time_scale, defects)
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
@_bench_option
@_scale_option
@_defect_option
def replay_cmd(story_file: Path, bench_path: Path, time_scale: float | None, defects: tuple[str, ...]) -> None:
    """Tell a failure sequence again, step by step, on any bench that has the hosts and NICs it
    names (a real one included), and judge every promise after each step. STORY is a story file
    written by the failure-sequence suite (RESULTS/stories/).

    Exit status: 0 every promise kept, 1 one was broken (the story reproduces), 4 the story or
    the bench cannot be read, or the bench lacks a part the story names, 6 bench busy."""
    from lumion_hil.harness.errors import BenchInUseError, HarnessError
    from lumion_hil.harness.exploration import StoryError, Story, replay
    from lumion_hil.harness.interrupts import INTERRUPTS
    from lumion_hil.harness.session import BenchSession

    bench = _load_or_exit(bench_path, time_scale, defects)
    try:
        story = Story.load(story_file)
    except StoryError as exc:
        click.echo(f"lumion-hil: {exc}", err=True)
        sys.exit(ExitCode.BENCH_OR_USAGE_ERROR)
    click.echo(f"lumion-hil: story {story_file} ({len(story.steps)} step(s), told on {story.bench!r}"
               f"{f', seed {story.seed}' if story.seed is not None else ''}) on bench {bench.name!r}")
    if story.broke:
        click.echo(f"lumion-hil: it broke there: {story.broke}")
    INTERRUPTS.install()
    try:
        with BenchSession.open(bench) as session:
            kept = replay(story, session, log=click.echo)
    except BenchInUseError as exc:
        click.echo(f"lumion-hil: {exc}", err=True)
        sys.exit(ExitCode.BENCH_BUSY)
    except (StoryError, HarnessError) as exc:
        click.echo(f"lumion-hil: {exc}", err=True)
        sys.exit(ExitCode.BENCH_OR_USAGE_ERROR)
    click.echo("lumion-hil: every promise kept" if kept else "lumion-hil: a promise was broken (above)")
    sys.exit(ExitCode.PASSED if kept else ExitCode.TESTS_FAILED)


def _read_transcript_or_exit(path: Path) -> dict:
    from lumion_hil.instruments import transcript

    try:
        return transcript.read(path)[0]
    except ValueError as exc:
        click.echo(f"lumion-hil: {exc}", err=True)
        sys.exit(ExitCode.BENCH_OR_USAGE_ERROR)


@main.command("fidelity")
@click.argument("transcript_file", metavar="TRANSCRIPT", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_bench_option
@_scale_option
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

    header = _read_transcript_or_exit(transcript_file)
    bench = _load_or_exit(bench_path, time_scale if time_scale is not None else header.get("time_scale"))
    click.echo(f"lumion-hil: replaying {transcript_file} (recorded on {header.get('bench')!r}) against bench "
               f"{bench.name!r} ({bench_path})")
    try:
        report = fidelity(bench, transcript_file)
    except ValueError as exc:
        click.echo(f"lumion-hil: {exc}", err=True)
        sys.exit(ExitCode.BENCH_OR_USAGE_ERROR)
    click.echo(render(report), nl=False)
    if json_out is not None:
        json_out.write_text(json.dumps(report, indent=1))
    sys.exit(0 if report["match"] else 1)


@main.command("calibrate")
@click.argument("transcript_files", metavar="TRANSCRIPT...", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_bench_option
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
        _read_transcript_or_exit(path)
    _load_or_exit(bench_path, None)

    def load(text: str, scale: float):
        return parse_bench(text, str(bench_path), time_scale=scale)

    try:
        text = calibrate(bench_path, list(transcript_files), load, refine_once=refine)
    except (ValueError, BenchFileError) as exc:
        click.echo(f"lumion-hil: {exc}", err=True)
        sys.exit(ExitCode.BENCH_OR_USAGE_ERROR)
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


# --- bench ----------------------------------------------------------------------------------------


@main.group()
def bench() -> None:
    """Check bench files and export their schema; commission a bench: discover, wiring, budget."""


@bench.command("check")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
def bench_check(files: tuple[Path, ...]) -> None:
    """Validate bench files: every problem with its field, line and reason. Exit 1 if any is bad."""
    bad = 0
    for file in files:
        try:
            b = load_bench(file)
        except BenchFileError as exc:
            click.echo(str(exc), err=True)
            bad += 1
            continue
        emulated = sum(1 for i in b.instruments.values() if i.emulated)
        click.echo(f"{file}: ok: bench {b.name!r}, {len(b.instruments)} instrument(s) ({emulated} emulated), "
                   f"{len(b.topology.hosts)} host(s), {len(b.detectors)} detector(s), "
                   f"{len(b.safety.baseline)} baseline cross-connect(s)")
    sys.exit(1 if bad else 0)


@bench.command("restore")
@_bench_option
def bench_restore(bench_path: Path) -> None:
    """Put a bench's switch back to its baseline cross-connects and read it back (after a run
    that was killed). Takes the bench's lock (or its labgrid place) like a run; protected ports,
    and on a shared switch the other benches' ports, are left as they are."""
    from lumion_hil.harness.errors import BenchInUseError, HarnessError
    from lumion_hil.harness.session import BenchSession

    bench = _load_or_exit(bench_path, None)
    from lumion_hil.harness.backends import backend_name

    if backend_name(bench) == "netns":  # the rack in a box: what a run killed outright left behind
        from lumion_hil.instruments.emulators.rack import Rack

        # A run whose wrapper was killed is still stopping at a safe point: wait for it as a run's
        # own Ctrl-C is waited for (twice the OPC deadline and 30 s), then remove what is left.
        removed, left = Rack.restore_after_killed_runs(wait_s=2 * bench.deadlines.opc_s + 30)
        click.echo(f"bench {bench.name!r}: " + (f"removed {', '.join(removed)}" if removed
                                                else "no rack left behind by a run that ended without tearing it down"))
        if any(left.values()):
            click.echo(f"lumion-hil: bench {bench.name!r} is not restored: still on this machine, owned by no live run: "
                       + "; ".join(f"{kind}: {', '.join(names)}" for kind, names in left.items() if names), err=True)
            sys.exit(ExitCode.BENCH_OR_USAGE_ERROR)
        running = Rack.leftovers()
        if any(running.values()):
            click.echo(f"lumion-hil: racks of runs still going (left as they are): {running['netns']}", err=True)
        return
    if bench.all_emulated:
        raise click.ClickException(f"bench {bench.name!r} is emulated in-process: there is nothing to restore")
    try:
        with _holding_place(bench, None) as place_env:  # a labgrid place: held like a run holds it
            if place_env:
                os.environ.update(place_env)
                bench = _load_or_exit(bench_path, None)  # with the place's addresses and ports
            with BenchSession.open(bench, restore=False) as session:
                if session.switch is None:
                    raise HarnessError(f"bench {bench.name!r} has no optical switch to restore")
                session.restore_baseline(verify=True)
                click.echo(f"{session.switch.name}: at its baseline ({len(bench.safety.baseline)} cross-connects)")
    except BenchInUseError as exc:
        click.echo(f"lumion-hil: {exc}", err=True)
        sys.exit(ExitCode.BENCH_BUSY)
    except HarnessError as exc:
        click.echo(f"lumion-hil: {exc}", err=True)
        sys.exit(ExitCode.BENCH_OR_USAGE_ERROR)


@bench.command("release")
@_bench_option
@click.option("--force", is_flag=True, help="Release it even where lumion-hil cannot tell that its holder is gone "
                                            "(a run on another machine, or not a lumion-hil run).")
def bench_release(bench_path: Path, force: bool) -> None:
    """Release a bench's labgrid place that a run left acquired (a run killed outright), and
    cancel the reservation it held; says who held it. Nothing else is taken over: a place held
    by a live run on this machine is never released here, and one held from another machine (or
    not by a lumion-hil run) only with --force."""
    from lumion_hil.harness.places import LabgridPlace, PlaceError, place_spec

    bench = _load_or_exit(bench_path, None)
    spec = place_spec(bench)
    if spec is None or spec.name is None:
        raise click.ClickException(f"bench {bench.name!r} names no labgrid place (a place: section with a name, or "
                                   "LG_PLACE): its lock is a file on this machine, freed when its run ends")
    place = LabgridPlace(spec)
    try:
        holder = place.holder()
        if not holder.acquired_by:
            click.echo(f"{spec.describe()}: not acquired; nothing to release")
            return
        if holder.stale is False:
            raise click.ClickException(f"{spec.describe()} is held by a run that is still going: {holder.describe()}")
        if holder.stale is None and not force:
            raise click.ClickException(f"{spec.describe()} is held by {holder.describe()}: from here lumion-hil cannot "
                                       "tell whether that holder is gone; ask them, or release it with --force")
        place.release_stale()
        click.echo(f"{spec.describe()}: released; it was acquired by {holder.acquired_by}"
                   + (f" ({holder.comment})" if holder.comment else ""))
    except PlaceError as exc:
        click.echo(f"lumion-hil: {exc}", err=True)
        sys.exit(ExitCode.BENCH_OR_USAGE_ERROR)
    finally:
        place.close()


# --- bench: commissioning (discover, wiring, budget) -------------------------------------------
# Thin wrappers: the work is in harness/commissioning/. Each opens the bench as a run does (its
# lock or labgrid place held, the switch guarded) and restores the baseline on every exit.


@contextlib.contextmanager
def _stopping_safely(stopped: str):
    """Ctrl-C and SIGTERM stop what runs inside at a safe point (exit 2, saying ``stopped``);
    busy is exit 6, a bench or instrument error 4."""
    from lumion_hil.harness.errors import BenchInUseError, HarnessError
    from lumion_hil.harness.interrupts import INTERRUPTS, RunInterrupted
    from lumion_hil.instruments.protocols import InstrumentError

    INTERRUPTS.reset()
    INTERRUPTS.install()
    try:
        with INTERRUPTS.armed():
            yield
    except RunInterrupted as exc:
        click.echo(f"lumion-hil: {exc}: stopped; {stopped}", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    except BenchInUseError as exc:
        click.echo(f"lumion-hil: {exc}", err=True)
        sys.exit(ExitCode.BENCH_BUSY)
    except (HarnessError, InstrumentError) as exc:
        click.echo(f"lumion-hil: {exc}", err=True)
        sys.exit(ExitCode.BENCH_OR_USAGE_ERROR)
    finally:
        INTERRUPTS.uninstall()


@contextlib.contextmanager
def _commissioning(bench, bench_path: Path, time_scale: float | None, defects: tuple):
    """The bench open for a walk, as a run opens it (its lock or labgrid place held), stopping
    safely: yields the session, whose closing restores the baseline whatever the exit."""
    from lumion_hil.harness.session import BenchSession

    with _stopping_safely("the switch is back at its baseline and every transmitter on"):
        with _holding_place(bench, None) as place_env:
            if place_env:
                os.environ.update(place_env)
                bench = _load_or_exit(bench_path, time_scale, defects)  # with the place's addresses and ports
            with BenchSession.open(bench) as session:
                yield session


def _progress(line: str) -> None:
    click.echo(f"  {line}")


@bench.command("discover")
@click.option("-i", "--instrument", "resources", multiple=True, metavar="RESOURCE",
              help="An instrument's address: a VISA resource (TCPIP0::10.0.0.5::5025::SOCKET, USB0::...), a serial "
                   "device (/dev/ttyUSB0) or socket://HOST:PORT (repeatable).")
@click.option("--scan/--no-scan", default=True, show_default=True,
              help="Also try every resource pyvisa-py lists on this machine (serial ports, USB, VXI-11).")
@click.option("-H", "--host", "hosts", multiple=True, metavar="[NAME=]ADDRESS",
              help="A GPU host: an ssh destination (lab@gpu3.lab), `local`, or an emulated bench's world:HOST:PORT "
                   "(repeatable).")
@click.option("--python", default="python3", show_default=True, help="The interpreter that runs the hosts' agents.")
@click.option("--protect", default="", metavar="PORTS",
              help="Switch ports never to touch (another experiment's light), e.g. 16,32 or 1-4.")
@click.option("--interfaces", default="*", show_default=True, metavar="GLOB",
              help="Which of the hosts' interfaces are optical NICs on the switch (e.g. 'ens1f*').")
@click.option("--name", default="drafted-bench", show_default=True, help="The bench's name (its lock is named so).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Where to write the drafted bench file.")
def bench_discover(resources: tuple[str, ...], scan: bool, hosts: tuple[str, ...], python: str, protect: str,
                   interfaces: str, name: str, output: Path) -> None:
    """Find the instruments and hosts on the desk, walk the fibres, and draft a bench file.

    Each instrument is identified by its own identity query, with its size or channels read
    from it; each host's GPUs and interfaces are read through its agent; then every interface's
    transmitter is turned off and on while the switch's monitors watch, and lit ports are
    connected one at a time while the hosts watch for carrier. The switch is put back as it was
    found. In the draft, every value says how it was obtained: read, measured, given, or an
    assumption to replace.

    \b
    Exit status: 0 drafted, 4 nothing usable answered (or a bad option), 6 bench busy,
    2 interrupted (the switch put back)."""
    from lumion_hil.harness.commissioning.discover import discover, summary
    from lumion_hil.harness.places import PlaceError, parse_ports

    try:
        protected = parse_ports(protect)
    except PlaceError as exc:
        raise click.BadParameter(str(exc).replace("ports tag", "ports"), param_hint="--protect") from None
    if not hosts:
        raise click.BadParameter("name at least one GPU host", param_hint="--host")
    with _stopping_safely("the switch was put back as it was found"):
        text, found = discover(list(resources), list(hosts), scan=scan, python=python, protected=protected,
                               interfaces=interfaces, name=name, log=_progress)
    output.write_text(text, encoding="utf-8")
    for line in summary(found):
        click.echo(f"lumion-hil: {line}")
    click.echo(f"lumion-hil: drafted {output}; check it with `lumion-hil bench check {output}`")


@bench.command("wiring")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@_scale_option
@_defect_option
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the bench file with the patch applied here.")
def bench_wiring(file: Path, time_scale: float | None, defects: tuple[str, ...], output: Path | None) -> None:
    """Find where every NIC's fibres land on the switch and compare with FILE.

    Each transmitter is turned off and on through its host's agent while the switch's monitors
    watch the ingress ports; then one lit ingress at a time is connected to each candidate egress
    port while the hosts watch for carrier (and the meters for light: their taps). Protected
    ports, and on a shared switch the other benches' ports, are never commanded; the baseline is
    restored at the end, also after Ctrl-C. Prints every difference ("host1.p0 transmits into
    port 4; the bench file says 3") and a patch for FILE.

    \b
    Exit status: 0 the bench file is right, 1 it differs (the patch is printed), 2 interrupted,
    4 bench or instrument error, 6 bench busy."""
    from lumion_hil.harness.commissioning.walk import find_fibres, nics_of
    from lumion_hil.harness.commissioning.wiring import compare, patched_text, unified_diff

    bench = _load_or_exit(file, time_scale, defects)
    click.echo(f"lumion-hil: walking the fibres of bench {bench.name!r} ({file}): {len(bench.nic_ports())} NIC "
               f"port(s) on {bench.topology.switch}")
    with _commissioning(bench, file, time_scale, defects) as session:
        found = find_fibres(session, nics_of(bench), log=_progress)
    differences = compare(bench, found)
    click.echo(f"lumion-hil: walk {found.duration_s:.2f} s, {len(found.switching_s)} test circuit(s); baseline "
               "restored")
    if not differences:
        click.echo(f"lumion-hil: {file}: every fibre is where the bench file says")
        return
    click.echo(f"lumion-hil: {len(differences)} difference(s) from {file}:")
    for diff in differences:
        click.echo(f"  {diff.text}")
    text = file.read_text(encoding="utf-8")
    patched = patched_text(text, differences)
    if patched != text:
        click.echo(unified_diff(text, patched, file.name), nl=False)
        if output is not None:
            output.write_text(patched, encoding="utf-8")
            click.echo(f"lumion-hil: wrote the patched bench file {output}")
    sys.exit(ExitCode.TESTS_FAILED)


@bench.command("budget")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@_scale_option
@_defect_option
@click.option("--readings", type=click.IntRange(min=2), default=5, show_default=True,
              help="Readings of each port per circuit (their spread sets each figure's interval).")
@click.option("--tolerance-db", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="How far a transmitter, port or path may be from what it should be before it is named.")
@click.option("--all", "show_all", is_flag=True, help="Print every circuit (default: the 12 worst).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write every circuit and finding as JSON here.")
def bench_budget(file: Path, time_scale: float | None, defects: tuple[str, ...], readings: int, tolerance_db: float,
                 show_all: bool, json_out: Path | None) -> None:
    """Measure the light budget of every circuit FILE's topology can make: the light at the
    switch input, the switch's loss on the path, the light at the receiver and its margin over
    the receivers' sensitivity, worst first. The light each transmitter should give (launch_dbm
    less tx_fibre_loss_db) and each meter tap's loss are compared with what was measured, and a
    port whose every path loses more than the others (a dirty connector) is named.

    \b
    Exit status: 0 every circuit above sensitivity plus margin and nothing named, 1 otherwise,
    2 interrupted, 4 bench or instrument error, 6 bench busy."""
    import dataclasses

    from lumion_hil.harness.commissioning.budget import measure_budget

    bench = _load_or_exit(file, time_scale, defects)
    click.echo(f"lumion-hil: measuring the light budget of bench {bench.name!r} ({file})")
    with _commissioning(bench, file, time_scale, defects) as session:
        budget = measure_budget(session, readings=readings, tolerance_db=tolerance_db, log=_progress)
    click.echo(f"lumion-hil: {len(budget.paths)} circuit(s) in {budget.duration_s:.2f} s; baseline restored. "
               f"Receivers' sensitivity {budget.sensitivity_dbm:g} dBm, with the link margin {budget.floor_dbm:g} dBm"
               + (f"; the switch's loss shared by every path {budget.shared_loss_db:.2f} dB"
                  if budget.shared_loss_db is not None else ""))
    click.echo(f"  {'circuit':28s} {'ports':>7s} {'input':>8s} {'loss':>6s} {'at rx':>8s} {'margin':>7s}")

    def num(value, width=8):
        return f"{value:{width}.2f}" if value is not None else f"{'-':>{width}s}"

    shown = budget.paths if show_all else budget.paths[:12]
    for p in shown:
        low = p.at_receiver_dbm is not None and p.at_receiver_dbm < budget.floor_dbm
        click.echo(f"  {p.tx + ' -> ' + p.rx:28s} {f'{p.ingress}->{p.egress}':>7s} {num(p.input_dbm)} "
                   f"{num(p.path_loss_db, 6)} {num(p.at_receiver_dbm)} {num(p.margin_db, 7)}"
                   + ("  below sensitivity + margin" if low else ""))
    if len(shown) < len(budget.paths):
        click.echo(f"  ... {len(budget.paths) - len(shown)} more (--all)")
    for line in budget.skipped:
        click.echo(f"  not measured: {line}")
    for finding in budget.findings:
        click.echo(f"lumion-hil: {finding.text}")
    if json_out is not None:
        json_out.write_text(json.dumps({"paths": [dict(dataclasses.asdict(p), path_loss_db=p.path_loss_db)
                                                  for p in budget.paths],
                                        "findings": [dataclasses.asdict(f) for f in budget.findings],
                                        "shared_loss_db": budget.shared_loss_db, "skipped": budget.skipped}, indent=1))
    below = [p for p in budget.paths if p.at_receiver_dbm is not None and p.at_receiver_dbm < budget.floor_dbm]
    if budget.findings or below:
        sys.exit(ExitCode.TESTS_FAILED)


@bench.command("schema")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write to a file.")
def bench_schema(output: Path | None) -> None:
    """Print the JSON schema of bench files (for editors and CI linters)."""
    text = bench_json_schema()
    if output:
        output.write_text(text + "\n", encoding="utf-8")
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text)


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


def _load_or_exit(path: Path, time_scale: float | None, defects: tuple[str, ...] = ()):
    try:
        return load_bench(path, time_scale=time_scale, defects=defects)
    except BenchFileError as exc:
        click.echo(str(exc), err=True)
        sys.exit(ExitCode.BENCH_OR_USAGE_ERROR)
