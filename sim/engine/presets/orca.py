"""The Orca preset (:class:`Orca`): iteration-level scheduling, whole prompts admitted FCFS
beside the decodes; rules and deviations in its docstring, each rule tested in
tests/test_presets.py."""

from __future__ import annotations

from ..core.policies import ContinuousBatching, admit_whole_prompts


class Orca(ContinuousBatching):
    """Orca (Yu et al., OSDI'22): iteration-level scheduling.

    Rules:
    1. every iteration, running requests decode one token and waiting ones are admitted FCFS
       with their whole prompt (no chunking), mixed with the decodes;
    2. admission while a batch slot and the prompt's blocks are free; no watermark;
    3. optional ``token_budget`` on prompt tokens per iteration (default none).

    Deviations: Orca reserves KV for a request's maximum length at admission; here blocks are
    taken as tokens are written, and under pressure the newest request is preempted.
    """

    quiet_when_decoding = True  # nothing waiting or prefilling: schedule does nothing
    name = "orca"

    def schedule(self, replica, now):
        admit_whole_prompts(replica, 0, self.token_budget)

    def __repr__(self):
        return f"Orca(token_budget={self.token_budget})"
