"""SCPI queries per second: the Polatis driver (pyvisa-py) vs a plain socket, same emulator,
same run, interleaved in rounds so both see the same machine load."""

from __future__ import annotations

import argparse
import socket
import statistics
import time
from pathlib import Path

from lumion_hil.harness.binding import open_driver
from lumion_hil.harness.config import load_bench
from lumion_hil.instruments.emulators.bench import EmulatedBench

ROOT = Path(__file__).resolve().parent.parent


def plain_rate(port: int, n: int) -> float:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        start = time.perf_counter()
        for _ in range(n):
            sock.sendall(b":OXC:SWIT:SIZE?\n")
            data = b""
            while not data.endswith(b"\n"):
                data += sock.recv(256)
        return n / (time.perf_counter() - start)


def driver_rate(driver, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        driver.size()
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--queries", type=int, default=2000, help="queries per side per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    bench = load_bench(ROOT / "benches" / "emulated.yaml")
    with EmulatedBench(bench) as emulated:
        emulated.emulators["ocs"].command_latency_s = 0.0  # measure the transport, not the model
        port = emulated.servers["ocs"].port
        driver = open_driver("ocs", bench.switch, emulated.resources["ocs"])
        driver_rate(driver, 200), plain_rate(port, 200)  # warm up both paths
        driver_rates, plain_rates = [], []
        for _ in range(args.rounds):
            driver_rates.append(driver_rate(driver, args.queries))
            plain_rates.append(plain_rate(port, args.queries))
        driver.close()
    d, p = statistics.median(driver_rates), statistics.median(plain_rates)
    print(f"SCPI ':OXC:SWIT:SIZE?' round trips against the Polatis emulator ({args.rounds} rounds x {args.queries})")
    print(f"  driver (pyvisa-py):  {d:9.0f} queries/s  (median; rounds {', '.join(f'{r:.0f}' for r in driver_rates)})")
    print(f"  plain socket:        {p:9.0f} queries/s  (median; rounds {', '.join(f'{r:.0f}' for r in plain_rates)})")
    print(f"  driver / plain:      {d / p:9.2f}")


if __name__ == "__main__":
    main()
