"""Batching policies: one small class each, and the one table that names them.

A policy decides which prefill work joins an iteration: ``schedule(replica, now)`` reads the
replica's ``waiting`` queue, ``running`` set and ``prefilling`` tuple (read-only) and acts through its verbs
(:mod:`sim.engine.replica`): ``admit(r, num_tokens)``, ``schedule_chunk(r, num_tokens)``,
``preempt(r)``. Every running decode emits a token every iteration whatever the policy does
(the replica reserves their KV blocks before calling it). A policy may define
``select_victim(replica)`` to choose whom to preempt when blocks run short (default: the most
recently admitted). Any object with ``schedule`` is a policy; pass it as
``SimConfig(scheduler=obj)`` - it carries its own settings.

The built-ins admit FCFS while a batch slot (``max_batch_size``) and KV blocks allow:

- :class:`StaticBatching` - admits only when nothing runs: up to ``max_batch_size`` requests,
  prefilled together, decoded until the longest finishes; arrivals meanwhile wait.
- :class:`ContinuousBatching` (Orca) - every iteration, running requests decode one token and
  new prompts are admitted and prefilled whole beside them (optional ``token_budget``: a prompt
  over the budget is still admitted when it is the first of its iteration).
- :class:`ChunkedPrefill` (Sarathi-Serve) - a per-iteration token budget (``chunk_size``) filled
  with all running decodes, then continuing partial prefills, then new prompts, in chunks.

**Names and knobs.** :data:`POLICIES` maps a name to a class; ``from_config(config)`` builds it
from the flat knobs of :class:`~sim.engine.config.SimConfig`, each knob left ``None`` taking the
policy's default, and refuses a knob the policy does not use (a setting is never silently
ignored). A new named policy is one class (in its own file or here) and one line in the table;
the CLI's ``--scheduler`` choices and help come from the table.
"""

from __future__ import annotations

from ..checks import positive_int
from ..constants import CHUNK_SIZE
from .request import PREFILL

KNOBS = ("chunk_size", "token_budget")  # SimConfig fields that belong to a policy


def _unused_knobs(config, name, used=()):
    for knob in KNOBS:
        if knob not in used and getattr(config, knob) is not None:
            raise ValueError(f"{knob}={getattr(config, knob)!r} is not used by the {name!r} "
                             f"scheduler (it uses: {', '.join(used) or 'no knobs'})")


def admit_whole_prompts(replica, tokens=0, budget=None, first=True) -> int:
    """Admit waiting requests FCFS with their whole (re-)prompt while a slot, blocks and the
    token ``budget`` allow (a prompt over the budget is admitted when ``first`` in its
    iteration); returns the batch's prefill tokens."""
    waiting = replica.waiting
    while waiting:
        r = waiting[0]
        need = r.prefill_target
        if budget is not None and not first and tokens + need > budget:
            break
        if not replica.admit(r, need):
            break
        tokens += need
        first = False
    return tokens


class StaticBatching:
    """Static batching: a new batch only when the previous one has fully finished."""

    name = "static"

    @classmethod
    def from_config(cls, config):
        _unused_knobs(config, cls.name)
        return cls()

    def schedule(self, replica, now):
        if not replica.running:
            admit_whole_prompts(replica)

    def __repr__(self):
        return "StaticBatching()"


class ContinuousBatching:
    """Continuous batching (Orca): whole prompts join the running decodes every iteration."""

    name = "continuous"

    def __init__(self, token_budget=None):
        self.token_budget = None if token_budget is None else positive_int("token_budget",
                                                                           token_budget)

    @classmethod
    def from_config(cls, config):
        _unused_knobs(config, cls.name, ("token_budget",))
        return cls(config.token_budget)

    def schedule(self, replica, now):
        admit_whole_prompts(replica, 0, self.token_budget)

    def __repr__(self):
        return f"ContinuousBatching(token_budget={self.token_budget})"


class ChunkedPrefill:
    """Chunked prefill (Sarathi-Serve): decodes, then prefill chunks, within a token budget."""

    name = "chunked"

    def __init__(self, chunk_size=CHUNK_SIZE):
        self.chunk_size = positive_int("chunk_size", chunk_size)

    @classmethod
    def from_config(cls, config):
        _unused_knobs(config, cls.name, ("chunk_size",))
        policy = cls(CHUNK_SIZE if config.chunk_size is None else config.chunk_size)
        if policy.chunk_size < config.max_batch_size:
            raise ValueError(
                f"chunk_size ({policy.chunk_size}) must be >= max_batch_size "
                f"({config.max_batch_size}): every running decode needs one token of the budget "
                f"(vLLM's max_num_batched_tokens >= max_num_seqs)")
        return policy

    def schedule(self, replica, now):
        budget = self.chunk_size - replica.decodes.count  # every decode takes one token
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
            chunk = min(r.prefill_target, budget)
            if not replica.admit(r, chunk):
                break
            budget -= chunk

    def __repr__(self):
        return f"ChunkedPrefill(chunk_size={self.chunk_size})"


POLICIES = {
    "static": StaticBatching,
    "continuous": ContinuousBatching,
    "chunked": ChunkedPrefill,
}


def make_policy(config):
    """The policy of ``config.scheduler``: a name in :data:`POLICIES` (built from the config's
    knobs) or an object with ``schedule(replica, now)`` (used as given)."""
    scheduler = config.scheduler
    if isinstance(scheduler, str):
        cls = POLICIES.get(scheduler.strip().lower())
        if cls is None:
            raise ValueError(f"scheduler must be one of {sorted(POLICIES)} or a policy object, "
                             f"got {scheduler!r}")
        return cls.from_config(config)
    if not callable(getattr(scheduler, "schedule", None)):
        raise TypeError(f"scheduler must be a name in {sorted(POLICIES)} or have a "
                        f"schedule(replica, now) method, got {scheduler!r}")
    for knob in KNOBS:
        if getattr(config, knob) is not None:
            raise ValueError(f"{knob}={getattr(config, knob)!r} is set but scheduler is a "
                             f"policy object ({scheduler!r}), which carries its own settings")
    return scheduler
