"""Failure sequences: Hypothesis tells stories of faults, faults during recoveries, spares that
fail as they are switched in, transmitters that fade step by step, and repairs, on the bench's
own hosts and NICs; after every step the harness's promises are checked (harness/promises.py).
A story that breaks one is shrunk to the shortest that still does, written as a story file
(attached to the report, kept under RESULTS/stories) and replayable on any bench that has its
parts: ``lumion-hil replay STORY --bench FILE``.

Profiles (``lumion-hil run --explore PROFILE``): ``ci``, a thousand sequences in two shards (or as
many as the bench file's ``emulator.explore`` says);
``nightly``, thousands in eight; pytest-xdist spreads a profile's shards over workers (``-n 2``,
``-n auto``), each worker with its own emulated bench, and the paths the stories took are judged
over all of them; ``bench``, a few at real time. Each shard's seed, the profile and the number
of sequences explored are measured and recorded. ``--explore-shard K/N`` (with one
``--explore-seed`` for all parts) runs a part of the shards, so that a CI matrix spreads a profile
over machines; ``lumion-hil report`` adds the parts up, and judges the paths over every part."""

from __future__ import annotations

import fcntl
import statistics
import sys
import time

import allure
import pytest
from hypothesis import HealthCheck, Phase, given, note, seed, settings, strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

from lumion_hil.harness.exploration import EVERY_PATH, is_a_part, paths_missed, reference_paths, shards_of_part
from lumion_hil.harness.explorer import Explorer
from lumion_hil.harness.promises import Broken
from lumion_hil.harness.stories import DURING, NIC_KINDS, Step, Story
from lumion_hil.harness.measurements import Spec
from lumion_hil.harness.progress import PROGRESS
from lumion_hil.harness.records import read_record
from lumion_hil.instruments.backend import FaultKind

pytestmark = allure.feature("failure sequences")


def pytest_generate_tests(metafunc):
    if "shard" in metafunc.fixturenames:
        try:
            mine = shards_of_part(metafunc.config.getoption("--explore", default=None),
                                  metafunc.config.getoption("--explore-shard", default=None))
        except ValueError as exc:
            raise pytest.UsageError(f"--explore-shard: {exc}") from None
        metafunc.parametrize("shard", mine, ids=[f"shard{i}" for i in mine])


ACTIONS = ("fault", "fault", "fault", "quiet", "degrade", "repair", "repair")


def _step(data, explorer: Explorer, kinds: list[str], fade: bool) -> Step:
    """One step the bench can take now. Every step draws the same choices whatever the state
    (so that Hypothesis can replay and shrink a sequence even where the bench's answers vary);
    the choices are read against the state: hosts of the job, NICs on the ring, broken hosts."""
    action = data.draw(st.sampled_from(ACTIONS), label="what happens")
    pick = data.draw(st.integers(0, 15), label="which host")
    kind = data.draw(st.sampled_from(kinds), label="fault")
    nic_pick = data.draw(st.integers(0, 3), label="which NIC")
    twist = data.draw(st.sampled_from(("plain", "during", "spare_fails")), label="and")
    second_pick = data.draw(st.integers(0, 15), label="which second host")
    second_kind = data.draw(st.sampled_from(("gpu_failure", "process_kill")), label="second fault")
    phase = data.draw(st.sampled_from(DURING), label="in which phase")
    zone = data.draw(st.sampled_from(("margin", "above", "dark")), label="fades into")

    broken = sorted({h for h, faults in explorer.model.faults.items() if faults} | {h for h, _ in explorer.model.fading})
    if action == "repair" or explorer.state != "running":
        return Step("repair", host=broken[pick % len(broken)]) if broken else Step("quiet")
    if action == "quiet" or (action == "degrade" and not fade):
        return Step("quiet")
    ranks = list(explorer.ranks)
    host = ranks[pick % len(ranks)]
    live = explorer.session.switch.connections()
    on_ring = [n.name for n in explorer.bench.host(host).nics if n.tx_port in live or n.rx_port in live.values()]
    nics = on_ring or explorer.nics_of(host)
    nic = nics[nic_pick % len(nics)]
    if action == "degrade":  # how far, from what the receiver's detector reads now
        return Step("degrade", host=host, nic=nic, by_db=explorer.fade_into(host, nic, zone))
    nic = nic if kind in NIC_KINDS else None
    others = [h for h in ranks if h != host]
    if twist == "during" and others and explorer.can_make("gpu_failure"):
        second = Step("fault", host=others[second_pick % len(others)], kind=second_kind)
        return Step("fault", host=host, kind=kind, nic=nic, during=second, at=phase)
    if twist == "spare_fails" and kind != "process_kill" and explorer.can_make("gpu_failure"):
        return Step("fault", host=host, kind=kind, nic=nic, spare_fails=True)
    return Step("fault", host=host, kind=kind, nic=nic)


