"""LruSet keeps exactly an OrderedDict's order under any mix of bulk appends, removals and pops."""

from __future__ import annotations

from collections import OrderedDict

from agentsweep.engine_sim.lru import LruSet
from hypothesis import given, settings
from hypothesis import strategies as st

keys = st.lists(st.integers(0, 30), max_size=12, unique=True)
op = st.one_of(
    st.tuples(st.just("extend"), keys),
    st.tuples(st.just("discard"), keys),
    st.tuples(st.just("pop"), st.integers(0, 15)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=60), st.sampled_from([0, 3, 4096]))
def test_matches_an_ordered_dict(ops, slack):
    lru, ref = LruSet(), OrderedDict()
    lru.COMPACT_SLACK = slack  # 0 and 3: the queue is rebuilt often
    for name, arg in ops:
        if name == "extend":  # re-appending a member moves it to the end, as in the OrderedDict
            lru.discard(arg)
            lru.extend(arg)
            for k in arg:
                ref.pop(k, None)
                ref[k] = None
        elif name == "discard":
            assert lru.discard(arg) == sum(1 for k in arg if k in ref)
            for k in arg:
                ref.pop(k, None)
        else:
            want = list(ref)[:arg]
            assert lru.pop_oldest(arg) == want
            for k in want:
                del ref[k]
        assert list(lru) == list(ref)
        assert len(lru) == len(ref) and all(lru.contains(k) == (k in ref) for k in range(31))
        if name == "extend" and arg:  # only appends add queue entries, and they compact it
            assert lru._queued <= 2 * len(ref) + slack


def test_memory_stays_proportional_to_members():
    lru = LruSet()
    for i in range(2000):  # the same 10 blocks released and re-acquired over and over
        lru.discard(range(10))
        lru.extend(range(10))
        lru.discard(range(10) if i % 2 else range(5))
    assert len(lru) <= 10
    assert lru._queued <= 2 * len(lru) + LruSet.COMPACT_SLACK + 10
