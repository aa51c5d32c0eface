"""Batching policies: the contract a policy follows, and our simple policies.

**Writing a policy.** A policy decides which prefill work joins an iteration. Any object with
``schedule(replica, now)`` is one; pass it as ``SimConfig(scheduler=obj)`` (it carries its own
settings). Every iteration the replica first reserves the KV blocks of all running decodes (each
emits one token per iteration whatever the policy does), then calls ``schedule``, which acts
only through the replica's verbs (:mod:`sim.engine.core.replica`):

- ``replica.admit(r, num_tokens)``: a waiting request (any position) starts, computing
  ``num_tokens`` prompt tokens now, after the ``replica.prefix_hit(r)`` tokens the prefix cache
  serves; ``r.prefill_target - replica.prefix_hit(r)`` is its whole (re-)prompt. False: no
  slot (``max_batch_size``) or not enough free blocks - nothing changed;
- ``replica.schedule_chunk(r, num_tokens)``: a running prefill continues; at most
  ``r.prefill_target - r.num_computed`` tokens. It preempts victims for its blocks, so a later
  request of ``replica.prefilling`` may be WAITING again by the time the loop reaches it (check
  ``r.status == PREFILL``); False when ``r`` itself was preempted;
- ``replica.preempt(r)``: recompute preemption of any running request.

It reads, never mutates: ``replica.waiting`` (deque, FCFS order), ``replica.running`` (dict
index -> request, admission order), ``replica.prefilling`` (tuple of PREFILL requests, oldest
first), ``replica.blocks.num_free``, ``replica.decodes.count`` (decoding requests; each runs
``1 + replica.num_spec_tokens`` query tokens),
``replica.max_batch_size``, ``replica.block_size``, ``replica.iteration``,
``replica.num_preempted_now`` (preemptions so far this iteration), ``replica.num_generated(r)``,
``replica.held_blocks(r)``, ``replica.finished`` (finished and rejected requests, in order,
append-only: a policy may keep a cursor into it, as :mod:`sim.engine.presets.tensorrt_llm` does);
and per request ``index``, ``arrival_time``, ``num_prompt_tokens``, ``num_output_tokens``,
``prefill_target``, ``num_computed``, ``status`` (:mod:`sim.engine.core.request`). Partial prefills
advance only when the policy schedules their chunks, and the engine refuses an iteration with
no work (requests waiting, nothing admitted, nothing running): a policy must make progress
(an iteration whose forming preempted running requests and left no work is formed anew).
An optional ``select_victim(replica) -> request`` chooses whom to preempt when blocks run short
(default: the most recently admitted, vLLM's rule); ``engine_defaults(config) -> dict`` gives
the engine knobs it prefers (``max_batch_size``, ``block_size``, ``gpu_memory_utilization``,
``prefix_caching``) for those the user left ``None``; an optional ``reject_reason(r) -> str |
None`` refuses an arriving request the engine could never serve, before it queues (after
``max_model_len``'s check; the tensorrt-llm preset's prompt over ``max_num_tokens`` without
chunked context). A class attribute
``quiet_when_decoding = True`` promises that ``schedule`` does nothing when nothing waits and
nothing prefills: it neither acts (it could only preempt a decode; with ``pauses_decodes`` it
runs the decodes) nor changes state of its own (a budget that decays per call, a count of
calls) beyond what an optional ``decoded_quietly(replica, n)`` method applies for ``n`` such
calls at once (SGLang's ratio decay). The engine may then fast-forward pure-decode iterations
without calling it (:mod:`sim.engine.simulation`: up to the next arrival or an iteration whose
decodes' blocks are not all free, so ``select_victim`` is not needed meanwhile); a policy
without it is called every iteration. The flag counts only where the class defining
``schedule`` (or a subclass of it) declares it: a subclass overriding ``schedule`` declares it
again if its ``schedule`` keeps the promise.

The built-ins admit FCFS while a batch slot (``max_batch_size``) and KV blocks allow:

- :class:`StaticBatching` - admits only when nothing runs: up to ``max_batch_size`` requests,
  prefilled together, decoded until the longest finishes; arrivals meanwhile wait.
- :class:`ContinuousBatching` (Orca) - every iteration, running requests decode one token and
  new prompts are admitted and prefilled whole beside them (optional ``token_budget``: a prompt
  over the budget is still admitted when it is the first of its iteration), while 1 % of the
  pool stays free (waived when nothing runs: a prompt that fits the pool always starts);
- :class:`ChunkedPrefill` (Sarathi-Serve) - a per-iteration token budget (``chunk_size``) filled
  with all running decodes, then continuing partial prefills, then new prompts, in chunks; a
  new prompt is admitted only when blocks for all of it plus 1 % of the pool are free.

**Names and knobs.** :data:`~sim.engine.schedulers.POLICIES` maps a name to a class with ``name``, a docstring (its
first line is the CLI's help) and ``from_config(config)``, which builds it from the flat knobs of
:class:`~sim.engine.config.SimConfig`, each knob left ``None`` taking the policy's default, and
refuses a knob it does not use with :func:`refuse_unused_knobs` (a setting is never silently
ignored). A new named policy is one class (in its own file or here) and one line in the table,
in the source (the table is read-only at run time: sweeps in worker processes import it anew);
the CLI's ``--scheduler`` choices and help come from the table.
"""

