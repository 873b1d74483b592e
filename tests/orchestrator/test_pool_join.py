"""The pool's early start (``launching.pool_join.EarlyStart``): its own workers, no Ray needed."""

from __future__ import annotations

import itertools

import pytest

from orchestrator.launching import pool_join
from orchestrator.launching.pool_join import EarlyStart


class FakeWorker:
    """A worker whose ``identify`` answers a ref naming it, and records what it was asked."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.asked: list = []
        self.identify = self

    def remote(self, selections):
        self.asked.append(selections)
        return ("ref", self.n)


@pytest.fixture
def killed(monkeypatch):
    ended: list[FakeWorker] = []
    monkeypatch.setattr(pool_join, "kill", ended.append)
    return ended


def early_start(timeout_s: float = 60.0):
    started: list[FakeWorker] = []
    counter = itertools.count()

    def spawn():
        started.append(FakeWorker(next(counter)))
        return started[-1]

    return EarlyStart(spawn, ["all"], lambda: timeout_s), started


def test_workers_start_a_few_at_a_time_and_one_more_as_each_answers(killed):
    joining, started = early_start()
    joining.begin(4, 2)
    assert len(started) == 2 and started[0].asked == [["all"]]
    assert joining.filling and joining.owns(("ref", 0)) and not joining.owns(("ref", 9))
    assert joining.take(("ref", 0)) is started[0]
    assert len(started) == 3 and not joining.owns(("ref", 0))
    for ref in joining.refs():
        joining.take(ref)
    joining.take(("ref", 3))
    assert len(started) == 4 and not joining.filling and not killed


def test_a_held_worker_is_replaced_and_ended_only_once_none_is_to_join(killed):
    joining, started = early_start()
    joining.begin(2, 2)
    joining.hold_and_retry(joining.take(("ref", 0)))  # it landed on a GPU the pool has
    assert len(started) == 3
    joining.release_held()
    assert not killed  # workers are still joining: its GPU stays taken
    joining.take(("ref", 1))
    joining.take(("ref", 2))
    joining.release_held()
    assert killed == [started[0]]


def test_workers_past_their_deadline_are_ended_and_as_many_more_start(killed):
    joining, started = early_start(timeout_s=0.0)
    joining.begin(3, 2)
    assert joining.expire() == 2
    assert killed == started[:2] and len(started) == 3
    joining.end()
    assert killed == started and not joining.filling and joining.refs() == []
