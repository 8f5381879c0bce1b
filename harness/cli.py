"""The ``lumion-hil`` command."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import click

from harness.config import bench_json_schema, load_bench
from harness.errors import BenchFileError

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BENCH = PROJECT_ROOT / "benches" / "emulated.yaml"

_bench_option = click.option(
    "--bench", "bench_path", type=click.Path(dir_okay=False, path_type=Path),
    default=lambda: os.environ.get("LUMION_HIL_BENCH", str(DEFAULT_BENCH)), show_default="benches/emulated.yaml",
    help="Bench file (env LUMION_HIL_BENCH).")
_scale_option = click.option(
    "--time-scale", type=click.FloatRange(min=0, min_open=True), default=None,
    help="Multiply every emulated latency by this factor (0.1 runs ten times faster).")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
@click.option("--results", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True, help="Folder for Allure results, run records and the HTML report.")
@click.option("--report/--no-report", default=True, show_default=True,
              help="Build the Allure HTML report after the run (needs Node 20 and `npm ci`).")
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
def run(bench_path: Path, time_scale: float | None, results: Path, report: bool, pytest_args: tuple[str, ...]) -> None:
    """Run the suites against a bench. Extra arguments go to pytest (e.g. -k recovery -x).

    Writes Allure results to RESULTS/allure-results and a run record (one JSON object a line,
    each measurement as it is taken) to RESULTS/records/. Exits with pytest's status."""
    bench = _load_or_exit(bench_path, time_scale)
    suites = _suites_dir()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    record = results / "records" / f"run-{stamp}.jsonl"
    allure_results = results / "allure-results"
    if allure_results.exists():
        shutil.rmtree(allure_results)  # one run's results; history lives in RESULTS/history.jsonl
    allure_results.mkdir(parents=True)
    cmd = [sys.executable, "-m", "pytest", str(suites), "--bench", str(bench_path), "--alluredir", str(allure_results),
           "--run-record", str(record), "-p", "no:cacheprovider", "--rootdir", str(suites)]
    if time_scale is not None:
        cmd += ["--time-scale", str(time_scale)]
    cmd += list(pytest_args)
    click.echo(f"lumion-hil: bench {bench.name!r} ({bench_path})")
    click.echo(f"lumion-hil: run record {record}")
    status = subprocess.call(cmd)
    click.echo(f"lumion-hil: run record {record}")
    if status == 5:
        click.echo("lumion-hil: no suite was collected (check -k / paths); treating as a failure", err=True)
    if report:
        report_status = _build_report(results, required=False)
        if report_status != 0 and status == 0:
            status = report_status
    sys.exit(status)


def _suites_dir() -> Path:
    spec = importlib.util.find_spec("test_suites")
    if spec is None or not spec.submodule_search_locations:
        raise click.ClickException("the test_suites package is not installed; run `pip install -e .`")
    return Path(list(spec.submodule_search_locations)[0])


# --- report -----------------------------------------------------------------------------------------


@main.command("report")
@click.option("--results", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True, help="Folder given to `lumion-hil run --results`.")
def report_cmd(results: Path) -> None:
    """Build the Allure HTML report (RESULTS/allure-report) with history from earlier runs."""
    sys.exit(_build_report(results))


def _build_report(results: Path, required: bool = True) -> int:
    """Build the HTML report. Without the Allure CLI installed, ``lumion-hil run`` only warns
    (the suites' verdict stands); ``lumion-hil report`` fails."""
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
@click.option("--bench-out", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write a bench file pointing at what is served: runs against it treat the "
                   "emulated bench like a real one that outlives them.")
def emulate(bench_path: Path, time_scale: float | None, bench_out: Path | None) -> None:
    """Serve the emulated instruments (and hosts) of a bench in the foreground.

    Prints each instrument's VISA resource string, so any VISA tool or script can talk to it
    (pyvisa: ResourceManager('@py').open_resource(..., read_termination='\\n')). Ctrl-C stops."""
    import yaml

    from instruments.emulators.bench import EmulatedBench, served_bench

    bench = _load_or_exit(bench_path, time_scale)
    if not bench.any_emulated:
        raise click.ClickException(f"bench {bench.name!r} has no emulated instrument (resource: emulated)")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with EmulatedBench(bench) as emulated:
        click.echo(f"lumion-hil: emulating bench {bench.name!r} (time scale {bench.emulator.time_scale:g})")
        for name, resource in emulated.resources.items():
            spec = bench.instruments[name]
            click.echo(f"{name}\t{spec.model}\t{resource}")
        for name, spec in bench.instruments.items():
            if not spec.emulated:
                click.echo(f"{name}\t{spec.model}\t(not emulated: {spec.resource})")
        if emulated.world_service is not None:
            click.echo(f"hosts\tworld\t{emulated.world_service.address}")
        if bench_out:
            bench_out.write_text(yaml.safe_dump(served_bench(bench, emulated), sort_keys=False), encoding="utf-8")
            click.echo(f"lumion-hil: wrote {bench_out}", err=True)
        click.echo("lumion-hil: ready; Ctrl-C to stop", err=True)
        sys.stdout.flush()
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
    click.echo("lumion-hil: stopped", err=True)


# --- bench ----------------------------------------------------------------------------------------


@main.group()
def bench() -> None:
    """Check bench files and export their schema."""


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
    """Parse nccl-tests output (text from any version, or the JSON of -J) and print it as JSON:
    sizes, times in microseconds, algbw and busbw in GB/s, wrong counts, the average. FILE may
    be - for standard input."""
    import json

    from instruments.gpu_host.nccl import NcclParseError, parse

    try:
        result = parse(file.read(), file.name)
    except NcclParseError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(result.to_dict(), indent=1))


def _load_or_exit(path: Path, time_scale: float | None):
    try:
        return load_bench(path, time_scale=time_scale)
    except BenchFileError as exc:
        click.echo(str(exc), err=True)
        sys.exit(2)
