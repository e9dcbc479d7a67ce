import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from batchinfer.batching import padding_stats, plan_batches

lengths_st = st.lists(st.integers(min_value=1, max_value=600), min_size=0, max_size=400)


@settings(max_examples=200, deadline=None)
@given(lengths=lengths_st, max_tokens=st.integers(1, 20000), max_rows=st.integers(1, 300))
def test_every_row_once_budget_respected_sorted(lengths, max_tokens, max_rows):
    lengths = np.array(lengths, dtype=np.int64)
    batches = plan_batches(lengths, max_tokens, max_rows)
    flat = np.concatenate(batches) if batches else np.array([], dtype=np.int64)
    assert sorted(flat.tolist()) == list(range(len(lengths)))  # every index exactly once
    previous_min = None
    for batch in batches:
        assert 1 <= len(batch) <= max_rows
        longest = lengths[batch].max()
        # Over budget only when one row alone exceeds it: that row still runs, alone.
        assert len(batch) * longest <= max_tokens or len(batch) == 1
        assert list(lengths[batch]) == sorted(lengths[batch], reverse=True)  # longest first
        if previous_min is not None:
            assert longest <= previous_min  # batches in descending length order
        previous_min = lengths[batch].min()


def test_equal_lengths_keep_input_order_and_fill_budget():
    batches = plan_batches(np.full(10, 4), max_tokens=16, max_rows=100)
    assert [b.tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_padding_stats():
    lengths = np.array([5, 3, 2, 2])
    batches = [np.array([0, 1]), np.array([2, 3])]
    assert padding_stats(lengths, batches) == (12, 14)
