"""Whether the finished chunks' part files still hold what their passes committed: each there, a whole Parquet
file, this job's, written by that pass (its footer says which), with the rows its marker counts, and, where
the marker seals it, of the size it had (from the listing, free) and the sha256 of its bytes (streamed,
READS_AT_ONCE files at a time). `status`, `plan`, a run's start and `export` count a chunk as done only then."""

from __future__ import annotations

from .layout import footer_chunk, has_id
from .records import ChunkRecord, Committed, Seal, committed_parts
from .scan import read_each

NOT_OURS = "is not this job's file"  # the one problem a run refuses rather than redoes (ownership.py)


def lost_chunks(
    folder, done: dict[str, ChunkRecord], listing: dict[str, int], footers: dict, job_id: str, digests: bool = True
) -> dict[str, str]:
    """Finished chunks whose rows are not all there as committed: chunk -> what is wrong with the first of its
    parts found so. digests: read the sealed parts whose size and footer hold to check their bytes too (export
    checks the bytes it reads instead, see damaged())."""
    parts = committed_parts(done)
    problems = {name: _structure_problem(name, part, listing, footers, job_id) for name, part in parts.items()}
    if digests:
        sealed = [name for name, problem in problems.items() if problem is None and parts[name].seal]
        for name, digest in read_each(folder.digest, sealed).items():
            problems[name] = damaged(name, parts[name].seal, digest)
    lost: dict[str, str] = {}
    for name, problem in problems.items():
        if problem:
            lost.setdefault(parts[name].chunk, problem)
    return lost


def damaged(name: str, seal: Seal | None, digest: str | None) -> str | None:
    """What is wrong with a part whose bytes have the sha256 `digest` (None: it is gone), if anything."""
    if digest is None:
        return f"{name} is missing"
    if seal is not None and digest != seal.sha256:
        return f"{name} does not hold the bytes its chunk committed (its sha256 differs: damaged since)"
    return None


def unsealed(done: dict[str, ChunkRecord]) -> int:
    """How many committed parts have no seal (their markers were written before parts were sealed)."""
    return sum(1 for part in committed_parts(done).values() if part.seal is None)


def _structure_problem(name: str, part: Committed, listing: dict[str, int], footers: dict, job_id: str) -> str | None:
    """What the listing and the footer alone show to be wrong with a committed part, if anything."""
    footer, size, seal = footers.get(name), listing.get(name), part.seal
    if size is None:
        return f"{name} is missing"
    if footer is None:
        cut = f": {size:,} of the {seal.size:,} bytes its chunk committed" if seal and size != seal.size else ""
        return f"{name} is not a whole Parquet file (cut short, or another file{cut})"
    if not has_id(footer, job_id):
        return f"{name} {NOT_OURS}"
    written_by = footer_chunk(footer)
    if written_by not in (None, part.written_by):
        return f"{name} holds the part of chunk {written_by}, not of chunk {part.written_by} (copied over it)"
    if part.rows is not None and footer.num_rows != part.rows:
        return f"{name} holds {footer.num_rows:,} rows where its chunk committed {part.rows:,}"
    if seal and size != seal.size:
        return f"{name} is {size:,} bytes where its chunk committed {seal.size:,} (changed since)"
    return None