from __future__ import annotations

try:
    import cython
except ImportError:  # interpreted without Cython: its no-op names (sim/cython_shim.py)
    from sim import cython_shim as cython

from ...checks import positive_int
from ...constants import CHUNK_SIZE, KV_BLOCK_SIZE
from .replica import Replica
from .request import PREFILL, Request

# SimConfig fields that belong to a policy
KNOBS = ("chunk_size", "token_budget", "free_gpu_memory_fraction", "enable_chunked_context",
         "capacity_scheduler_policy", "context_chunking_policy")
PREFIX_CACHING_MODES = (False, "block", "radix")  # off, vLLM v1's block hashes, SGLang's tree
# engine knobs a scheduler may default (a preset brings its engine's); these are the simple
# policies' (and a policy object's unless it has its own ``engine_defaults``)
ENGINE_DEFAULTS = {"max_batch_size": 256, "block_size": KV_BLOCK_SIZE,
                   "gpu_memory_utilization": 0.9, "prefix_caching": False}


def refuse_unused_knobs(config, name, used=()):
    """Raise when a policy knob (:data:`KNOBS`) other than ``used`` is set."""
    for knob in KNOBS:
        if knob not in used and getattr(config, knob) is not None:
            raise ValueError(f"{knob}={getattr(config, knob)!r} is not used by the {name!r} "
                             f"scheduler (it uses: {', '.join(used) or 'no knobs'})")


