"""A replica's SimPy process (:class:`ReplicaProcess`): the engine's iteration loop.

One process per replica running **one SimPy event per engine iteration**, at most::

    batch = replica.form_batch(policy.schedule, now)
        # reserve the decodes' KV blocks (preempting if short), let the policy add prefill
        # work through the replica's verbs, snapshot the batch (immutable)
    dt = cost_model(batch)               # price it
    if not env.sleep(dt, wakeup): yield  # the iteration runs (SimPy's Timeout(dt), in place)
    replica.postprocess(env.now)         # emit tokens, finish, free blocks

(a ``RooflineCost`` is priced from the batch's fields, the same price without the snapshot:
:mod:`sim.costs.roofline_price`)

and :func:`submit`, the arrival verb: an arriving request is queued or rejected at once. One
replica, a cluster's replicas and both pools of a disaggregated run are each this process
(:mod:`sim.engine.simulation` says how the loop sleeps, pulls arrivals and fast-forwards).

Invariants (tests/test_engine.py, tests/test_max_model_len.py): every request submitted comes
out once, finished or rejected with a reason; an empty batch raises unless forming it
preempted running requests (then it is formed anew, each round leaving fewer running); a cost
model's price must be finite and >= 0.
"""

from __future__ import annotations

try:
    import cython
except ImportError:  # interpreted without Cython: its no-op names (sim/cython_shim.py)
    from sim import cython_shim as cython

import math
from heapq import heappop, heappush

from ...costs.roofline_price import RooflinePrice, batch_pricer
from ..kv.blocks import BlockManager
from ...results.metrics import CONTEXT_LENGTH, KV_POOL
from .batch import decode_pricer
from .events import URGENT, Wakeup, delay_until
from .fastforward import decode_stretch
from .invariants import check_replica
from .iteration import Iteration
from .records import ROW
from .request import Request

def reject_too_long(replica, r) -> bool:
    """Reject ``r`` at ``replica`` if its prompt + output tokens exceed the replica's
    ``max_model_len`` (vLLM's OpenAI server: prompt + max_tokens > max_model_len, checked
    before the request reaches the scheduler); True if rejected."""
    limit, total = replica.max_model_len, r.num_prompt_tokens + r.num_output_tokens
    if limit is None or total <= limit:
        return False
    replica.reject(r, f"{CONTEXT_LENGTH}: {total:,} tokens ({r.num_prompt_tokens:,} prompt + "
                      f"{r.num_output_tokens:,} output) exceed max_model_len {limit:,}")
    return True


@cython.locals(replica=Iteration, r=Request, need=cython.longlong)
def submit(replica, process, r) -> bool:
    """Queue an arriving request, or reject it when it exceeds ``max_model_len``, the policy
    refuses it or it could never fit the pool; True if queued."""
    if replica.max_model_len is not None and reject_too_long(replica, r):
        return False
    if replica.reject_reason is not None:  # the policy's own (TensorRT-LLM's max_num_tokens)
        reason = replica.reject_reason(r)
        if reason:
            replica.reject(r, reason)
            return False
    need = r.num_prompt_tokens + r.num_output_tokens + replica.num_spec_tokens
    if need > replica.capacity_tokens:
        spec = (f" (with {replica.num_spec_tokens} speculative lookahead slots)"
                if replica.num_spec_tokens else "")
        replica.reject(r, f"{KV_POOL}: needs {-(-need // replica.block_size)} KV blocks for "
                          f"{need} tokens{spec} but the pool has {replica.blocks.num_blocks}")
        return False
    replica.enqueue(r)
    process.wake()
    return True


