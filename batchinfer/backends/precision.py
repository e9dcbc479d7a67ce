"""The precision check: a lower precision (bf16 on CPUs that have it) is used only where it gives the task's
answers on a sample of the job's own items, against f32; otherwise f32 runs, with the figures that say why.
The conversion check: OpenVINO's graph in f32 is used only where it gives the task's answers on the same sample,
against torch; otherwise torch runs.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

PRECISION_SAMPLE = 48  # items a lower precision is checked on, against f32
CHECK_BATCH_TOKENS = 2048
SETTLE_SAMPLE = (  # serve's precision check: short and long, plain and odd
    "Thanks for the quick delivery, the package arrived two days early and everything works.",
    "refund pls",
    "The committee postponed the vote on the new budget until after the regional elections in March, citing "
    "unresolved questions about funding for schools, hospitals and the planned rail link to the airport.",
    "Is this available in blue? Size M. ❤️",
    "ERROR 503: upstream timed out after 30000 ms (retry 3/5)",
    "Je voudrais annuler ma commande, s'il vous plaît.",
    "no",
    "Customer says the app crashes whenever they open the settings page on Android 14.",
)
COSINE_FLOOR = 0.9999  # embeddings (and score vectors) in a lower precision, against f32
SCORE_TOLERANCE = 0.01  # a single relevance score


def agree(how: str, reference: list[np.ndarray], candidate: list[np.ndarray]) -> tuple[bool, dict]:
    """Whether results in a lower precision give the task's answers (`how`: argmax, the labels each item's
    output picks, per token where it is per token; cosine, every item's vector against f32; close, scores
    within SCORE_TOLERANCE), with the figure that says so."""
    if how == "argmax":
        same = np.mean([np.array_equal(r.argmax(-1), c.argmax(-1)) for r, c in zip(reference, candidate)])
        return bool(same == 1.0), {"labels_equal": round(float(same), 4)}
    if how == "close":
        worst = max(float(np.abs(r - c).max()) for r, c in zip(reference, candidate))
        return worst <= SCORE_TOLERANCE, {"max_abs_diff": round(worst, 6)}
    cosines = [float(r @ c / max(np.linalg.norm(r) * np.linalg.norm(c), 1e-12)) for r, c in zip(reference, candidate)]
    return min(cosines) >= COSINE_FLOOR, {"min_cosine": round(min(cosines), 6)}


def describe_check(check: dict) -> str:
    figures = ", ".join(f"{k} {v}" for k, v in check.items() if k not in ("precision", "against", "fell_back"))
    chosen = f"{check['against']} ({check['precision']} failed)" if check.get("fell_back") else check["precision"]
    return f"{chosen}, checked against {check['against']}: {figures}"


def check_batches(ids: list) -> list[list[int]]:
    """Positions of `ids` in length-sorted batches of about CHECK_BATCH_TOKENS padded tokens: f32 is the slow
    one, and padding would double it."""
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    batches, batch = [], []
    for i in order:
        if batch and (len(batch) + 1) * len(ids[batch[0]]) > CHECK_BATCH_TOKENS:
            batches.append(batch)
            batch = []
        batch.append(i)
    batches.append(batch)
    return batches


def check_precision(run_in: Callable[[str, list], list], options: list[str], how: str, ids: list) -> tuple[str, dict]:
    """The first of `options` (precisions, f32 last) whose results on the items `ids` agree (`how`, see agree)
    with the last's, and the check's figures; the last, marked fell_back, when none does.
    run_in(precision, batch of items) -> one result per item."""
    batches = check_batches(ids)
    reference = _results(run_in, options[-1], ids, batches)
    for precision in options[:-1]:
        ok, figure = agree(how, reference, _results(run_in, precision, ids, batches))
        check = {"precision": precision, "against": options[-1], "items": len(ids), **figure}
        if ok:
            return precision, check
    return options[-1], {**check, "fell_back": True}


def check_conversion(
    run_on: Callable[[str, list], list], how: str, ids: list, reference: str, converted: str
) -> tuple[bool, dict]:
    """Whether a conversion (the backend named `converted`) gives the task's answers (`how`, see agree) on the items
    `ids`, both in f32, against the `reference` backend (the model's own library), and the check's figures.
    run_on(backend name, batch of items) -> one result per item."""
    batches = check_batches(ids)
    ok, figure = agree(how, _results(run_on, reference, ids, batches), _results(run_on, converted, ids, batches))
    return ok, {"precision": "f32", "against": reference, "items": len(ids), **figure}


def _results(run_in: Callable[[str, list], list], option: str, ids: list, batches: list) -> list[np.ndarray]:
    found = {}
    for batch in batches:
        found.update(zip(batch, run_in(option, [ids[i] for i in batch])))
    return [np.asarray(found[i], np.float32) for i in range(len(ids))]