def _judge_paths(request, measure, record_path, bench_file, shard: int, reached: dict[str, int], every: bool,
                 profile_shards: int) -> None:
    """The paths the stories took, judged over every shard of this run (a profile's shards explore
    it together, on one worker or several): each shard records its own (``paths_reached``), and
    the shard that ends last, finding the others' in the run record, judges their sum
    (``paths_not_reached``; in the ci profile on a bench that makes every fault, none may be
    missed). Without a run record each shard is judged on its own. A run that is one part of the
    profile (``--explore-shard K/N``) records its sum beside the limit, not comparable: the
    paths of every part are judged together where the parts are merged (reports/merge.py)."""
    mine = sorted(item.callspec.params["shard"] for item in request.session.items
                  if getattr(item, "originalname", None) == request.node.originalname and hasattr(item, "callspec"))
    test = request.node.nodeid.split("[")[0]
    spec = Spec("paths_reached", "paths", description="reference paths the stories of this shard took")
    count = float(len(reference_paths(bench_file)) - len(paths_missed(reached, bench_file)))
    shards = {shard: reached}
    if record_path is None:
        measure(spec, count, shard=shard, reached=dict(sorted(reached.items())))
    else:
        with open(record_path, "a", encoding="utf-8") as lock:  # one shard at a time: exactly one judges
            fcntl.flock(lock, fcntl.LOCK_EX)
            measure(spec, count, shard=shard, reached=dict(sorted(reached.items())))
            for m in read_record(record_path):
                if m.get("type") == "measurement" and m.get("name") == "paths_reached" \
                        and m.get("test", "").split("[")[0] == test:
                    shards.setdefault(m["attrs"]["shard"], m["attrs"]["reached"])
        if sorted(shards) != mine:
            return  # another shard of this run has not ended yet: it judges
    total: dict[str, int] = {}
    for shard_paths in shards.values():
        for path, count in shard_paths.items():
            total[path] = total.get(path, 0) + count
    missed = paths_missed(total, bench_file)
    paths = Spec("paths_not_reached", "paths", description="paths of the reference controller no story took, "
                 "in all the shards of this run")
    if every:  # a ci run on a bench that makes every fault must reach every path
        paths = paths.at_most(0, EVERY_PATH).with_marginal(0.0)
    part = request.config.getoption("--explore-shard")
    if every and is_a_part(part):
        paths = paths.not_comparable_because(f"part {part} of the profile: the paths of every part are judged "
                                             "together where the parts are merged (lumion-hil report)")
    measure(paths, float(len(missed)), missed=missed, reached=dict(sorted(total.items())), shards=sorted(shards),
            reference=list(reference_paths(bench_file)), every=every, part=part,
            profile_shards=profile_shards)


@pytest.fixture(scope="module")
def light_job(session):
    """The bench's light job where it has more than one (the namespaced bench's ring job, not
    its PyTorch job): the stories restart the job hundreds of times. Put back afterwards."""
    kind = session.use_light_job()
    yield kind
    session.use_light_job(False)


