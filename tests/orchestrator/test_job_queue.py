"""Which job a GPU runs next (``orchestrator.launching.scheduling``), on real slots without Ray."""

from __future__ import annotations

from dataclasses import dataclass

from support import sim_slot

from orchestrator.launching.scheduling import JobQueue, gpus_at_once
from orchestrator.launching.slot import Slot, selection_key

ALL = selection_key(None)  # device.gpus unset: every GPU


@dataclass(frozen=True)
class Job:
    name: str
    gpus_key: str = ALL


def slot(index: int, *selections: str) -> Slot:
    return sim_slot(index, {ALL, *selections})


def test_a_shared_queue_deals_in_order_each_gpu_the_first_job_it_may_run():
    a, b = slot(0, "a-only"), slot(1)
    q = JobQueue(False, [a.uuid, b.uuid])
    for job in (Job("pinned", "a-only"), Job("j1"), Job("j2")):
        assert q.plan(job, [a, b], {}) == {}
    assert q.take(b).name == "j1"  # the pinned job is not b's
    assert q.take(a).name == "pinned"
    assert q.waiting([a.uuid, b.uuid]) == 1 and not q.empty()
    assert q.take(a).name == "j2"
    assert q.take(b) is None and q.empty()
    assert q.dealt == {a.uuid: 2, b.uuid: 1}
    assert q.least_used([a, b]) == [b, a]


def test_a_busy_gpu_queues_from_the_shared_queue_only_while_as_many_wait_as_gpus_may_run_them():
    gpus = [slot(i) for i in range(3)]
    q = JobQueue(False, [s.uuid for s in gpus])
    for i in range(4):
        q.plan(Job(f"j{i}"), gpus, {})
    assert q.take(gpus[0], ahead_among=gpus).name == "j0"  # 4 wait: one may go behind a trial
    assert q.take(gpus[1], ahead_among=gpus).name == "j1"  # 3 wait
    assert q.take(gpus[2], ahead_among=gpus) is None  # 2 wait for 3 GPUs: kept for a free one
    assert q.take(gpus[2]).name == "j2"  # an idle GPU takes it
    gpus[0].retire("lost")
    live = gpus[1:]
    assert q.take(gpus[1], ahead_among=live) is None  # 1 waits for the 2 live GPUs


def test_a_job_pinned_to_a_busy_gpu_alone_always_waits_behind_its_trial():
    a, b = slot(0, "a-only"), slot(1, "b-only")
    q = JobQueue(False, [a.uuid, b.uuid])
    q.plan(Job("pinned-a", "a-only"), [a, b], {})  # one job for two GPUs, but only a runs it
    assert q.take(a, ahead_among=[a, b]).name == "pinned-a"


def test_placement_every_queues_each_job_on_each_gpu_and_ignores_the_shared_rules():
    a, b = slot(0), slot(1)
    q = JobQueue(True, [a.uuid, b.uuid])
    assert q.plan(Job("j0"), [a, b], {b.uuid: "stored"}) == {b.uuid: "stored"}
    q.plan(Job("j1"), [a, b], {})
    assert q.waiting([a.uuid, b.uuid]) == 1  # the shortest live queue
    assert q.take(a, ahead_among=[a, b], share=0).name == "j0"  # its own queue: no rule
    assert q.take(b).name == "j1"
    assert q.take(b) is None
    assert [j.name for j in q.drain(a.uuid)] == ["j1"] and q.empty()


def test_one_stored_trial_stands_for_a_shared_job_which_is_then_not_queued():
    a, b = slot(0), slot(1)
    q = JobQueue(False, [a.uuid, b.uuid])
    assert q.plan(Job("j0"), [a, b], {a.uuid: "ra", b.uuid: "rb"}) == {a.uuid: "ra"}
    assert q.empty()


def test_a_gpu_takes_at_most_its_share_and_a_job_given_back_is_dealt_first_again():
    a, b = slot(0), slot(1)
    q = JobQueue(False, [a.uuid, b.uuid])
    for i in range(3):
        q.plan(Job(f"j{i}"), [a, b], {})
    first = q.take(a, share=1)
    assert first.name == "j0" and q.take(a, share=1) is None  # its share of a joining pool
    q.put_back(first, a.uuid, sent=True)  # its worker died before running it
    assert q.dealt[a.uuid] == 0
    assert q.take(b).name == "j0"


def test_jobs_no_live_gpu_may_run_are_taken_off_as_stranded():
    a, b = slot(0, "a-only"), slot(1)
    q = JobQueue(False, [a.uuid, b.uuid])
    q.plan(Job("pinned", "a-only"), [a, b], {})
    q.plan(Job("any"), [a, b], {})
    assert q.stranded([a, b]) == []
    a.retire("lost")
    ((job, selecting, error),) = q.stranded([a, b])
    assert job.name == "pinned" and selecting == [a]
    assert error == "not run: no GPU it may run on is left (lost)"
    assert [j.name for j in q.shared] == ["any"]


def test_placement_every_strands_the_queue_of_a_retired_gpu_and_no_other():
    a, b = slot(0), slot(1)
    q = JobQueue(True, [a.uuid, b.uuid])
    for i in range(2):
        q.plan(Job(f"j{i}"), [a, b], {})
    assert q.stranded([a, b]) == []
    a.retire("lost")
    stranded = q.stranded([a, b])
    assert [(s.job.name, s.selecting, s.error) for s in stranded] == [
        ("j0", [a], "not run: GPU retired (lost)"), ("j1", [a], "not run: GPU retired (lost)")]
    assert q.stranded([a, b]) == []  # taken off once
    assert q.take(b).name == "j0" and q.take(b).name == "j1"


def test_a_batch_runs_on_as_many_gpus_at_once_as_its_widest_selection_allows():
    """The estimate's GPUs: every GPU of the pool (its workers, joined or not) for a job that
    selects none, else its selection's, never more than the pool's nor fewer than one."""
    assert gpus_at_once([None, [0]], expected=4) == 4
    assert gpus_at_once([[0, 1], [2]], expected=4) == 2
    assert gpus_at_once([[0, 1, 2, 3, 4, 5]], expected=4) == 4
    assert gpus_at_once([], expected=4) == 1
    assert gpus_at_once([None], expected=0) == 1
