"""Rows → texts: every row without a usable text is named, with a reason."""

import pyarrow as pa

from batchinfer.prepare import is_blank, prepare_texts


def test_invisible_only_texts_are_empty_text():
    invisible = ["\u200b\u200b", "\ufeff", " \u00a0\u2060 ", "\x00\x07", "\u200d\u200c", ""]
    visible = ["a\u200b", "\u00e9", "x", "\u0301"]  # a lone combining accent is still something to read
    table = pa.table({"text": invisible + visible})
    prepared = prepare_texts(table, "text", {})
    assert sorted(prepared.errors) == list(range(len(invisible)))
    assert {reason for reason, _ in prepared.errors.values()} == {"empty_text"}
    assert prepared.texts == visible
    assert all(is_blank(t) for t in invisible) and not any(is_blank(t) for t in visible)
