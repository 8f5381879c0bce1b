"""The report of a run's results folder: the morning summary (reports/summary.py) and the Allure
HTML report with history from earlier runs, built with the Allure CLI of the checkout (Node 20,
``npm ci``) or of the working directory."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import click

# A checkout holds the Allure CLI (node_modules) and its configuration; an installed package
# looks for them in the working directory instead.
_CHECKOUT = Path(__file__).resolve().parent.parent
PROJECT_ROOT = _CHECKOUT if (_CHECKOUT / "allurerc.mjs").exists() else Path.cwd()


def build_report(results: Path, required: bool = True) -> int:
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
