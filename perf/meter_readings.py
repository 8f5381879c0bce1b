"""Power meters through their drivers against their emulators:
- readings per second from each meter (one query per reading);
- how finely a light arrival is placed in time: a Keysight hardware-logging trace vs polling
  the same channel, for the same switch event repeated, side by side in one run. The error is
  against the world's ground truth (the instant the beam settled)."""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from lumion_hil.harness.binding import open_driver
from lumion_hil.harness.config import load_bench
from lumion_hil.instruments.emulators.bench import EmulatedBench
from lumion_hil.instruments.protocols import PowerMeter

ROOT = Path(__file__).resolve().parent.parent


def rate(meter, channel: int, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        meter.read_dbm(channel)
    return n / (time.perf_counter() - start)


def arrival_error_ms(world, meter, channel: int, circuit, polled: bool) -> tuple[float, float]:
    world.disconnect(None)
    start = PowerMeter.start_trace if polled else type(meter).start_trace
    finish = PowerMeter.finish_trace if polled else type(meter).finish_trace
    handle = start(meter, channel, 0.12, 0.0005)
    time.sleep(0.01)
    world.connect([circuit])
    trace = finish(meter, handle)
    lit = world.events_of("circuit.lit")[-1].t_ns
    seen = trace.first_at_or_above(-40.0, after_ns=lit - 50_000_000)
    return (seen - lit) / 1e6, trace.resolution_ns() / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--readings", type=int, default=300)
    parser.add_argument("--events", type=int, default=10)
    args = parser.parse_args()
    bench = load_bench(ROOT / "benches" / "emulated.yaml", time_scale=0.5)
    with EmulatedBench(bench) as emulated:
        lab = open_driver("pm-lab", bench.instruments["pm-lab"], emulated.resources["pm-lab"])
        usb = open_driver("pm-usb", bench.instruments["pm-usb"], emulated.resources["pm-usb"])
        print(f"Readings per second through the driver (median of 3 x {args.readings}):")
        for label, meter in (("Keysight N77xx (100 us averaging)", lab), ("Thorlabs PM100 (averaging 1, ~1 ms)", usb)):
            rates = [rate(meter, 1, args.readings) for _ in range(3)]
            print(f"  {label:38s} {statistics.median(rates):8.0f} /s")
        print(f"Light arrival placed in time, {args.events} switch events each, time scale 0.5 "
              "(error = first light in the trace - world's settle instant):")
        for label, polled in (("hardware logging (0.5 ms samples)", False), ("polling the same channel", True)):
            errors, resolutions = [], []
            for _ in range(args.events):
                err, res = arrival_error_ms(emulated.world, lab, 1, (4, 17), polled)
                errors.append(err)
                resolutions.append(res)
            print(f"  {label:36s} error median {statistics.median(errors):6.3f} ms, max |error| "
                  f"{max(abs(e) for e in errors):6.3f} ms, stated resolution median {statistics.median(resolutions):6.3f} ms")
        lab.close()
        usb.close()


if __name__ == "__main__":
    main()
