"""runners/prefix.py: the longest token prefix that a chunk's whole prompts share, and each prompt's tail (label
scoring); the cache pages a paged engine reuses of prompts that begin alike, and their admission (generation)."""

import numpy as np

from batchinfer.execution.report import prefix_saved
from batchinfer.runners.prefix import (
    MIN_PREFIX_TOKENS,
    admission,
    common_prefix,
    page_figures,
    page_hits,
    split_prompts,
)

HEAD = list(range(100, 100 + MIN_PREFIX_TOKENS + 4))
A = list(range(100, 164))  # two pages of 32


def test_the_common_prefix_leaves_every_prompt_a_token_of_its_own():
    prompts = [HEAD + [1, 2, 3], HEAD + [1, 2], HEAD + [1, 5]]
    # every prompt goes on with 1, but the shortest must keep a token after the prefix to predict the labels
    assert common_prefix(prompts, np.zeros(3, dtype=bool)) == (*HEAD, 1)
    assert common_prefix([HEAD + [1], HEAD + [1]], np.zeros(2, dtype=bool)) == tuple(HEAD)
    tails, after = split_prompts(prompts, (*HEAD, 1))
    assert tails == [[2, 3], [2], [5]] and after.tolist() == [True, True, True]


def test_truncated_short_or_lone_prompts_leave_no_prefix_or_run_whole():
    cut = [7, 8] + HEAD[2:] + [9]  # cut from the left: it lost the prefix's start
    prompts = [HEAD + [1], HEAD + [2], cut]
    prefix = common_prefix(prompts, np.array([False, False, True]))
    assert prefix == tuple(HEAD)
    tails, after = split_prompts(prompts + [HEAD], prefix)  # a prompt that is the prefix alone runs whole too
    assert tails == [[1], [2], cut, HEAD] and after.tolist() == [True, True, False, False]
    assert common_prefix([HEAD + [1]], np.zeros(1, dtype=bool)) == ()  # one row: nothing to share
    short = HEAD[: MIN_PREFIX_TOKENS - 1]
    assert common_prefix([short + [1], short + [2]], np.zeros(2, dtype=bool)) == ()
    assert split_prompts([[1, 2]], ()) == ([[1, 2]], np.array([False]))


def test_page_hits_are_whole_leading_pages_an_earlier_prompt_began_with_never_the_last_token():
    prompts = [A + [1, 2], A + [3], A[:32] + [9] * 40, [7] * 70, A, A[:40]]
    assert page_hits(prompts, 32) == [0, 64, 32, 0, 32, 32]
    assert page_hits([A[:31], A[:31]], 32) == [0, 0]  # no whole page


def test_admission_puts_first_the_leaders_that_others_wait_for():
    prompts = [[5] * 10, A + [1], [7] * 40, A + [2], A + [3]]
    leaders, waited, followers = admission(prompts, 32)
    assert (leaders, waited, followers) == ([1, 0, 2], {1}, [3, 4])
    assert admission([[1] * 40, [2] * 40], 32) == ([0, 1], set(), [])


def test_page_figures_have_the_record_shape_and_the_report_adds_them_up():
    figures = page_figures([0, 64, 32], 300)
    assert figures == {"tokens": 64, "rows": 2, "saved_tokens": 96, "prompt_tokens": 300}
    assert prefix_saved([figures]) == {"tokens": 64, "rows": 2, "saved_tokens": 96, "saved_share": 0.32}


def test_the_share_is_of_the_prompt_tokens_in_full_for_either_task():
    # label scoring: 40 tokens computed, 60 saved (prompt 100); generation: 200 prompt tokens, 50 read cached
    scored = {"tokens": 12, "rows": 5, "saved_tokens": 60, "prompt_tokens": 100}
    generated = {"tokens": 32, "rows": 2, "saved_tokens": 50, "prompt_tokens": 200}
    assert prefix_saved([scored, generated]) == {"tokens": 12, "rows": 7, "saved_tokens": 110, "saved_share": 0.3667}
    assert prefix_saved([]) == {"tokens": 0, "rows": 0, "saved_tokens": 0, "saved_share": 0.0}
