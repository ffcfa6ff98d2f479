"""``static``: request-level batching (FasterTransformer-like, the vLLM paper's baseline).

A batch forms while requests can be admitted into fixed slots of max_model_len (FT
preallocates a [batch, max_len] cache); once it starts decoding nothing joins it, and its
requests are returned together when its longest request ends: each request's finish time is
the batch's end, and its slot is held until then. Simplification (documented, favouring this
baseline): finished sequences are not charged padded compute while the batch runs on.
"""

from __future__ import annotations

from pagedkv.engine.config import SchedulerConfig
from pagedkv.engine.policies.contiguous import ContiguousScheduler
from pagedkv.engine.request import Request, RequestStatus
from pagedkv.engine.scheduler import RoundPlan, SchedulerOutput
from pagedkv.memory.config import Placement, Reservation
from pagedkv.memory.interface import KVAllocator


class StaticScheduler(ContiguousScheduler):
    name = "static"
    decides_at_events = True  # tested fast against reference (tests/engine)
    placement = Placement.FIRST_FIT  # FT's [batch, max_len] cache: fixed slots
    reservation = Reservation.SLOTS

    def __init__(self, config: SchedulerConfig, kv: KVAllocator) -> None:
        super().__init__(config, kv)
        self.forming = True
        self.done: list[Request] = []  # finished, held until the batch ends

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        if self.forming:
            self._admit_waiting(out, self.config.token_budget, chunked=False)
            if out.chunks:
                return out
        if self.running:
            self.forming = False
            self._decode_running(out)
        return out

    def plan_round(self) -> RoundPlan | None:
        """``schedule``'s round from the batch's state and the queue alone: while the batch
        forms, its admissions (allocated now) make the round prefill-only; otherwise every
        running request decodes, and the batch has closed (as ``schedule`` closes it). None
        for a class whose rounds are not these."""
        cls = type(self)
        if cls.schedule is not StaticScheduler.schedule or cls.finish is not StaticScheduler.finish:
            return None
        if self.regions is None or self.has_beams:
            return None
        out = SchedulerOutput()
        if self.forming:
            self._admit_waiting(out, self.config.token_budget, chunked=False)
            if out.chunks:
                return RoundPlan(out, False)
        if self.running:
            self.forming = False
        return RoundPlan(out, True)

    def finish(self, req: Request) -> list[Request]:
        self.running.remove(req)
        self.done.append(req)
        if self.running:
            return []
        released, self.done = self.done, []
        for r in released:
            self._free_group(r)
            r.status = RequestStatus.FINISHED
        self.forming = True
        return released

    def has_unfinished(self) -> bool:
        return super().has_unfinished() or bool(self.done)
