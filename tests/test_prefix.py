from batchinfer.prefix import PrefixFigures, admission, page_hits

A = list(range(100, 164))  # two pages of 32


def test_page_hits_are_whole_leading_pages_an_earlier_prompt_began_with_never_the_last_token():
    prompts = [A + [1, 2], A + [3], A[:32] + [9] * 40, [7] * 70, A, A[:40]]
    assert page_hits(prompts, 32) == [0, 64, 32, 0, 32, 32]
    assert page_hits([A[:31], A[:31]], 32) == [0, 0]  # no whole page


def test_admission_puts_first_the_leaders_that_others_wait_for():
    prompts = [[5] * 10, A + [1], [7] * 40, A + [2], A + [3]]
    leaders, waited, followers = admission(prompts, 32)
    assert (leaders, waited, followers) == ([1, 0, 2], {1}, [3, 4])
    assert admission([[1] * 40, [2] * 40], 32) == ([0, 1], set(), [])


def test_prefix_figures_for_the_report():
    figures = PrefixFigures.of([0, 64, 32], 300)
    assert figures.record() == {"prefix_tokens": 64, "prefix_rows": 2, "prefix_saved": 96}
    assert figures.report() == {"tokens": 64, "rows": 2, "saved_tokens": 96, "saved_share": 0.32}
