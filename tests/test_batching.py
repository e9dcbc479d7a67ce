import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchinfer.batching.cut import computed_tokens, cut_packed, cut_padded, padding_stats

lengths_st = st.lists(st.integers(min_value=1, max_value=600), min_size=0, max_size=400)


@pytest.mark.parametrize("packed", [False, True])
@settings(max_examples=200, deadline=None)
@given(lengths=lengths_st, max_tokens=st.integers(1, 20000), max_rows=st.integers(1, 300))
def test_every_row_once_budget_respected_sorted(packed, lengths, max_tokens, max_rows):
    lengths = np.array(lengths, dtype=np.int64)
    batches = cut_packed(lengths, max_tokens, max_rows) if packed else cut_padded(lengths, max_tokens, max_rows)
    flat = np.concatenate(batches) if batches else np.array([], dtype=np.int64)
    assert sorted(flat.tolist()) == list(range(len(lengths)))  # every index exactly once
    previous_min = None
    for i, batch in enumerate(batches):
        assert 1 <= len(batch) <= max_rows
        longest = lengths[batch].max()
        # Padded: rows x longest; packed: real tokens. Over budget only when one row alone exceeds it:
        # that row still runs, alone.
        cost = lengths[batch].sum() if packed else len(batch) * longest
        assert cost <= max_tokens or len(batch) == 1
        assert list(lengths[batch]) == sorted(lengths[batch], reverse=True)  # longest first
        if previous_min is not None:
            assert longest <= previous_min  # batches in descending length order
        previous_min = lengths[batch].min()
        if packed and i + 1 < len(batches) and len(batch) < max_rows:  # full: the next row would not fit
            assert cost + lengths[batches[i + 1][0]] > max_tokens


def test_equal_lengths_keep_input_order_in_fewest_batches():
    batches = cut_padded(np.full(10, 4), max_tokens=16, max_rows=100)
    assert len(batches) == 3 and np.concatenate(batches).tolist() == list(range(10))


def test_cuts_where_lengths_drop_instead_of_padding():
    lengths = np.array([100] * 3 + [10] * 50)
    batches = cut_padded(lengths, max_tokens=16384, max_rows=256)
    assert [sorted(set(lengths[b].tolist())) for b in batches] == [[100], [10]]  # greedy would pad 50 rows to 100


def test_mixed_text_is_nearly_padding_free():
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(3.3, 1.0, 4096).astype(int), 3, 256)  # short phrases to truncated articles
    real, padded = padding_stats(lengths, cut_padded(lengths, 16384, 256, overhead=64))
    assert real / padded >= 0.97


def test_padding_stats():
    lengths = np.array([5, 3, 2, 2])
    batches = [np.array([0, 1]), np.array([2, 3])]
    assert padding_stats(lengths, batches) == (12, 14)


def test_computed_tokens_count_padding_only_when_padded():
    """The one count of what batches compute, for the runner's report and plan's estimate alike: packed rows
    lie end to end (their own tokens), padded rows are padded to their batch's longest."""
    lengths = np.array([5, 1, 3, 3])
    batches = [np.array([0, 1]), np.array([2, 3])]
    assert computed_tokens(lengths, batches, "padded") == 5 * 2 + 3 * 2
    assert computed_tokens(lengths, batches, "packed") == 12 == padding_stats(lengths, batches)[0]
    assert computed_tokens(lengths, [], "packed") == computed_tokens(lengths, [], "padded") == 0
