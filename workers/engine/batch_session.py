"""The PyTorch pipeline's `BatchSession`: continuous batching on one model thread.

Each submitted request is planned (its front end: number spelling, splitting, tokens) on a
preparation thread of its own (`cosyq-model-prepare`, batch_preparation.py, one request at a
time), never on the model thread: a hostile 2,000-character text took ~1.2 s there, which every
row of the batch waited out. Planned, its first piece joins the LLM's row decoder
(`BatchDecoder`, or the int8 ONNX Runtime step's `OrtBatchDecoder`, handed in as a `RowDecoder`:
the tests drive this very session with a scripted one); every loop turn is one batched decode
step for all rows, after which the rows that finished go through flow and HiFT and their request
either joins again with its next piece (pieces stay in order, one row per request, so the
request's generator is drawn in exactly the order of the alone path) or completes its future.
Newcomers are admitted at every step boundary, up to `max_batch` requests in flight.

Rows that finish in the same step share one padded flow call (`ModuleFlow.mels`: each row its
own prompt and noise slice, CFG doubling it to 2B rows); HiFT runs per piece on the request's
own generator, so its source noise is drawn exactly as alone (HiFT is ~5% of the time). A
vocoder that batches (a batched Core ML conversion: `ModuleVocoder.batches`) gets those
pieces in one `waveforms` call instead, each row's noise still drawn from its own generator
first; if that call raises, each piece runs alone on the draws it already made.

Failure isolation: a request whose front end, validation or alone-sized stage raises fails
its own future. An exception inside a batched decode step drops the rows it touched and reruns
each of their requests alone from the start (same seed, so the same answer as alone), so one
poisoned input cannot fail its neighbours; a failed batched flow call reruns each piece's flow
alone. A piece longer than a batch row holds runs its whole request alone. Whole-request reruns
go to a thread of their own (`cosyq-model-alone`, one at a time, its front end made afresh on
the preparation thread first), so the batch keeps decoding and admitting beside them: a long
request never stalls the others, and holds no row meanwhile (`alone()` counts these, so the
worker fills their places with other jobs). Should the model thread's loop itself fail, every
job it had not settled (its rows, those waiting or queued, and those still being prepared, as
the preparation thread hands them over) and every task fails with that error, and the session
refuses new work.

`run_first` hands the model thread a whole task (a streamed job's synthesis, whose chunks go
out as they are made): it runs at the next step boundary, ahead of every row, which pause
meanwhile; a streamed job never waits for the batch to drain. Nor for a long batched call: the
model thread also takes such tasks between the batched flow's Euler steps, between the pieces
that finished in one step and between admissions (eight rows' flow is ~10 s on the full model
on a CPU, eight prefills a few). Tasks and rows take turns: after tasks ran for d seconds, the
rows in flight have the model thread for the next d seconds before another task starts, so
streamed jobs sent back to back (one tenant's) at most halve the rows' pace: run whenever
they came, each row got one step per task, and the rows' jobs ran past their deadlines.

Stage seconds per request are its share of each batched call (call time / rows in it; its own
prefill counts whole), so the requests' stage seconds add up to the model's busy time, and a
request alone (n = 1) gets each stage's wall time: one definition for both paths
(`shared.results.StageTimings`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import TypeVar

import numpy as np
import structlog

from workers.engine.api import SynthesisCanceled, SynthesisInput, SynthesisOutput
from workers.engine.batch_jobs import FirstTask, Job, capped, job_of, output_of, plan_of
from workers.engine.batch_preparation import Preparation
from workers.engine.batch_protocols import PlannedPipeline, RowDecoder
from workers.engine.batching import SessionFailed
from workers.engine.openmp_pool import release_thread_team
from workers.engine.requests import RequestPlan
from workers.engine.stages import ModuleVocoder
from workers.model.llm.batch import FinishedRow, RowTooLong

T = TypeVar("T")
log = structlog.get_logger(__name__)


class PipelineBatchSession:
    """A BatchSession over a `SynthesisPipeline` and the row decoder of its LLM (a torch
    `Qwen2LM`'s `BatchDecoder` or the int8 step's `OrtBatchDecoder`, `max_batch` rows)."""

    def __init__(self, pipeline: PlannedPipeline, decoder: RowDecoder, max_batch: int) -> None:
        self.pipeline = pipeline
        self.max_batch = max_batch
        self.decoder = decoder
        self._queue: queue.Queue[list[Job] | FirstTask | None] = queue.Queue()
        self._first: deque[FirstTask] = deque()
        self._pending = 0
        self._alone_n = 0  # requests handed to the alone lane, not yet settled
        self._lock = threading.Lock()
        self._jobs: list[Job] = []  # admitted, each with exactly one row in the decoder
        self._waiting: deque[Job] = deque()
        self._closing = False
        self._close_seen = False  # the model thread took the close marker off the queue
        self._serving_first = False
        self._first_s = 0.0  # seconds of `run_first` tasks, nested ones included
        self._rows_turn_until = 0.0  # perf_counter: the rows' turn after the last tasks ran
        self.busy_s = 0.0  # model-thread seconds spent on requests (the bench's idle share)
        self._crashed: BaseException | None = None  # the model thread's, once it failed
        release_thread_team()  # the model moves to its own thread: one OpenMP team
        # every front end (`begin`) runs there, one at a time, never on the model thread
        self._preparation = Preparation(pipeline.begin, self._hand_over)
        self._beside = ThreadPoolExecutor(1, thread_name_prefix="cosyq-model-alone")
        self._thread = threading.Thread(target=self._run, name="cosyq-model", daemon=True)
        self._thread.start()

    def submit(self, request: SynthesisInput) -> Future[SynthesisOutput]:
        future: Future[SynthesisOutput] = Future()
        job = Job(request, future)
        self._count_in()
        self._preparation.put(job)
        return future

    def run_first(self, task: Callable[[], T]) -> Future[T]:
        """Run `task` on the model thread at the next step boundary, ahead of every row."""
        future: Future[T] = Future()
        self._count_in(partial(self._queue.put, FirstTask(task, future)))
        return future

    def _count_in(self, enqueue: Callable[[], None] | None = None) -> None:
        """Count one more item in flight and `enqueue` it (refused once closing, or once the
        model thread failed: nothing is queued after its crash settled the queue)."""
        with self._lock:
            if self._crashed is not None:
                raise SessionFailed("the batch session's model thread failed") from self._crashed
            if self._closing:
                raise RuntimeError("the batch session is closed")
            self._pending += 1
            if enqueue is not None:
                enqueue()

    def in_flight(self) -> int:
        with self._lock:
            return self._pending

    def alone(self) -> int:
        """Requests in flight that hold no row: run, or waiting to run, beside the batch."""
        with self._lock:
            return self._alone_n

    def failed(self) -> bool:
        with self._lock:  # set before the crash settles any future
            return self._crashed is not None

    def close(self) -> None:
        with self._lock:
            self._closing = True
        # the close marker follows every submitted request through the preparation thread
        self._preparation.put(partial(self._queue.put, None))
        self._thread.join()
        self._preparation.stop()  # after the alone reruns the model thread handed it last
        self._beside.shutdown(wait=True)  # requests still running alone finish first

    # --- the preparation thread ---------------------------------------------------------

    def _hand_over(self, group: list[Job]) -> None:
        """Jobs whose front ends ran (or failed) go to the model thread; once it has failed,
        they settle with its error instead (the lock orders this against the crash's drain)."""
        with self._lock:
            crashed = self._crashed
            if crashed is None:
                self._queue.put(group)
                return
        for job in group:
            self._settle(job, error=crashed)

    def _plan_alone(self, job: Job, request: SynthesisInput) -> None:
        """A rerun's front end, afresh, then the request on the alone lane."""
        try:
            plan = self.pipeline.begin(request)
            self._beside.submit(self._run_alone, job, plan)
        except BaseException as e:
            self._settle(job, error=e)

    # --- the model thread -------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # a bug in the loop itself: no future is left hanging
            self._crashed_with(e)

    def _crashed_with(self, error: BaseException) -> None:
        """Every job and task settles with the loop's error: its rows, those waiting, those
        queued, and (as the preparation thread hands them over) those still being prepared;
        new work is refused from now on. The job boundary reports each (failed, retryable)."""
        log.error("batch_session_crashed", error_type=type(error).__name__)
        with self._lock:
            self._crashed = error  # from here on `_hand_over` settles, never queues
        self._preparation.halt()
        with contextlib.suppress(Exception):  # best effort: the decoder may be what failed
            self.decoder.clear()
        for job in [*self._jobs, *self._waiting, *self._drain_all()]:
            self._done(job, error=error)
        self._jobs.clear()
        self._waiting.clear()
        while self._first:
            first = self._first.popleft()
            if not first.future.done():
                first.future.set_exception(error)
            with self._lock:
                self._pending -= 1

    def _loop(self) -> None:
        while True:
            idle = not self._jobs and not self._waiting and not self._first
            if idle and self._queue.empty():
                # nothing to run: give the team back before waiting, so a job the worker runs
                # on another thread meanwhile (alone) is not slowed by this parked team
                release_thread_team()
            self._take(block=idle)
            start = time.perf_counter()
            self._serve_first()
            # the jobs waiting at this boundary; any that `_serve_first` takes off the queue
            # meanwhile join at the next one, as without it (a batch's make-up stays the same)
            present = len(self._waiting)
            while present and self._waiting and len(self._jobs) < self.max_batch:
                present -= 1
                self._admit(self._waiting.popleft())  # its front end and prefill
                self._serve_first()
            if self._jobs:
                self._step()
            self.busy_s += time.perf_counter() - start
            if self._close_seen and not self._jobs and not self._waiting and not self._first:
                return

    def _take(self, *, block: bool) -> None:
        """Move queued jobs to `_waiting` and tasks to `_first`; note the close marker."""
        if self._close_seen:
            block = False  # nothing comes after the marker
        try:
            item = self._queue.get(block=block)
            while True:
                if item is None:
                    self._close_seen = True
                elif isinstance(item, FirstTask):
                    self._first.append(item)
                else:
                    self._waiting.extend(item)
                item = self._queue.get_nowait()
        except queue.Empty:
            return

    def _serve_first(self) -> None:
        """Run every `run_first` task queued so far, unless it is the rows' turn (rows in
        flight, and tasks ran for d seconds less than d seconds ago). Also called from inside
        long batched work (between flow steps, between pieces): jobs that come in meanwhile wait
        in `_waiting` for the next step boundary; a task never runs inside another task."""
        if self._serving_first:
            return
        self._take(block=False)
        if not self._first or (self._jobs and time.perf_counter() < self._rows_turn_until):
            return
        self._serving_first = True
        began = time.perf_counter()
        try:
            while self._first:
                start = time.perf_counter()
                self._run_first(self._first.popleft())
                self._first_s += time.perf_counter() - start
        finally:
            self._serving_first = False
            ended = time.perf_counter()
            self._rows_turn_until = ended + (ended - began)

    def _drain_all(self) -> list[Job]:
        jobs: list[Job] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return jobs
            if isinstance(item, FirstTask):
                self._first.append(item)
            elif item is not None:
                jobs.extend(item)

    def _run_first(self, first: FirstTask) -> None:
        """A task ahead of the rows, whole; its outcome (or exception) on its future."""
        try:
            if first.future.set_running_or_notify_cancel():
                try:
                    first.future.set_result(first.task())
                except BaseException as e:  # the caller's job boundary classifies it
                    first.future.set_exception(e)
        finally:
            with self._lock:
                self._pending -= 1

    def _admit(self, job: Job) -> None:
        if not job.future.set_running_or_notify_cancel():
            self._done(job)
            return
        if job.error is not None:  # its front end failed on the preparation thread
            self._done(job, error=job.error)
            return
        self._jobs.append(job)
        self._join(job)

    def _join(self, job: Job) -> None:
        """Give the job's next piece a row (or finish the job alone / with its error)."""
        plan = plan_of(job)
        piece = plan.pieces[len(job.audio)]
        try:
            with plan.state.clock.timed("llm"):  # the row's own prefill: all its own
                self.decoder.add(
                    job,
                    piece.ids,
                    prompt_text=plan.prompt.text_ids,
                    prompt_speech=np.asarray(plan.prompt.speech_tokens, dtype=np.int64),
                    generator=plan.state.generator,
                    forced_length=self.pipeline.forced_speech_tokens,
                )
        except RowTooLong:
            self._alone(job)
        except BaseException as e:  # validation or this request's own prefill
            self._done(job, error=e)

    def _drop_canceled(self) -> None:
        """A canceled request's row leaves before the next step; the others go on."""
        for job in list(self._jobs):
            stop = job.request.should_stop
            if stop is not None and stop():
                self.decoder.drop(job)
                self._done(job, error=SynthesisCanceled("canceled"))

    def _step(self) -> None:
        self._drop_canceled()
        if not self._jobs:
            return
        rows = [row.key for row in self.decoder.rows]
        start = time.perf_counter()
        try:
            finished = self.decoder.step()
        except Exception:
            self.decoder.clear()
            for job in list(self._jobs):
                self._alone(job)
            return
        share = (time.perf_counter() - start) / max(len(rows), 1)
        for key in rows:
            assert isinstance(key, Job)
            plan_of(key).state.clock.seconds["llm"] += share
        self._pieces_done(finished)

    def _pieces_done(self, rows: list[FinishedRow]) -> None:
        """Flow for every row that finished this step in one padded batch (when the flow
        stage can), then each piece's speed change and HiFT on its own generator."""
        rows = [capped(row, getattr(self.pipeline, "llm", None)) for row in rows]
        mels: list[np.ndarray | None] = [None] * len(rows)
        batch = [i for i, row in enumerate(rows) if row.tokens]
        flow = self.pipeline.flow
        many = getattr(flow, "mels", None) if getattr(flow, "batches", False) else None
        if len(batch) > 1 and many is not None:
            start, first_before = time.perf_counter(), self._first_s
            try:
                made = many(
                    [
                        (np.asarray(rows[i].tokens, np.int32), job_of(rows[i]).request.prompt)
                        for i in batch
                    ],
                    between_steps=self._serve_first,
                )
            except Exception:  # rerun one by one: each piece's own flow call, as alone
                made = [None] * len(batch)
            nested = self._first_s - first_before  # tasks run between steps: not the rows'
            share = (time.perf_counter() - start - nested) / len(batch)
            for i, mel in zip(batch, made, strict=True):
                mels[i] = mel
                if mel is not None:
                    plan_of(job_of(rows[i])).state.clock.seconds["flow"] += share
        vocoder = self.pipeline.vocoder
        if len(batch) > 1 and isinstance(vocoder, ModuleVocoder) and vocoder.batches:
            self._vocode_together(vocoder, rows, mels)
            return
        for row, mel in zip(rows, mels, strict=True):
            self._serve_first()
            self._piece_done(row, mel)

    def _vocode_together(
        self, vocoder: ModuleVocoder, rows: list[FinishedRow], mels: list[np.ndarray | None]
    ) -> None:
        """Speed change per piece, then one `waveforms` call for every piece with speech."""
        ready: list[tuple[FinishedRow, np.ndarray]] = []
        for row, mel in zip(rows, mels, strict=True):
            try:
                speech = self.pipeline.piece_mel(
                    np.asarray(row.tokens, np.int32), plan_of(job_of(row)), mel
                )
            except BaseException as e:
                self._done(job_of(row), error=e)
                continue
            if speech is None:
                self._piece_audio(row, np.zeros(0, dtype=np.float32))
            else:
                ready.append((row, speech))
        if not ready:
            return
        start = time.perf_counter()
        noises = [vocoder.noise(mel, plan_of(job_of(row)).state.generator) for row, mel in ready]
        try:
            made: list[np.ndarray | None] = list(vocoder.waveforms([m for _, m in ready], noises))
        except Exception:  # each piece alone, on the draws it already made
            made = [None] * len(ready)
        share = (time.perf_counter() - start) / len(ready)
        for (row, mel), noise, wav in zip(ready, noises, made, strict=True):
            clock = plan_of(job_of(row)).state.clock
            if wav is not None:
                clock.seconds["hift"] += share
                self._piece_audio(row, wav)
                continue
            try:
                with clock.timed("hift"):
                    alone = vocoder.waveform_with(mel, noise)
            except BaseException as e:
                self._done(job_of(row), error=e)
                continue
            self._piece_audio(row, alone)

    def _piece_done(self, row: FinishedRow, mel: np.ndarray | None) -> None:
        try:
            ids = np.asarray(row.tokens, np.int32)
            audio = self.pipeline.piece_audio(ids, plan_of(job_of(row)), mel)
        except BaseException as e:
            self._done(job_of(row), error=e)
            return
        self._piece_audio(row, audio)

    def _piece_audio(self, row: FinishedRow, audio: np.ndarray) -> None:
        """One piece's samples: the job's next piece joins, or the job completes."""
        job = job_of(row)
        job.batch_size = max(job.batch_size, row.batch_size)
        plan = plan_of(job)
        try:
            plan.state.record_stop(row.tokens, row.stop)
            job.audio.append(audio)
            if len(job.audio) < len(plan.pieces):
                self._join(job)
                return
            samples = self.pipeline.finish(job.audio, plan)
        except BaseException as e:
            self._done(job, error=e)
            return
        self._done(job, output=output_of(job, samples, self.pipeline.sample_rate))

    def _alone(self, job: Job) -> None:
        """Rerun the whole request on its own from the start, with the seed it was given, on
        the thread beside the batch; its front end runs afresh on the preparation thread. It
        holds no row from now on (`alone()` counts it until it settles)."""
        if job in self._jobs:
            self._jobs.remove(job)
        request = job.request
        if job.plan is not None:
            request = dataclasses.replace(request, seed=job.plan.state.seed)
        with self._lock:
            job.alone = True
            self._alone_n += 1
        self._preparation.put(partial(self._plan_alone, job, request))

    def _run_alone(self, job: Job, plan: RequestPlan) -> None:
        """On the thread beside the batch: the planned request alone, then its future."""
        try:
            output = self.pipeline.synthesize_planned(plan)
        except BaseException as e:
            self._settle(job, error=e)
            return
        self._settle(job, output=output)

    def _done(
        self,
        job: Job,
        *,
        output: SynthesisOutput | None = None,
        error: BaseException | None = None,
    ) -> None:
        if job in self._jobs:
            self._jobs.remove(job)
        self._settle(job, output=output, error=error)

    def _settle(
        self,
        job: Job,
        *,
        output: SynthesisOutput | None = None,
        error: BaseException | None = None,
    ) -> None:
        """The job's future and the in-flight count (either thread; `_jobs` is not touched)."""
        if not job.future.done():
            if error is not None:
                job.future.set_exception(error)
            elif output is not None:
                job.future.set_result(output)
        with self._lock:
            self._pending -= 1
            if job.alone:
                self._alone_n -= 1