class ReplicaProcess:
    """One serving replica: one SimPy process, one event per iteration.

    Open-loop arrivals are pulled, not pushed: before forming each batch the replica queues
    every request whose ``arrival_time`` has come (in order), and an idle replica sleeps until
    the next arrival. That is the same arrival process as one SimPy event per request, minus
    those events (measured: ~15% of the run time at 100k requests).
    """

    def __init__(self, env, replica, policy, cost, records, progress, total):
        if getattr(replica, "lora", None) is not None:  # plus its adapters' GEMMs and loads
            cost = replica.lora.priced(cost)
        self.env, self.replica, self.policy, self.cost = env, replica, policy, cost
        self.records = records
        self.arrivals = ()
        self.check = False  # SimConfig.check: the invariants after every batch formed
        # pure-decode stretches in one event (fastforward.py): only where nothing but arrivals
        # can act meanwhile (see can_fast_forward); a cluster's replicas stop at its next
        # arrival (next_arrival(): when the dispatcher next routes)
        self.fast_forward = False
        self.pricer = None  # the cost model's pure_decode_cost, where it may be used
        self.scratch = None  # a stretch's rows as C doubles (compiled decode_stretch's)
        self.next_arrival = None
        # a closed loop: a finish issues the next request at its time (clients' hooks), so a
        # stretch ends at its first finishing iteration, which the loop finishes once the
        # clock is there (pending_finish: that decode step); stretches stop at env.peek(),
        # the clients' next issue after a think time
        self.closed = False
        self.pending_finish = None
        self.idle = False  # waiting for work: woken by the next arrival or transfer (wake())
        self._loop = None
        self._wakeup = None
        self.landings = []  # offload tier: the times its loads in flight land (a heap)
        if getattr(replica, "tier", None) is not None:
            replica.on_load = self._load
        self.bar = None
        if progress:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=total, unit="req", desc="simulating", leave=False)

    def start(self):
        """Start the loop where ``env.process`` would (URGENT, now): its generator is
        resumed by its own :class:`~sim.engine.core.events.Wakeup` each time (an iteration's end,
        a wake-up)."""
        self._loop = self.loop()
        next(self._loop)  # (to its first yield, before anything: started, not yet run)
        self._wakeup = Wakeup(self._loop.send)
        self.env.wake(self._wakeup, priority=URGENT)

    def wake(self):
        """New work: an idle loop is resumed now (once, however many arrive meanwhile)."""
        if self.idle:
            self.idle = False
            self.env.wake(self._wakeup)  # (where Event.succeed() puts it: NORMAL, now)

    @cython.locals(replica=Iteration, price=RooflinePrice, nxt=cython.longlong,
                   n_arrivals=cython.longlong, dropped=cython.longlong,
                   n_running=cython.longlong, fast=cython.bint, detail=cython.bint,
                   n_prefill=cython.longlong, n_decode=cython.longlong,
                   row=cython.double[8], row_bytes=cython.Py_ssize_t, compiled=cython.bint,
                   blocks=BlockManager, check=cython.bint)
    def loop(self):
        yield  # (start(): resumed from here when the environment starts it)
        env, replica, policy, cost = self.env, self.replica, self.policy, self.cost
        # one flat row of ITERATION_COLUMNS per iteration, packed (records.ROW: 3x faster than
        # array.extend of a tuple, which parses each value alone; the same bytes)
        write, pack = self.records.frombytes, ROW.pack
        row_bytes = ROW.size  # (compiled: the row written from a C array of its doubles)
        compiled = cython.compiled  # (read once: interpreted, a global's attribute)
        sleep, wakeup = env.sleep, self._wakeup
        schedule = policy.schedule
        detail = bool(getattr(cost, "needs_decode_lengths", False))
        # the roofline's price from the batch's fields, bit for bit its cost(batch): no Batch
        # snapshot (costs.roofline_price; None: any other cost model gets its Batch)
        price = None if detail else batch_pricer(cost)
        blocks = replica.blocks
        check = self.check  # (set before the run starts)
        running, waiting = replica.running, replica.waiting
        arrivals = self.arrivals
        n_arrivals = len(arrivals)
        bar = self.bar
        # fast-forward only with a cost model declared pure (decode_pricer: a stateful one
        # is called once per iteration, in time order, as it would be stepping)
        self.pricer = decode_pricer(cost) if self.fast_forward and not detail else None
        fast = self.pricer is not None
        nxt = 0
        dropped = 0  # preemptions made forming batches that came out empty (formed anew)
        while True:
            now = env._now  # (the clock itself: SimPy's now property is a Python call)
            while nxt < n_arrivals and arrivals[nxt].arrival_time <= now:
                submit(replica, self, arrivals[nxt])
                nxt += 1
            if not running and not waiting:
                if nxt < n_arrivals:
                    t = arrivals[nxt].arrival_time
                    if replica.num_loading:  # or when a load lands (its event runs first)
                        t = min(t, self.landings[0])
                    delay = delay_until(now, t)
                    if not sleep(delay, wakeup):
                        yield
                else:
                    self.idle = True
                    yield
                continue
            if fast and not waiting and not replica.prefilling \
                    and not replica.num_loading:  # only decodes run
                if self.closed:
                    until = env.peek()  # (the next event: no other process acts before it)
                elif self.next_arrival is not None:
                    until = self.next_arrival()
                else:
                    until = arrivals[nxt].arrival_time if nxt < n_arrivals else math.inf
                first = replica.iteration
                delay = decode_stretch(self, now, until)
                if delay is not None:  # one event for the stretch: env.now is its end
                    if not sleep(delay, wakeup):
                        yield
                    if self.pending_finish is not None:  # (closed loop: its hooks issue now)
                        replica.finish_decodes(self.pending_finish, env.now)
                        self.pending_finish = None
                        if check:
                            check_replica(replica)
                    if bar is not None and first >> 10 != replica.iteration >> 10:
                        bar.n = len(replica.finished)  # (every 1,024 iterations, as below)
                        bar.refresh()
                    continue
            n_running = len(running)
            if price is None:
                batch = replica.form_batch(schedule, now, detail)  # decodes, policy, snapshot
                n_prefill, n_decode = batch.num_prefill_tokens, batch.num_decode_tokens
            else:
                replica.form(schedule, now)  # (form_batch without its snapshot)
                n_prefill, n_decode = replica._prefill_tokens, replica.batch_decodes
            if check:
                check_replica(replica)
            if not replica._prefills and not n_decode:
                if replica.num_loading and nxt < n_arrivals:  # until a landing or an arrival
                    replica.stand_by()
                    t = min(arrivals[nxt].arrival_time, self.landings[0])
                    if not sleep(delay_until(now, t), wakeup):
                        yield
                    continue
                if replica.num_in_transit:  # disaggregation: blocks held by KV in transit
                    replica.stand_by()
                    self.idle = True
                    yield  # woken when a transfer frees them, or by an arrival
                    continue
                # forming it preempted every running request (vLLM admits none in a step that
                # preempted; SGLang's retraction): form it anew, its preemptions counted in the
                # iteration that runs. Each such round shrinks the running set (an empty batch
                # keeps no request it admitted), so a policy that only preempts what it has
                # just admitted raises instead of forming the same batch forever.
                if replica.num_preempted_now and len(running) < n_running:
                    dropped += replica.num_preempted_now
                    continue
                raise RuntimeError(f"scheduler {policy!r} formed an empty batch with "
                                   f"{len(replica.waiting)} waiting and {len(replica.running)} "
                                   f"running" + (" (it preempted only requests it had just "
                                                 "admitted)" if replica.num_preempted_now
                                                 else ""))
            if price is None:
                dt = cost(batch)
            else:
                dt = price.price(replica._prefills, n_prefill, n_decode,
                                 replica.batch_context, replica.num_spec_tokens)
            try:  # (free unless it raises) None or a string: TypeError, made the same error
                if not dt >= 0 or dt == math.inf:
                    raise ValueError
            except (TypeError, ValueError):
                raise ValueError(f"cost model returned {dt!r} seconds for {replica.batch()!r}; "
                                 f"expected a finite number of seconds >= 0") from None
            if compiled:  # (the row's doubles as ROW packs them: no tuple, no boxes)
                row[0] = now
                row[1] = dt
                row[2] = len(running)
                row[3] = len(waiting)
                row[4] = n_prefill
                row[5] = n_decode
                row[6] = blocks.num_blocks - blocks.num_free
                row[7] = replica.num_preempted_now + dropped
                write(cython.cast(cython.p_char, cython.address(row[0]))[:row_bytes])
            else:
                write(pack(now, dt, len(running), len(waiting), n_prefill, n_decode,
                           blocks.num_blocks - blocks.num_free,
                           replica.num_preempted_now + dropped))
            dropped = 0
            if not sleep(dt, wakeup):  # (alone: the clock set as SimPy's step would)
                yield
            replica.postprocess(env._now)
            if bar is not None and not replica.iteration & 1023:
                bar.n = len(replica.finished)
                bar.refresh()

    def _load(self, r, seconds, start):
        """An offload tier's load for ``r`` takes ``seconds``: it lands then (its own event)."""
        heappush(self.landings, self.env.now + seconds)
        self.env.wake(Wakeup(self._landed, (r, start)), seconds)

    def _landed(self, event):
        heappop(self.landings)
        self.replica.land(*event.value)
        self.wake()

    def close(self):
        """The environment has run: close the progress bar and break the reference cycles
        that would keep the replica, and with it every request, alive until the cyclic
        garbage collector ran (the suspended loop's generator and its wake-up event; the
        hooks of closed-loop clients and disaggregation). Measured at 1M requests: 1.3 GB
        otherwise held through the summary, the files and the plots."""
        if self.bar is not None:
            self.bar.n = len(self.replica.finished)
            self.bar.close()
        self._loop.close()
        self._wakeup = None
        self.arrivals = ()
        self.next_arrival = None  # (a cluster's bound method: the cluster holds this process)
        self.replica.on_finish = self.replica.on_prefilled = self.replica.on_load = None
