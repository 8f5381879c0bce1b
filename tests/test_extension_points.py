"""The plug-in points a lab builds on: controllers and backends named by dotted path or entry
point, and the reference controller's parts replaced one at a time."""

from __future__ import annotations

import pytest

from lumion_hil.harness.backends import load_backend
from lumion_hil.harness.config import parse_bench
from lumion_hil.harness.controller import ReferenceController, Status, load_controller
from lumion_hil.harness.errors import BenchFileError
from lumion_hil.harness.faults import Fault, Injector
from lumion_hil.harness.planning import like_for_like
from lumion_hil.harness.plugins import BACKENDS, CONTROLLERS, PluginError, load_object
from lumion_hil.harness.recovery import recover_from
from lumion_hil.instruments.backend import BenchBackend
from conftest import BENCHES
from test_recovery import _running, _session

TEXT = (BENCHES / "emulated.yaml").read_text()


def test_plug_ins_by_entry_point_by_dotted_path_and_by_their_old_names():
    assert load_object("reference", CONTROLLERS, "recovery.controller") is ReferenceController
    assert load_object("lumion_hil.harness.controller:ReferenceController", CONTROLLERS, "x") is ReferenceController
    # stories and bench files saved before the single package still load
    assert load_object("harness.controller:ReferenceController", CONTROLLERS, "x") is ReferenceController
    assert load_object("real", BACKENDS, "backend") is BenchBackend
    with pytest.raises(PluginError, match=r"backend 'rael': no entry point of that name in lumion_hil.backends "
                                          r"\(known: emulated, netns, real, served"):
        load_object("rael", BACKENDS, "backend")
    with pytest.raises(PluginError, match="cannot load it"):
        load_object("no_such_module:thing", BACKENDS, "backend")


def test_a_bench_chooses_its_backend_and_a_wrong_one_is_a_clear_error():
    assert load_backend(parse_bench(TEXT)).kind == "emulated"
    named = parse_bench(TEXT.replace("name: emulated-prototype", "name: emulated-prototype\nbackend: real", 1))
    assert load_backend(named).kind == "real" and load_backend(named).world is None
    wrong = parse_bench(TEXT.replace("name: emulated-prototype", "name: emulated-prototype\nbackend: "
                                     "lumion_hil.harness.config:Bench", 1))
    with pytest.raises(PluginError, match="backend 'lumion_hil.harness.config:Bench': cannot make it for bench"):
        load_backend(wrong)
    with pytest.raises(BenchFileError, match="backend: expected module:factory, or one of the names registered in "
                                             "lumion_hil.backends"):
        parse_bench(TEXT.replace("name: emulated-prototype", "name: emulated-prototype\nbackend: emulatd", 1))


def test_a_labs_spare_policy_rewiring_rule_and_plan_check_are_the_ones_used():
    asked, rewired, checked = [], [], []

    def no_spare_but_host3(pool, ranks):
        asked.append(list(ranks))
        return "host3" if "host3" not in ranks else None

    def rule(bench, failed, spare, live, intended):
        rewired.append((failed, spare))
        return like_for_like(bench, failed, spare, live, intended)

    def check(bench, plan):
        checked.append(plan.spare)

    with _session() as session:
        ranks = _running(session)
        controller = ReferenceController(session, ranks, spare_policy=no_spare_but_host3, rewiring=rule,
                                         plan_checks=[check])
        injector = Injector(session)
        fault = Fault("gpu_failure", "host1")
        _, result = recover_from(controller, lambda: injector.inject(fault), lambda: injector.repair(fault))
        assert result.status == Status.RECOVERED, result.reason
        assert asked == [ranks] and rewired == [("host1", "host3")] and checked == ["host3"]
        assert result.plan.ranks_after == ["host0", "host3", "host2"]
        # the same policy with nothing left: degraded, and why
        assert controller.ranks == ["host0", "host3", "host2"]  # the job runs there now
        fault = Fault("gpu_failure", "host0")
        _, result = recover_from(controller, lambda: injector.inject(fault), lambda: injector.repair(fault))
        assert result.status == Status.DEGRADED and "no spare GPU is left" in result.reason


def test_a_controller_named_by_entry_point_is_loaded():
    text = TEXT.replace("deadlines:", "recovery:\n  controller: reference\n\ndeadlines:", 1)
    with _session(text) as session:
        assert type(load_controller(session, ["host0", "host1", "host2"])) is ReferenceController


def pick_nothing(pool, ranks):
    return None


def test_a_bench_file_names_a_spare_policy_by_dotted_path():
    text = TEXT.replace("deadlines:", "recovery:\n  controller: reference\n  controller_options: "
                        "{spare_policy: 'test_extension_points:pick_nothing'}\n\ndeadlines:", 1)
    with _session(text) as session:
        controller = load_controller(session, ["host0", "host1", "host2"])
        assert controller.spares.policy is pick_nothing
