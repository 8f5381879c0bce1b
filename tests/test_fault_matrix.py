"""Every driver against every fault its emulator can show (issue: instruments as they really
behave). Each cell ends, within its deadline, either in a clear error (naming the instrument,
the command and the reason) or in a correct result; which one is written down per cell, so a
driver that starts hiding a fault (or stops recovering from one) fails here. After each cell the
fault is cleared and the same driver must work again, and a switch must be back at its baseline
as the world (ground truth) sees it."""

from __future__ import annotations

import time

import pytest

from conftest import BENCHES
from lumion_hil.harness.binding import open_driver
from lumion_hil.harness.config import load_bench
from lumion_hil.harness.safety import GuardedSwitch
from lumion_hil.instruments.emulators.bench import EmulatedBench
from lumion_hil.instruments.emulators.scpi import FAULTS
from lumion_hil.instruments.gpu_host.agent import AGENT_FAULTS
from lumion_hil.instruments.gpu_host.client import AgentClient
from lumion_hil.instruments.protocols import InstrumentError, OutOfRange

TIMEOUT_S = 0.5  # every driver's I/O deadline in this module
DOWN_S = 0.3  # how long a power loss lasts
DELAY_S = 1.0  # a delayed reply comes this late: past the deadline
# The serial switch has no *OPC?: a command's completion is read with its read timeout, which the
# binding raises to the completion deadline (2 x TIMEOUT_S = 1.0 s). A reply 1.0 s late then
# raced it (each query answered just in time or not: 14 s for a read-back of 16 ports once):
# its delayed reply comes well past that.
SERIAL_DELAY_S = 3.0
SCALE = 0.1

# What each cell must end in: "ok" (the operation's correct result), "error" (an InstrumentError),
# "over" (a reading rejected as over range). A fault that cannot touch the operation is "ok".
SWITCH = {"drop": "error", "stall": "error", "delay": "error", "partial": "error", "garbage": "error",
          "errors": "error", "out_of_range": "ok", "busy": "error", "power_loss": "ok"}
METER = {"drop": "error", "stall": "error", "delay": "error", "partial": "error", "garbage": "error",
         "errors": "ok", "out_of_range": "over", "busy": "ok", "power_loss": "ok"}
# The serial switch has no readings (no "out_of_range"); a serial line has no connection to
# renew, so a power loss mid-command is an error.
SERIAL_SWITCH = {"drop": "error", "stall": "error", "delay": "error", "partial": "error", "garbage": "error",
                 "errors": "error", "busy": "error", "power_loss": "error"}
# A read-only call to an agent whose session is lost starts it again and asks once more.
AGENT = {"drop": "ok", "stall": "error", "delay": "error", "partial": "error", "garbage": "error",
         "errors": "error", "power_loss": "ok"}

CELLS = ([("polatis", f) for f in SWITCH] + [("keysight-n77xx", f) for f in METER]
         + [("thorlabs-pm100", f) for f in METER] + [("dicon-matrix", f) for f in SERIAL_SWITCH]
         + [("agent", f) for f in AGENT])
EXPECTED = {"polatis": SWITCH, "keysight-n77xx": METER, "thorlabs-pm100": METER, "dicon-matrix": SERIAL_SWITCH,
            "agent": AGENT}


def test_the_matrix_covers_every_fault_of_every_emulator():
    assert set(SWITCH) == set(METER) == set(FAULTS)
    assert set(AGENT) == set(AGENT_FAULTS)
    assert set(SERIAL_SWITCH) == set(FAULTS) - {"out_of_range"}


@pytest.fixture(scope="module")
def tcp_bench():
    with EmulatedBench(load_bench(BENCHES / "emulated.yaml", time_scale=SCALE)) as emulated:
        yield emulated


@pytest.fixture(scope="module")
def serial_bench():
    with EmulatedBench(load_bench(BENCHES / "emulated-serial.yaml", time_scale=SCALE)) as emulated:
        yield emulated


def _fault(name: str, delay_s: float = DELAY_S) -> str:
    return {"delay": f"delay={delay_s}", "power_loss": f"power_loss={DOWN_S}"}.get(name, name)


def _driver(bench: EmulatedBench, instrument: str):
    spec = bench.bench.instruments[instrument].model_copy(update={"timeout_s": TIMEOUT_S})
    return open_driver(instrument, spec, bench.resources[instrument], opc_timeout_s=2 * TIMEOUT_S)


def _outcome(operation) -> tuple[str, object, float]:
    started = time.monotonic()
    try:
        result = operation()
    except InstrumentError as exc:
        return "error", exc, time.monotonic() - started
    return ("over" if isinstance(result, OutOfRange) else "ok"), result, time.monotonic() - started


def _judge(model: str, fault: str, outcome: str, result, elapsed: float, deadline: float, instrument: str) -> None:
    assert elapsed < deadline, f"{model} x {fault}: took {elapsed:.2f} s, deadline {deadline:.2f} s"
    assert outcome == EXPECTED[model][fault], f"{model} x {fault}: {outcome} ({result}), expected {EXPECTED[model][fault]}"
    if outcome == "error":
        text = str(result)
        assert text.startswith(f"{instrument}: ") and result.command and result.reason, text


