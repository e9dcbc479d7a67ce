"""Prompts that begin alike: what a paged KV cache with block sharing reuses of them, and the order that lets it
(pure). transformers' continuous batching shares whole pages: a page's keys and values are found by a hash
chained from the prompt's start, once the request that wrote it has been prefilled."""

from __future__ import annotations

from dataclasses import dataclass


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


@dataclass(frozen=True)
class PrefixFigures:
    """What a shared prefix saved: the most tokens one row reused, the rows that reused any, the prompt
    tokens not computed, and their share of all prompt tokens."""

    tokens: int
    rows: int
    saved_tokens: int
    prompt_tokens: int

    @classmethod
    def of(cls, hits: list[int], prompt_tokens: int) -> PrefixFigures:
        """From each row's tokens read from the cache."""
        return cls(max(hits, default=0), sum(1 for h in hits if h), sum(hits), prompt_tokens)

    @classmethod
    def total(cls, records: list) -> PrefixFigures | None:
        """Over chunk records (their prefix_* fields and prompt tokens); None when none carries them."""
        records = [r for r in records if r.prefix_saved is not None]
        if not records:
            return None
        return cls(
            max(r.prefix_tokens for r in records),
            sum(r.prefix_rows for r in records),
            sum(r.prefix_saved for r in records),
            sum(r.tokens for r in records),
        )

    def record(self) -> dict:
        """A chunk record's fields."""
        return {"prefix_tokens": self.tokens, "prefix_rows": self.rows, "prefix_saved": self.saved_tokens}

    def report(self) -> dict:
        """The report's `prefix` entry."""
        share = self.saved_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        return {
            "tokens": self.tokens,
            "rows": self.rows,
            "saved_tokens": self.saved_tokens,
            "saved_share": round(share, 4),
        }