@cython.locals(replica=Replica, tokens=cython.longlong, watermark=cython.longlong)
def leaves_watermark(replica, tokens, watermark) -> bool:
    """Whether the blocks for ``tokens`` more tokens leave ``watermark`` blocks free (always
    true with nothing running: the watermark then has nothing to protect)."""
    return (not replica.running
            or replica.blocks.num_free - (-(-tokens // replica.block_size)) >= watermark)


@cython.locals(replica=Replica, r=Request, need=cython.longlong, watermark=cython.longlong)
def admit_whole_prompts(replica, tokens=0, budget=None, first=True, watermark=0) -> int:
    """Admit waiting requests FCFS with their whole (re-)prompt while a slot, blocks and the
    token ``budget`` allow (a prompt over the budget is admitted when ``first`` in its
    iteration), leaving at least ``watermark`` blocks free; returns the batch's prefill
    tokens."""
    waiting = replica.waiting
    while waiting:
        r = waiting[0]
        need = r.prefill_target - (replica.prefix_hit(r) if replica.caching else 0)
        if budget is not None and not first and tokens + need > budget:
            break
        if watermark and not leaves_watermark(replica, need, watermark):
            break
        if not replica.admit(r, need):
            break
        tokens += need
        first = False
    return tokens


class StaticBatching:
    """Static batching: a new batch only when the previous one has fully finished."""

    quiet_when_decoding = True  # nothing waiting or prefilling: schedule does nothing
    name = "static"

    @classmethod
    def from_config(cls, config):
        refuse_unused_knobs(config, cls.name)
        return cls()

    def knobs(self) -> dict:
        return {}

    def schedule(self, replica, now):
        if not replica.running:
            admit_whole_prompts(replica)

    def __repr__(self):
        return "StaticBatching()"


class ContinuousBatching:
    """Continuous batching (Orca-style): whole prompts join the running decodes every
    iteration, admitted only while 1 % of the pool stays free (so they do not evict running
    requests)."""

    quiet_when_decoding = True  # nothing waiting or prefilling: schedule does nothing
    name = "continuous"

    def __init__(self, token_budget=None):
        self.token_budget = None if token_budget is None else positive_int("token_budget",
                                                                           token_budget)

    @classmethod
    def from_config(cls, config):
        refuse_unused_knobs(config, cls.name, ("token_budget",))
        return cls(config.token_budget)

    def knobs(self) -> dict:
        """The policy knobs it uses, as ``SimConfig`` fields (what ``resolved()`` records)."""
        return {"token_budget": self.token_budget}

    def schedule(self, replica, now):
        admit_whole_prompts(replica, 0, self.token_budget,
                            watermark=replica.blocks.watermark)

    def __repr__(self):
        return f"ContinuousBatching(token_budget={self.token_budget})"


class ChunkedPrefill:
    """Chunked prefill (Sarathi-style): decodes, then prefill chunks, within a token budget; a
    new prompt is admitted only when blocks for all of it plus 1 % of the pool are free."""

    quiet_when_decoding = True  # nothing waiting or prefilling: schedule does nothing
    name = "chunked"

    def __init__(self, chunk_size=CHUNK_SIZE):
        self.chunk_size = positive_int("chunk_size", chunk_size)

    @classmethod
    def from_config(cls, config):
        refuse_unused_knobs(config, cls.name, ("chunk_size",))
        policy = cls(CHUNK_SIZE if config.chunk_size is None else config.chunk_size)
        if policy.chunk_size < config.max_batch_size:
            raise ValueError(
                f"chunk_size ({policy.chunk_size}) must be >= max_batch_size "
                f"({config.max_batch_size}): every running decode needs one token of the budget "
                f"(vLLM's max_num_batched_tokens >= max_num_seqs)")
        return policy

    def knobs(self) -> dict:
        return {"chunk_size": self.chunk_size}

    @cython.locals(replica=Replica, r=Request, budget=cython.longlong, chunk=cython.longlong,
                   rest=cython.longlong)
    def schedule(self, replica, now):
        # every decode takes one token of the budget (1 + k when speculating, as vLLM counts)
        budget = self.chunk_size - replica.decodes.count * (1 + replica.num_spec_tokens)
        for r in replica.prefilling:  # continue partial prefills, oldest first
            if budget <= 0:
                break
            if r.status != PREFILL:  # preempted by an older request's block need
                continue
            chunk = min(r.prefill_target - r.num_computed, budget)
            if replica.schedule_chunk(r, chunk):
                budget -= chunk
        waiting = replica.waiting
        while budget > 0 and waiting:
            r = waiting[0]
            rest = r.prefill_target - (replica.prefix_hit(r) if replica.caching else 0)
            # the whole prompt must fit (not only this chunk), or the next iteration's
            # decodes would preempt it again: measured 3.2x the prompt tokens recomputed
            if not leaves_watermark(replica, rest, replica.blocks.watermark):
                break
            chunk = min(rest, budget)
            if not replica.admit(r, chunk):
                break
            budget -= chunk

    def __repr__(self):
        return f"ChunkedPrefill(chunk_size={self.chunk_size})"
