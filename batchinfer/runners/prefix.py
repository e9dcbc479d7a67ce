"""A token prefix that a chunk's prompts share (the chat template's preamble, an instruction with its worked
examples): found on the whole prompts' token ids, prefilled once, its KV cache reused by every batch (the scorer's:
backends/causal_scores.py).

In a causal model a prefix's states do not depend on what follows it, so a row run after the prefix's cache,
at the positions that follow it, gives the same scores as the whole prompt run at once. The prefix is cut from
the token ids of whole prompts, never tokenized apart from them: each row's remaining ids are exactly the tail
of its own prompt, whatever the tokenizer merges at the boundary.

Generation reuses a shared prefix inside its engine instead: transformers' continuous batching shares whole
cache pages, a page's keys and values found by a hash chained from the prompt's start once the request that
wrote it has been prefilled. page_hits and admission (pure) predict what it reuses and give the order that lets
it; page_figures puts a chunk's hits in a record's `prefix` shape, the one label scoring's records have.
"""

from __future__ import annotations

import os

import numpy as np

MIN_PREFIX_TOKENS = 8  # a shorter prefix saves less than a batch's extra prefill pass and mask columns costs


def common_prefix(prompts: list[list[int]], truncated: np.ndarray) -> tuple[int, ...]:
    """The longest token prefix common to `prompts` not `truncated` (cut from the left, they lost their start),
    backed off so that every one of them keeps at least one token of its own after it (the last prompt token
    predicts the first label token); () when fewer than two prompts share MIN_PREFIX_TOKENS."""
    whole = [p for p, cut in zip(prompts, truncated.tolist()) if not cut]
    if len(whole) < 2:
        return ()
    # commonprefix compares any sequences item by item (only the smallest and largest, lexicographically)
    shared = os.path.commonprefix(whole)[: min(map(len, whole)) - 1]
    return tuple(shared) if len(shared) >= MIN_PREFIX_TOKENS else ()


def split_prompts(prompts: list[list[int]], prefix: tuple[int, ...]) -> tuple[list[list[int]], np.ndarray]:
    """Each prompt's tokens after `prefix` where it starts with it and goes on past it, else the whole prompt;
    and [prompts] bool: which ones run after the prefix."""
    n = len(prefix)
    after = np.fromiter(
        (bool(n) and len(p) > n and tuple(p[:n]) == prefix for p in prompts), dtype=bool, count=len(prompts)
    )
    return [p[n:] if cut else p for p, cut in zip(prompts, after.tolist())], after


def page_hits(prompts: list[list[int]], page: int) -> list[int]:
    """Per prompt, in admission order: the tokens found in the cache, assuming each earlier prompt was prefilled
    before it was admitted: its leading whole pages that an earlier prompt also began with, never its last
    token (the engine always computes one)."""
    seen: set[int] = set()
    hits = []
    for ids in prompts:
        parent, hit, matching = 0, 0, True
        for start in range(0, len(ids) - page + 1, page):
            parent = hash((parent, tuple(ids[start : start + page])))
            matching = matching and start + page < len(ids) and parent in seen
            hit += page if matching else 0
            seen.add(parent)
        hits.append(hit)
    return hits


def admission(prompts: list[list[int]], page: int) -> tuple[list[int], set[int], list[int]]:
    """Positions in two waves: (leaders, the leaders that followers wait for, followers). A leader is the first
    prompt whose first page a later one shares; the followers are those later ones, admitted once their leader
    is prefilled so that the pages they share are read from the cache, not computed again. A prompt that shares
    no first page is a leader without followers (a one-wave admission when nothing is shared)."""
    first: dict[tuple, int] = {}
    followers = []
    for position, ids in enumerate(prompts):
        key = tuple(ids[:page]) if len(ids) > page else (position,)
        if first.setdefault(key, position) != position:
            followers.append(position)
    waited = {first[tuple(prompts[p][:page])] for p in followers}
    leaders = sorted(first.values(), key=lambda p: (p not in waited, p))  # those with followers go first
    return leaders, waited, followers


def page_figures(hits: list[int], prompt_tokens: int) -> dict:
    """A record's `prefix` from each row's prompt tokens read from the engine's cache (`prompt_tokens`: the
    rows' prompt tokens in full): the most one row read, the rows that read any, the tokens not computed."""
    return {
        "tokens": max(hits, default=0),
        "rows": sum(1 for h in hits if h),
        "saved_tokens": sum(hits),
        "prompt_tokens": prompt_tokens,
    }