@allure.title("failure sequences keep the harness's promises")
def test_failure_sequences(shard, session, bench_file, exploration, measure, record_path, request, results_dir,
                           light_job, record_note):
    if bench_file.job is None:
        pytest.skip("the bench file has no job section")
    record_note("job", kind=light_job)
    profile = exploration
    explorer = Explorer(session, measure=measure, record_path=record_path, test=request.node.nodeid)
    kinds = [k.value for k in FaultKind if explorer.can_make(k.value)]
    fade = explorer.can_make("transceiver_degradation")
    the_seed = profile.seed + shard
    examples = max(1, profile.sequences // profile.shards)
    lengths: list[int] = []
    stories: set[tuple[str, ...]] = set()  # distinct stories told to the end (not shrink replays)
    # the story told last, and the first that broke a promise (kept: a story that breaks only
    # sometimes, under load say, is lost to Hypothesis's shrinking when told again it holds)
    # (with what each step came to: told again, a story that broke under load may take another
    # path, and what it came to the first time is what shows the bug)
    told: dict = {"steps": [], "outcomes": [], "broke": None, "shrinking": False, "first": None, "promise": False}

    @settings(max_examples=examples, deadline=None, derandomize=False, print_blob=False,
              database=DirectoryBasedExampleDatabase(str(profile.database(bench_file))),
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
              phases=[Phase.reuse, Phase.generate, *([Phase.shrink] if profile.shrink else [])])
    @seed(the_seed)
    @given(st.data())
    def sequence(data):
        explorer.reset()
        steps: list[Step] = []
        outcomes: list[str] = []
        told["steps"], told["outcomes"], told["broke"], told["promise"] = steps, outcomes, None, False
        length = data.draw(st.integers(1, profile.max_steps), label="length")
        try:
            for _ in range(length):
                step = _step(data, explorer, kinds, fade)
                steps.append(step)
                outcome = explorer.apply(step)
                note(f"{len(steps)}. {step.describe()}: {outcome}")
                explorer.check()
                outcomes.append(outcome)  # every promise kept after it
            if not told["shrinking"]:  # after the first broken story, Hypothesis only tells it again (or shrinks it)
                stories.add(tuple(step.describe() for step in steps))
        except Exception as broken:  # a promise broken, or the harness itself failing: both are stories
            told["broke"] = f"{type(broken).__name__}: {broken}" if not isinstance(broken, Broken) else str(broken)
            told["shrinking"] = True
            told["promise"] = isinstance(broken, Broken)
            if told["first"] is None:
                told["first"] = (list(steps), list(outcomes), told["broke"])
            raise
        finally:
            lengths.append(len(steps))
            PROGRESS.count("sequences explored")

    started = time.monotonic()
    try:
        with allure.step(f"profile {profile.name}: {examples} sequences of up to {profile.max_steps} steps, "
                         f"seed {the_seed}"):
            sequence()
    except Exception as exc:
        stamp = f"{bench_file.name}-{time.strftime('%Y%m%d-%H%M%S')}-shard{shard}"
        last = "the story that breaks a promise" if told["promise"] else "the story told last"
        told_stories = [("", last, list(told["steps"]), list(told["outcomes"]), told["broke"] or
                         f"{type(exc).__name__}: {exc}")]
        if told["first"] is not None and not told["promise"]:  # the last telling broke no promise: keep the first
            steps, outcomes, broke = told["first"]
            told_stories.append(("-first", "the first story that broke a promise", steps, outcomes,
                                 f"{broke} (told again, it " + (f"ended in {told['broke']})" if told["broke"]
                                                                  else "kept every promise)")))
        for suffix, title, steps, outcomes, broke in told_stories:
            story = Story(bench_file.name, steps, the_seed, profile.name, bench_file.recovery.controller, broke,
                          told=outcomes)
            path = story.save(results_dir / "stories" / f"{stamp}{suffix}.yaml")
            allure.attach(story.dump(), name=title, attachment_type=allure.attachment_type.TEXT)
            print(f"\n{title}:\n{story.dump()}\nstory saved: {path} (lumion-hil replay {path} --bench BENCH)")
        raise
    finally:
        failing = sys.exc_info()[0] is not None
        try:
            explorer.finish()  # the later suites find the bench as it was
        except Exception as exc:
            print(f"lumion-hil: the bench could not be put back after exploring: {exc}")
            if not failing:
                raise
        took = time.monotonic() - started
        # Many of Hypothesis's choice sequences tell the same story (a quiet step draws choices it
        # never reads): at least a quarter of a shard's sequences must be distinct stories told
        # to the end. A clean ci shard of 500 told 248-292 on the exploration bench, one of 100 45-55
        # on the namespaced bench (four hosts: fewer stories to tell), in three clean-clone CI runs
        # (each with its own seed); a story that breaks a promise
        # early, or a controller that leaves nothing to tell, tells far fewer.
        target = max(1, examples // 4)
        measure(Spec("sequences_explored", "sequences", description="distinct failure sequences told to the end in "
                     "this shard (not shrink replays)").at_least(target, f"profile {profile.name}: {examples} per "
                     "shard, a quarter of them distinct stories").with_marginal(0.0), float(len(stories)),
                profile=profile.name, seed=the_seed, shard=shard, sequences_run=len(lengths),
                promises={c.name: list(c.promises) for c in Explorer.CHECKS})
        every = profile.name == "ci" and fade and set(kinds) == {k.value for k in FaultKind}
        _judge_paths(request, measure, record_path, bench_file, shard, explorer.paths, every, profile.shards)
        if lengths:
            measure(Spec("sequence_length_mean", "steps", description="mean steps per sequence"), statistics.mean(lengths),
                    profile=profile.name)
            measure(Spec("sequences_per_minute", "1/min", description="exploration speed"), 60 * len(lengths) / took,
                    profile=profile.name, recoveries=explorer.recoveries, steps=explorer.steps_taken)