def _switch_cell(bench: EmulatedBench, model: str, fault: str, pair: tuple[int, int],
                 delay_s: float = DELAY_S) -> None:
    name = bench.bench.topology.switch
    baseline = bench.bench.safety.baseline
    bench.world.replace_all(baseline)
    driver = _driver(bench, name)
    guarded = GuardedSwitch(driver, bench.bench.safety.protected_ports, baseline)
    try:
        bench.set_fault(name, _fault(fault, delay_s))
        outcome, result, elapsed = _outcome(lambda: (guarded.connect([pair]), guarded.connections())[1])
        if outcome == "ok":
            assert result.get(pair[0]) == pair[1] and bench.world.connections().get(pair[0]) == pair[1], \
                f"{model} x {fault}: said done but the switch shows {result}"
        # a switch command waits up to twice its deadline, then the read-back once more (x2 if re-asked)
        _judge(model, fault, outcome, result, elapsed, 8 * TIMEOUT_S + 2.0, name)
    finally:
        bench.clear_faults(name)
        time.sleep(DOWN_S) if fault == "power_loss" else None  # let a lost instrument finish booting
        guarded.restore_baseline()  # the same driver, once the fault is gone
        guarded.verify_baseline()
        driver.close()
    assert sorted(bench.world.connections().items()) == sorted(baseline)


@pytest.mark.parametrize("fault", list(SWITCH))
def test_polatis(tcp_bench, fault):
    _switch_cell(tcp_bench, "polatis", fault, (9, 25))


@pytest.mark.parametrize("fault", list(SERIAL_SWITCH))
def test_dicon(serial_bench, fault):
    _switch_cell(serial_bench, "dicon-matrix", fault, (9, 25), SERIAL_DELAY_S)


@pytest.mark.parametrize("model,instrument", [("keysight-n77xx", "pm-lab"), ("thorlabs-pm100", "pm-usb")])
@pytest.mark.parametrize("fault", list(METER))
def test_meter(tcp_bench, model, instrument, fault):
    tcp_bench.world.replace_all(tcp_bench.bench.safety.baseline)  # light on every tapped receiver
    meter = _driver(tcp_bench, instrument)
    try:
        tcp_bench.set_fault(instrument, _fault(fault))
        outcome, result, elapsed = _outcome(lambda: meter.read_dbm(1))
        if outcome == "ok":
            assert isinstance(result, float) and -40 < result < 0, f"{model} x {fault}: read {result}"
        _judge(model, fault, outcome, result, elapsed, 5 * TIMEOUT_S + 2.0, instrument)
    finally:
        tcp_bench.clear_faults(instrument)
        time.sleep(DOWN_S) if fault == "power_loss" else None
        after = meter.read_dbm(1)  # the same driver works again
        meter.close()
    assert isinstance(after, float) and -40 < after < 0


@pytest.fixture(scope="module")
def agent(tcp_bench):
    client = AgentClient("host0", tcp_bench.agent_argv("host0"), timeout_s=TIMEOUT_S)
    yield client
    client.close()


@pytest.mark.parametrize("fault", list(AGENT))
def test_agent(agent, fault):
    value = {"delay": DELAY_S}.get(fault)
    agent.call("fault", name=fault, value=value)
    outcome, result, elapsed = _outcome(agent.health)
    if outcome == "ok":
        assert result and result[0].index == 0, result
    _judge("agent", fault, outcome, result, elapsed, 2 * TIMEOUT_S + 3.0, "host0")
    agent.call("clear_faults")
    assert agent.health()[0].index == 0  # the same client works again


def test_a_bench_file_starts_an_agent_with_its_faults(tcp_bench):
    from lumion_hil.instruments.emulators.bench import agent_argv

    plain = tcp_bench.bench.host("host1")
    host = plain.model_copy(update={"emulation": plain.emulation.model_copy(update={"faults": ["errors"]})})

    with pytest.raises(InstrumentError, match="host1: 'hello': agent error DeviceError"):
        AgentClient("host1", agent_argv(tcp_bench.world_service.address, host, logs=tcp_bench.files.path),
                    timeout_s=TIMEOUT_S)


def test_emulate_serves_a_faulty_instrument_to_any_visa_tool(tmp_path):
    """`lumion-hil emulate --fault ocs=stall`: the switch takes commands and never answers, the
    meters answer as usual, and the served bench's hosts carry their agents' faults."""
    import pyvisa

    from conftest import serve_bench

    with serve_bench(BENCHES / "emulated.yaml", tmp_path, 0.2, "--fault", "ocs=stall",
                     "--fault", "host2=errors") as (bench_out, switch, _):
        served = load_bench(bench_out)
        rm = pyvisa.ResourceManager("@py")
        ocs = rm.open_resource(switch, read_termination="\n", write_termination="\n", timeout=500)
        meter = rm.open_resource(served.instruments["pm-lab"].resource, read_termination="\n",
                                 write_termination="\n", timeout=2000)
        try:
            with pytest.raises(pyvisa.errors.VisaIOError, match="Timeout"):
                ocs.query("*IDN?")
            assert meter.query("*IDN?").startswith("Keysight Technologies,N7744A")
        finally:
            ocs.close()
            meter.close()
        assert served.host("host2").emulation.faults == ["errors"] and served.host("host1").emulation.faults == []
