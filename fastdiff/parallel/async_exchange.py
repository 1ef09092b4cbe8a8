"""How ``parallel(mode=async)``'s stages send their outputs to the later stages: the exchange strategies.

- ``BlockingExchange``: at the start of a staged step, one broadcast per stage but the last (its outputs feed
  only its own prediction, which ``AsyncState.share_prediction`` sends) of everything that stage sends.
- ``OverlappedExchange`` (two stages): stage 0 posts each output stage 1 reads as soon as it is computed
  (``async_op=True``); stage 1 posts the receives at the start of its step and takes them in at the start of
  the next one, so the exchange overlaps the computing. More stages would need a process group per sending
  stage to keep the collectives in one order.

Both give the same images. ``every_output=True`` sends every output of a stage, not only those a later stage
was traced to read (also the same images; tests compare them). ``stride`` > 1 exchanges only every stride-th
staged step. Each broadcast is a ``FlatBroadcast`` (group.py): one flat buffer per dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from fastdiff.parallel.group import FlatBroadcast, peers

if TYPE_CHECKING:
    from fastdiff.parallel.async_plan import Plan


class AsyncState(Protocol):
    """What an exchange reads of a rank's ``async_state.AsyncState`` (a protocol: the state imports this module)."""

    context: Any
    plan: Plan
    stage: int
    ranks: list[int]
    group: Any
    cache: dict[str, object]
    sequential: bool
    fresh: bool
    index: int
    warmup: int
    stride: int


WHERE = "parallel(mode=async)"


class Exchange:
    """Base: which outputs a stage sends; ``begin`` at every denoiser call, ``computed`` after each own unit."""

    def __init__(self, every_output: bool = False):
        self.every_output = every_output

    def names(self, plan: Plan, stage: int) -> list[str]:
        """The outputs of ``stage`` that go to the later stages at each exchange."""
        return plan.outputs(stage) if self.every_output else plan.send[stage]

    def begin(self, st: AsyncState) -> None:
        raise NotImplementedError

    def computed(self, st: AsyncState, name: str | None) -> None:
        """Unit ``name`` was computed in a staged step (None: all of the step's units)."""

    def drain(self, st: AsyncState) -> None:
        """Finish whatever is still in flight (before another strategy takes over)."""


class BlockingExchange(Exchange):
    def begin(self, st: AsyncState) -> None:
        if st.sequential or st.fresh or (st.index - st.warmup) % st.stride:
            return
        for stage, src in enumerate(st.ranks[:-1]):
            names = self.names(st.plan, stage)
            with peers(WHERE, st.context):
                received = FlatBroadcast([st.cache[n] for n in names], src, st.group).received()
            st.cache.update(zip(names, received))


class OverlappedExchange(Exchange):
    def __init__(self, every_output: bool = False):
        super().__init__(every_output)
        self.posting = False  # this staged step's outputs go out during it (the next step takes them in)
        self.posted: list[tuple[str, FlatBroadcast]] = []  # in the order posted

    def begin(self, st: AsyncState) -> None:
        staged = not st.sequential
        self._collect(st, install=staged)
        self.posting = staged and (st.index + 1 - st.warmup) % st.stride == 0
        if self.posting and st.stage != 0:
            for name in self.names(st.plan, 0):
                self._post(st, name)

    def computed(self, st: AsyncState, name: str | None) -> None:
        """On stage 0: post the outputs to send, in order, up to ``name`` (one that did not run this step goes
        from the cache, so that both ranks post the same broadcasts)."""
        if not (self.posting and st.stage == 0):
            return
        names = self.names(st.plan, 0)
        if name is not None and name not in names:
            return
        upto = len(names) if name is None else names.index(name) + 1
        for pending in names[len(self.posted) : upto]:
            self._post(st, pending)

    def drain(self, st: AsyncState) -> None:
        self._collect(st, install=False)

    def _post(self, st: AsyncState, name: str) -> None:
        with peers(WHERE, st.context):
            self.posted.append((name, FlatBroadcast(st.cache[name], st.ranks[0], st.group, async_op=True)))

    def _collect(self, st: AsyncState, install: bool) -> None:
        """Wait for the broadcasts posted during the previous step; on stage 1 take in what arrived."""
        for name, sent in self.posted:
            with peers(WHERE, st.context):
                sent.wait()
            if install and not sent.sending:
                st.cache[name] = sent.received()
        self.posted.clear()
