"""The per-guidance-branch state the caches share (fastdiff.core.branch_state): split, join, history, clearing."""

from __future__ import annotations

import torch

from fastdiff.core.branch_state import BranchState, BranchStore

BOTH = ("uncond", "cond")


def test_a_batch_is_split_by_branch_and_joined_in_any_order():
    store = BranchStore()
    batch = torch.arange(8.0).reshape(4, 2)
    store.put(BOTH, 3, batch)
    assert store.get(BOTH) is batch  # the last put's whole batch: no copy
    assert torch.equal(store.get(("cond",)), batch[2:])
    assert torch.equal(store.get(("cond", "uncond")), torch.cat([batch[2:], batch[:2]]))
    assert store.has(BOTH, since=3, chunk=2) and not store.has(BOTH, since=4) and not store.has(BOTH, chunk=1)
    assert not store.has(("other",))


def test_a_later_put_of_one_branch_keeps_the_other():
    store = BranchStore()
    store.put(BOTH, 0, torch.zeros(2, 1))
    store.put(("cond",), 1, torch.ones(1, 1))  # guidance turned off: only the cond branch runs
    assert torch.equal(store.get(BOTH), torch.tensor([[0.0], [1.0]]))
    assert store.has(BOTH) and not store.has(BOTH, since=1)


def test_history_keeps_the_last_points_and_drops_old_and_repeated_steps():
    store = BranchStore(keep=2)
    for step in (0, 2, 4):
        store.put(("cond",), step, [torch.full((1, 1), float(step))], copy=True)
    assert [s for s, _ in store.points("cond")] == [2, 4]
    store.put(("cond",), 4, [torch.full((1, 1), 9.0)], copy=True)  # the same step again (a repeated call)
    assert [(s, v[0].item()) for s, v in store.points("cond")] == [(2, 2.0), (4, 9.0)]
    store.put(("cond",), 10, [torch.zeros(1, 1)], since=6, copy=True)  # after a gap: older points go
    assert [s for s, _ in store.points("cond")] == [10]


def test_copies_do_not_follow_the_stored_tensor():
    store, value = BranchStore(), torch.zeros(2, 1)
    store.put(BOTH, 0, [value], copy=True)
    value += 1
    assert store.get(BOTH)[0].sum() == 0


def test_state_holds_named_stores_and_values_until_cleared():
    state = BranchState(keep=3)
    state.store("tail").put(BOTH, 0, torch.zeros(2, 1))
    state.set("accumulated", BOTH, 0.5)
    assert state.store("tail").keep == 3 and state.value("accumulated", "cond") == 0.5
    assert state.value("accumulated", "other", -1) == -1
    state.clear()
    assert not state.store("tail").has(BOTH) and state.value("accumulated", "cond") is None


def test_joined_points_are_whole_batches_only_when_every_branch_shares_them():
    store = BranchStore(keep=2)
    first, second = torch.arange(4.0).reshape(2, 2), torch.arange(4.0, 8.0).reshape(2, 2)
    store.put(BOTH, 0, first)
    store.put(BOTH, 1, second)
    assert [(s, v) for s, v in store.joined_points(BOTH)] == [(0, first), (1, second)]
    assert store.joined_points(("cond", "uncond")) is None  # another order: the chunks are not in place
    assert store.joined_points(("cond",)) is None  # a lone chunk of a 2-branch batch is not whole
    store.put(("cond",), 2, torch.ones(1, 2))  # guidance turned off: the branches' histories part
    assert store.joined_points(BOTH) is None
    assert BranchStore().joined_points(BOTH) is None
