"""The supervisor: runs one batch of jobs over a started pool and stores results as they finish.

It deals each job to the next free GPU (``placement=any``, or one of a list of GPU UUIDs), or to
every GPU (``every``: a fleet survey), among those the job's ``device.gpus`` selects
(``launching.scheduling``). A busy GPU is sent its next trial too (``queue_ahead``): Ray
runs an actor's calls in order, so it starts as the last returns, without a round trip through the
driver (Ray Data's actor pools keep several tasks in flight per actor for the same reason).
Results are handled **as they finish** (``ray.wait``): each row is written to the store on the
driver at once, so a cluster needs no shared filesystem and a killed sweep loses only the trials
in flight. Jobs whose trial is already stored are skipped, unless ``hydra.launcher.retry`` runs
them again as a new attempt (resume, one keyed query per store and chunk:
``orchestrator.launching.resume``).

Failure semantics (the sweep always ends with a row for every job and GPU); a failure the
setting caused is a result, one of the circumstances is recorded ``not_measured``:

- the kernel raised, or a check failed: the trial's own row says so (``crash``, ``wrong``...); the
  worker goes on;
- the worker process died (SIGKILL, segfault, OOM: ``ActorDiedError`` and the other
  ``RayActorError``s): a new worker is started on the same GPU (same node), restores what the
  dead one left changed, and reports the dead one's trace (``orchestrator.measuring.trial_trace``):
  dead inside the trial's kernel calls, the trial is a ``crash``; before its first kernel call, or
  between trials, it is ``not_measured``; with its node lost, ``not_measured`` at once;
- a trial ran past its limit (``hydra.launcher.timeout_s``, else the job's ``measure.timeout_s``):
  its worker is killed and replaced and the trial is recorded as ``timeout``;
- a trial queued behind one whose worker died, timed out or whose GPU was retired never ran: its
  job is sent again (to the new worker, or another GPU);
- a GPU found unhealthy before a trial is retired and the job goes to another GPU; a GPU whose
  worker died ``max_restarts`` times in a row (or whose replacement did not start within
  ``start_timeout_s``) is retired: ``any`` jobs go to the other GPUs; jobs no GPU is left to
  run (its ``every`` jobs) are recorded as ``not_measured``.

Slots move only through the pool's and the slot's methods (``orchestrator.launching.slot``); this
module decides *when*, never edits their fields. Ray is imported only inside functions.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from orchestrator import interrupt
from orchestrator.launching.pool import GpuPool
from orchestrator.launching.ray_calls import first_line, kill
from orchestrator.launching.resume import BatchStores, Resume
from orchestrator.launching.scheduling import JobQueue, share_while_starting
from orchestrator.launching.slot import Call, Slot, SlotState
from orchestrator.progress import Progress, summarise
from orchestrator.results.columns import LaunchFacts
from orchestrator.results.rows import JobResult, Status, add_launch, failure_rows

if TYPE_CHECKING:
    from orchestrator.jobs.replies import AcquireReply, TrialReply, WorkerInfo
    from orchestrator.launching.batch import Job, JobStream
    from orchestrator.measuring.trial_trace import TrialTrace

class Supervisor:
    """Runs one batch of jobs over a started pool (see the module docstring for the semantics).

    Jobs are taken from the stream as the GPUs need them (a chunk whenever fewer than two per GPU
    are queued), so the driver holds only the jobs in flight and scheduling costs the same per
    trial at 30 jobs or 10,000.

    Args:
        pool: the started pool of workers.
        jobs: the batch, checked (``JobStream.check`` and ``GpuPool.check``).
        progress: where counts and lines go.
    """

    def __init__(self, pool: GpuPool, jobs: JobStream, progress: Progress) -> None:
        self.pool = pool
        self.jobs = jobs
        self.progress = progress
        self.settings = pool.settings
        self.queue = JobQueue(self.settings.placement == "every", (s.uuid for s in pool.slots))
        self.results: dict[int, dict[str, JobResult]] = {}  # job number -> GPU uuid -> result
        self.retired: dict[str, dict[str, Any]] = {}  # GPU uuid -> label, host, reason, time
        self.stores = BatchStores(self.settings)
        self.frameworks = jobs.frameworks
        self.low_water = 2 * len(pool.slots)  # queued jobs below this: take another chunk
        self.chunk = max(64, 2 * pool.expected)
        # Workers of a local Ray instance share this machine's cores; a cluster's have their own.
        local = self.settings.address is None
        self.warm_limit = max(1, os.cpu_count() or 1) if local else len(pool.slots)
        self.queue_ahead = self.settings.queue_ahead
        self.attempts: dict[str, int] = {}  # trial key -> the attempt a run now gets (default 1)
        # GPU uuid -> the job its dead worker ran, the error, its launch record (sent, died at)
        self.orphans: dict[str, tuple[Job, str, dict[str, float]]] = {}

    # --- the loop ------------------------------------------------------------------------------
    def run(self) -> list[JobResult]:
        """Run the batch to the end; returns each job's result, in job order."""
        import ray

        try:
            self._refill()
            self._fail_stranded()  # the queues of GPUs retired as the pool started
            for slot in self.pool.slots:
                self._show(slot)
            while not self._finished():
                interrupt.check()  # a SIGTERM whose KeyboardInterrupt Python dropped
                self._refill()
                self._start_next()
                self._dispatch()
                refs = self.pool.refs()
                if not refs:  # nothing runs and nothing can: what is left has no live GPU
                    exhausted = self.jobs.exhausted
                    self.low_water = self.jobs.total  # take (and record) every job left
                    self._refill()
                    self._fail_stranded()
                    if exhausted:
                        break
                    continue
                wait_s = min(0.25, max(self.pool.next_deadline() - time.monotonic(), 0.0))
                ready, _ = ray.wait(refs, num_returns=1, timeout=wait_s)
                for ref in ready:
                    self._on_ready(ref)
                self._check_deadlines()
                self._show_waiting()
                self.progress.refresh()
            for uuid in list(self.orphans):  # a dead worker's GPU that never reported back
                self._resolve_orphan(uuid, None, "its GPU never reported back")
        finally:
            self.stores.close()
        if self.progress.skipped:
            self.progress.note(
                f"ray_gpus: {self.progress.skipped} trial(s) already in the store, skipped (resume)"
            )
        return [self._result(num) for num in self.jobs.nums]

    def _result(self, num: int) -> JobResult:
        """The job's result over the GPUs it ran on (the worst, for ``every``)."""
        results = list(self.results[num].values())
        return results[0] if len(results) == 1 else JobResult.combine(results)

    def _finished(self) -> bool:
        # A worker being replaced restores its GPU as it starts: wait for that too.
        if any(s.state in (SlotState.BUSY, SlotState.STARTING) for s in self.pool.slots):
            return False
        return self.jobs.exhausted and self.queue.empty()

    def _refill(self) -> None:
        """Take jobs from the stream while fewer than ``low_water`` are queued; queue what is not
        stored yet (or is to run again), count what is (resume: one keyed query per store and
        chunk)."""
        live = [s.uuid for s in self.pool.slots if s.live]
        while not self.jobs.exhausted and self.queue.waiting(live) < self.low_water:
            chunk = self.jobs.take(self.chunk)
            for job, stored in zip(chunk, self.stores.resume(chunk, self.pool.slots), strict=True):
                self.attempts.update({job.spec.trial_key(u): r.attempt
                                      for u, r in stored.items() if r.attempt > 1})
                self._plan_job(job, stored)
            # What only GPUs retired before these jobs came could run cannot run.
            if any(not s.live for s in self.pool.slots):
                self._fail_stranded()

    def _plan_job(self, job: Job, stored: dict[str, Resume]) -> None:
        """Queue one job (per GPU, for ``every``) unless its trial's stored rows stand
        (``stored``: what to do with its trial on each GPU whose trial counts)."""
        done = {uuid: JobResult.of(resume.rows, job.spec.objective_name)
                for uuid, resume in stored.items() if not resume.run}
        for uuid, result in self.queue.plan(job, self.pool.slots, done).items():
            self.results.setdefault(job.num, {})[uuid] = result
            self.progress.trial_skipped()

    # --- sending work --------------------------------------------------------------------------
    def _start_next(self) -> None:
        """Have waiting workers take their GPU and load the frameworks, ``warm_limit`` at a time:
        on one machine, sixteen workers importing JAX at once share its cores and the first
        trial waits for all of them; a few at a time, it waits for one."""
        warming = sum(s.state in (SlotState.ACQUIRING, SlotState.WARMING) for s in self.pool.slots)
        for slot in self.pool.slots:
            if warming >= self.warm_limit:
                return
            if slot.state is SlotState.IDENTIFIED:
                self._acquire(slot)
                warming += 1

    def _acquire(self, slot: Slot) -> None:
        self.pool.calls.send(slot, Call.ACQUIRE, self.settings.lease_wait_s)
        self._show(slot)

    def _dispatch(self) -> None:
        """Send each idle GPU its next job (the least used first), then one to each busy GPU to
        run after its trial (``queue_ahead``)."""
        idle = [s for s in self.pool.slots if s.state is SlotState.IDLE]
        share = self._share()  # the same for every send below: none starts or joins a worker
        for slot in self.queue.least_used(idle):
            self._send(slot, share)
        if self.queue_ahead:
            for slot in self.pool.slots:
                if slot.may_queue:
                    self._send(slot, share)

    def _share(self) -> int | None:
        """The most jobs a GPU takes while workers are still joining or warming up (None: no
        limit): ``scheduling.share_while_starting`` over the pool as it is now."""
        return share_while_starting(self.pool.slots, filling=self.pool.filling,
                                    expected=self.pool.expected, total=self.jobs.total)

    def _send(self, slot: Slot, share: int | None) -> None:
        """Send a GPU the next job it may take now (``JobQueue.take``, at most ``share`` per GPU
        while workers start): an idle GPU to run at once, a busy one to run after its trial."""
        ahead = slot.state is SlotState.BUSY
        if ahead and not (self.queue_ahead and slot.may_queue):
            return
        live = [s for s in self.pool.slots if s.live] if ahead else None
        job = self.queue.take(slot, share=share, ahead_among=live)
        if job is None:
            return
        deadline = time.monotonic() + job.timeout_s
        attempt = self._attempt(job, slot)
        self.pool.calls.send(slot, Call.RUN, job.spec, job.sweep_id, attempt, deadline=deadline,
                             job=job)
        self._show(slot)

    def _attempt(self, job: Job, slot: Slot) -> int:
        """The attempt number of ``job``'s trial on the slot's GPU."""
        return self.attempts.get(job.spec.trial_key(slot.uuid), 1)

    # --- results -------------------------------------------------------------------------------
    def _on_ready(self, ref: Any) -> None:
        import ray

        if self.pool.joining(ref):
            self._on_join(ref)
            return
        ahead = self.pool.calls.ahead_of(ref)
        if ahead is not None:  # Ray ran that one first: its answer is there to handle first
            self._on_ready(ahead)
        owner = self.pool.calls.take(ref)  # None: given up, or a queued trial taken back
        if owner is None:
            return
        slot, call = owner
        if call is Call.RUN:
            self._on_trial(slot, ref)
            return
        try:
            value = ray.get(ref)
        except ray.exceptions.RayTaskError as e:  # our code raised; the GPU is unusable to it
            self._retire(slot, f"its worker failed to {call.value}: {first_line(e)}")
            return
        except ray.exceptions.RayError as e:
            self._replace(slot, f"its worker died ({call.value}): {first_line(e)}")
            return
        if call is Call.IDENTIFY:
            self._on_identify(slot, value)
        elif call is Call.ACQUIRE:
            self._on_acquire(slot, value)
        else:  # warm
            slot.mark_idle()
            self._show(slot)

    def _on_join(self, ref: Any) -> None:
        """A worker of an early-started pool is up: a new GPU, once it admits the batch."""
        from orchestrator.launching.scheduling import refusals

        slot = self.pool.join(ref)
        if slot is None:
            if self.pool.join_error:
                self.progress.note(f"ray_gpus: a worker could not start: {self.pool.join_error}")
            return
        self.queue.add_gpu(slot.uuid)
        self.low_water = max(self.low_water, 2 * len(self.pool.slots))
        self.stores.note_gpus(self.pool.slots)  # a re-run finds the trials of every GPU by it
        for action in slot.info.restored:
            self._note_restored(slot, action)
        refused = refusals([slot], self.jobs.samples)
        if refused:
            self._retire(slot, f"it refuses {refused[0]}")
        self._show(slot)

    def _on_acquire(self, slot: Slot, reply: AcquireReply) -> None:
        if not reply.ok:
            self._retire(slot, reply.error or "the GPU's lease was not free")
            return
        for action in reply.restored:
            self._note_restored(slot, action)
        self.pool.calls.send(slot, Call.WARM, self.frameworks)
        self._show(slot)

    def _on_trial(self, slot: Slot, ref: Any) -> None:
        import ray

        trial = slot.take_trial()
        job, sent = trial.job, {"dispatched_at": trial.dispatched_at}
        try:
            reply: TrialReply = ray.get(ref)
        except ray.exceptions.RayTaskError as e:  # our code raised in the worker, which lives on
            self._next_trial(slot)
            error = f"not measured: the worker raised: {first_line(e)}"
            self._record(slot, job, self._failure(slot, job, Status.NOT_MEASURED, error), sent)
        except ray.exceptions.RayError as e:  # the process is gone: ActorDiedError and the like
            where = f"pid {slot.info.pid} on {slot.info.host}"
            error = f"the worker process died ({where}): {first_line(e)}"
            if not self.pool.node_alive(slot.node_id):  # the node with it: nothing to read
                rows = self._failure(slot, job, Status.NOT_MEASURED, f"{error}; its node was lost")
                self._record(slot, job, rows, {**sent, "died_at": time.time()})
            else:  # its replacement reads the dead one's trace (``_on_identify``)
                self.orphans[slot.uuid] = (job, error, {**sent, "died_at": time.time()})
            self._replace(slot, "its worker died during a trial")
        else:
            if not reply.ran:  # the GPU was unhealthy before the trial: nothing ran
                self._retire(slot, reply.unhealthy or "unhealthy", requeue=job)
                return
            slot.trial_returned(reply.builds)
            if not reply.unhealthy:  # the next job first: the GPU need not wait for the write
                self._next_trial(slot)
                self._send(slot, self._share())
            self._record(slot, job, reply.rows, {**reply.timing(), **sent})
            if reply.unhealthy:  # it failed during this trial: no further trials
                self._retire(slot, reply.unhealthy)
                return
        self._show(slot)

    def _next_trial(self, slot: Slot) -> None:
        """A trial's answer was handled and its worker lives: the trial queued behind it is
        now in flight (its worker began it as the other returned), or the GPU is idle."""
        if slot.queued is None:
            slot.mark_idle()
        else:
            self.pool.calls.promote(slot, slot.queued.job.timeout_s)

    def _take_back(self, slot: Slot) -> None:
        """The slot's queued trial never ran (its worker is being replaced, or its GPU retired):
        its job goes back to the front of its queue, to be sent again."""
        job = self.pool.calls.unqueue(slot)
        if job is not None:
            self.pool.stop_queued(slot)  # a worker held, not killed, must not run it either
            self.queue.put_back(job, slot.uuid, sent=True)

    def _failure(self, slot: Slot, job: Job, status: Status, error: str) -> list[dict[str, Any]]:
        """The rows of a trial that returned none, on the slot's GPU."""
        return failure_rows(
            job.spec, slot.info.identity, status.value, error,
            sweep_id=job.sweep_id, host=slot.info.host, attempt=self._attempt(job, slot),
        )

    def _resolve_orphan(self, uuid: str, trace: TrialTrace | None, why: str = "") -> None:
        """Record the trial a dead worker was running on GPU ``uuid``, from its trace: a crash
        inside the trial's kernel calls, else not measured."""
        job, error, extra = self.orphans.pop(uuid)
        slot = next(s for s in self.pool.slots if s.uuid == uuid)
        if trace is not None and trace.trial_key == job.spec.trial_key(uuid) \
                and trace.in_kernel_calls:
            status, error = Status.CRASH, f"{error}; it died in the trial's kernel calls"
        else:
            status = Status.NOT_MEASURED
            error += f"; not measured: {why or 'it died before the trial began its kernel calls'}"
        self._record(slot, job, self._failure(slot, job, status, error), extra)

    def _record(
        self, slot: Slot, job: Job, rows: list[dict[str, Any]], extra: dict[str, Any]
    ) -> None:
        """Write a trial's rows to the store now, count the trial, print its summary."""
        launch: LaunchFacts = {
            "launcher": "ray_gpus",
            "host": slot.info.host,
            "node_id": slot.node_id,
            "worker_pid": slot.info.pid,
            "ray_gpu_id": slot.info.ray_gpu_id,
            "worker_restarts": slot.restarts,
            "job_num": job.num,
            "dispatched_at": None,
            **extra,
        }
        store = self.stores.of(job, self.pool.slots)
        add_launch(rows, launch)
        for row in rows:
            store.put(row)
        self.results.setdefault(job.num, {})[slot.uuid] = JobResult.of(rows,
                                                                       job.spec.objective_name)
        if not job.spec.quiet:
            self.progress.log(summarise(rows, f"{slot.label} {job.label}"))
        status = next((r["status"] for r in rows if r.get("status") != Status.OK), Status.OK)
        self.progress.trial_done(str(status), extra.get("trial_s"))

    def _check_deadlines(self) -> None:
        late = self.pool.expire_joining()
        if late:
            self.progress.note(f"ray_gpus: {late} worker(s) did not start within "
                               f"{self.settings.start_timeout_s:g} s")
        now = time.monotonic()
        for slot in self.pool.slots:
            if slot.deadline > now:
                continue
            # answered in time, not handled yet
            if slot.ref is not None and self.pool.calls.answered(slot.ref):
                self._on_ready(slot.ref)
                continue
            self.pool.calls.cancel(slot)
            if slot.state is SlotState.BUSY:
                trial = slot.take_trial()
                job = trial.job
                kill(slot.actor)
                error = (
                    f"no result after {job.timeout_s:g} s (timeout_s): "
                    "the worker was killed and replaced"
                )
                rows = self._failure(slot, job, Status.TIMEOUT, error)
                extra = {"dispatched_at": trial.dispatched_at, "killed_at": time.time()}
                self._record(slot, job, rows, extra)
                self._replace(slot, "a trial timed out")
            else:
                self._replace(
                    slot, f"a new worker did not start within {self.settings.start_timeout_s:g} s"
                )

    # --- replacing and retiring ----------------------------------------------------------------
    def _replace(self, slot: Slot, why: str) -> None:
        """Kill the slot's worker and start another on the same GPU (same node)."""
        self._take_back(slot)
        kill(slot.actor)
        deaths = slot.worker_died()
        limit = self.settings.max_restarts
        if 0 <= limit < deaths:
            self._retire(
                slot, f"{why}; its workers died {deaths} times in a row (max_restarts={limit})"
            )
            return
        self.progress.note(f"ray_gpus: {slot.label} ({slot.uuid}): {why}; starting a new worker")
        self._start_worker(slot, replacing=True)

    def _start_worker(self, slot: Slot, *, replacing: bool) -> None:
        deadline = time.monotonic() + self.settings.start_timeout_s
        self.pool.start_worker(slot, deadline=deadline, replacing=replacing)
        self._show(slot)

    def _on_identify(self, slot: Slot, info: WorkerInfo) -> None:
        if info.uuid in self.orphans:  # the trace is of the GPU the worker landed on
            self._resolve_orphan(info.uuid, info.dead_trace)
        if info.uuid != slot.uuid:
            # Ray gave it another free GPU of the node: hold that one and try again.
            if slot.park() > self.pool.node_gpus(slot.node_id):
                self._retire(slot, "no new worker landed on this GPU")
            else:
                self._start_worker(slot, replacing=False)
            return
        for actor in slot.adopt(info):
            kill(actor)
        for action in info.restored:
            self._note_restored(slot, action)
        self._acquire(slot)

    def _note_restored(self, slot: Slot, action: str) -> None:
        self.progress.note(f"ray_gpus: {slot.label}: {action} (left changed by a killed worker)")

    def _retire(self, slot: Slot, reason: str, requeue: Job | None = None) -> None:
        """Take a GPU out of the sweep: end its worker, record or move the jobs it will not run.

        Args:
            slot: the GPU.
            reason: why, for the progress line and the rows of jobs it leaves unrun.
            requeue: a job it was given but did not start: back to the front of the queue for
                another GPU (``placement=every``: recorded as ``not_measured`` with its queue).
        """
        self._take_back(slot)
        if requeue is not None:
            self.queue.put_back(requeue, slot.uuid, sent=False)
        self.pool.retire(slot, reason)
        if slot.uuid in self.orphans:  # no replacement will report what its dead worker did
            self._resolve_orphan(slot.uuid, None, f"its GPU was retired ({reason})")
        self.progress.note(f"ray_gpus: {slot.label} ({slot.uuid}) retired: {reason}")
        self.retired[slot.uuid] = {
            "label": slot.label, "host": slot.info.host, "reason": reason, "at": time.time(),
        }
        self.stores.note_retired(slot.uuid, self.retired[slot.uuid])
        self._fail_stranded()
        self._show(slot)

    def _fail_stranded(self) -> None:
        """Record the queued jobs that no live GPU may run (``JobQueue.stranded``: for
        ``every``, those queued on a retired GPU; else those whose every GPU is retired)."""
        for job, slots, error in self.queue.stranded(self.pool.slots):
            rows = self._failure(slots[0], job, Status.NOT_MEASURED, error)
            self._record(slots[0], job, rows, {})

    # --- showing -------------------------------------------------------------------------------
    def _show(self, slot: Slot) -> None:
        self.progress.set_lane(slot.label, slot.activity(self.frameworks))

    def _show_waiting(self) -> None:
        now = time.monotonic()
        for slot in self.pool.slots:
            if slot.state is SlotState.ACQUIRING and now - slot.since > 1.0:
                self.progress.set_lane(slot.label, f"waiting for lease {now - slot.since:.0f} s")
