"""How often fidelity cries wolf, and how often it sees a change: its stated rates, measured.

One recording of the physics suites on the default emulated bench (``lumion-hil run --record``),
then ``lumion-hil fidelity``'s replay and comparison of it, N times each, against:

- the bench that made it: every DIFFERS is a false alarm (fidelity states at most
  harness/decisions.py's FIDELITY_ALPHA per report, over all its decisions together);
- the same bench with one parameter family shifted: the switch's time per connection by +10%,
  every NIC's lock and bring-up (lock_time_s + link_up_time_s) by +10%, the job's start-up by
  +10%, the switch's insertion loss by +0.5 dB: every report should say DIFFERS and name that
  family, and name no other.

It prints, per bench, how many reports said DIFFERS, how many named the family, what else they
named, and the decisions that said DIFFERS. Measured on this machine; its load moves the
timings (say what else ran). About 100 replays of the recording: an hour or more at the
default time scale.

    .venv/bin/python perf/fidelity_rates.py [--replays 20] [--time-scale 0.5] [--only same,switch]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benches" / "emulated.yaml"
# The suites whose exchanges fidelity compares (the others add no kind of their own).
SUITES = "not failure_sequences and not training_throughput and not collective_bandwidth and not migration"


def _host_nics(text: str, factor: float) -> str:
    """Every host's NIC lock and bring-up, times ``factor`` (the defaults made explicit)."""
    from lumion_hil.harness.config_topology import HostEmulation

    default = HostEmulation()
    setting = (f"      emulation: {{lock_time_s: {default.lock_time_s * factor:.6g}, "
               f"link_up_time_s: {default.link_up_time_s * factor:.6g}}}\n      gpus")
    for host in ("host0", "host1", "host2", "host3"):
        old = f"    - name: {host}\n      gpus"
        assert old in text, old
        text = text.replace(old, f"    - name: {host}\n" + setting, 1)
    return text


def _swap(old: str, new: str):
    def change(text: str) -> str:
        assert old in text, old
        return text.replace(old, new, 1)
    return change


# bench -> (how the default bench file changes, the parameter fidelity should name)
VARIANTS = {
    "same": (lambda text: text, None),
    "switch": (_swap("switching_time_s: 0.05 ", "switching_time_s: 0.055"), "instruments.ocs.emulation.switching_time_s"),
    "nic": (lambda text: _host_nics(text, 1.1), "lock_time_s+link_up_time_s"),
    "job": (_swap("startup_time_s: 0.5 ", "startup_time_s: 0.55"), "job.startup_time_s"),
    "loss": (_swap("insertion_loss_db: 1.5 ", "insertion_loss_db: 2.0 "), "instruments.ocs.emulation.insertion_loss_db"),
}


def main() -> None:
    from lumion_hil.harness import decisions
    from lumion_hil.harness.config import parse_bench
    from lumion_hil.harness.fidelity import compare
    from lumion_hil.harness.transcript_replay import Replayer
    from lumion_hil.instruments import transcript

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--time-scale", type=float, default=0.5)
    parser.add_argument("--only", default=",".join(VARIANTS), help="benches to replay against: " + ", ".join(VARIANTS))
    parser.add_argument("--transcript", type=Path, help="replay this recording instead of making one")
    parser.add_argument("--keep", type=Path, help="keep the recording and every report that said DIFFERS here")
    parser.add_argument("-k", dest="suites", default=SUITES, help=f"the suites recorded (pytest -k; default: {SUITES})")
    args = parser.parse_args()
    os.environ.setdefault("LUMION_HIL_LOCK_DIR", tempfile.mkdtemp(prefix="lumion-hil-locks-"))
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        recording = args.transcript
        if recording is None:
            results = Path(tmp) / "recorded"
            subprocess.run([sys.executable, "-m", "lumion_hil", "run", "--bench", str(BENCH), "--time-scale",
                            str(args.time_scale), "--results", str(results), "--no-report", "-q", "-k", args.suites,
                            "--record"], cwd=ROOT, check=False, capture_output=True)
            recording = next((results / "records").glob("transcript-*.jsonl"))
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            if args.transcript is None:
                shutil.copy2(recording, args.keep / recording.name)
        header, entries = transcript.read(recording)
        scale = header.get("time_scale") or 1.0
        print(f"recording: {recording} ({len(entries)} lines, time scale {scale:g}; "
              f"{time.monotonic() - started:.0f} s); {args.replays} replays per bench; fidelity's stated "
              f"false-alarm rate {decisions.FIDELITY_ALPHA:.2%} per report", flush=True)
        text = BENCH.read_text()
        for name in args.only.split(","):
            change, family = VARIANTS[name]
            bench = parse_bench(change(text), f"{name}.yaml", time_scale=scale)
            differs, named_family, named_other, deciding = 0, 0, collections.Counter(), collections.Counter()
            unexplained = collections.Counter()
            t0 = time.monotonic()
            for i in range(args.replays):
                replayed = Replayer(bench, header, entries).run()
                report = compare(bench, entries, replayed, scale)
                differs += not report["match"]
                names = [p["parameter"] for p in report["parameters"]]
                named_family += family is not None and any(family in n for n in names)
                named_other.update(n for n in names if family is None or family not in n)
                unexplained.update(u["what"] for u in report["unexplained"])
                deciding.update(label for label, k in report["timing"].items() if k["match"] is False)
                deciding.update(f"light {d['path']} at {d['instrument']}" for d in report["powers"]["differing"])
                deciding.update(f"reply #{r['index']} {r['exchange']!s:.40}: {r['why']!s:.80}"
                                for r in report["replies_differing"])
                if args.keep is not None and not report["match"]:
                    (args.keep / f"{name}-{i + 1}.json").write_text(json.dumps(report, indent=1))
                print(f"  {name} {i + 1}/{args.replays}: {'DIFFERS' if not report['match'] else 'match'}"
                      f" named {names or '-'}", flush=True)
            line = f"{name:7} DIFFERS {differs}/{args.replays}"
            if family is not None:
                line += f", named {family} {named_family}/{args.replays}"
            line += f"; also named: {dict(named_other) or 'nothing'}; unexplained: {dict(unexplained) or 'nothing'}"
            print(line + f"; differing decisions: {dict(deciding) or 'none'} ({time.monotonic() - t0:.0f} s)",
                  flush=True)
    print(f"total {time.monotonic() - started:.0f} s; load average now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
