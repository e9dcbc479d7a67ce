"""runners/prefix.py: the longest token prefix that a chunk's whole prompts share, and each prompt's tail."""

import numpy as np

from batchinfer.runners.prefix import MIN_PREFIX_TOKENS, common_prefix, split_prompts

HEAD = list(range(100, 100 + MIN_PREFIX_TOKENS + 4))


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
