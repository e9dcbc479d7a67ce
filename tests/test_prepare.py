"""Rows → texts: every row without a usable text is named, with a reason."""

import pyarrow as pa

from batchinfer.reasons import Reason
from batchinfer.sources.prepare import is_blank, prepare_texts


def test_invisible_only_texts_are_empty_text():
    invisible = ["\u200b\u200b", "\ufeff", " \u00a0\u2060 ", "\x00\x07", "\u200d\u200c", ""]
    visible = ["a\u200b", "\u00e9", "x", "\u0301"]  # a lone combining accent is still something to read
    table = pa.table({"text": invisible + visible})
    prepared = prepare_texts(table, "text", {})
    assert sorted(prepared.errors) == list(range(len(invisible)))
    assert {reason for reason, _ in prepared.errors.values()} == {"empty_text"}
    assert prepared.texts == visible
    assert all(is_blank(t) for t in invisible) and not any(is_blank(t) for t in visible)


def test_text_in_any_arrow_encoding_is_text_and_templates_write_numbers():
    words = pa.array(["spam", "ham", "spam"])
    table = pa.table(
        {
            "categorical": words.dictionary_encode(),  # how pandas writes a category column
            "large": words.cast(pa.large_string()),
            "n": pa.array([1, 2, 3]),
            "score": pa.array([0.5, None, 2.0]),
            "flag": pa.array([True, False, True]),
        }
    )
    assert prepare_texts(table, "categorical", {}).texts == ["spam", "ham", "spam"]
    assert prepare_texts(table, "large", {}).texts == ["spam", "ham", "spam"]
    templated = prepare_texts(table, "#{n} {categorical}: {score} {flag}", {})
    assert templated.texts == ["#1 spam: 0.5 true", "#3 spam: 2 true"]
    assert templated.errors == {1: ("null_text", "column 'score' is null")}
    bare = prepare_texts(table, "n", {})
    assert bare.texts == [] and {reason for reason, _ in bare.errors.values()} == {"not_text"}
    assert "a template such as '{n}' writes it as text" in bare.errors[0][1]


def test_row_limits_and_odd_column_types_never_crash():
    from batchinfer.sources.prepare import row_limits

    limits, problems = row_limits([3, "12", 4.0, None, "²", "9" * 5000, -1, True, "", " 5.0 ", "n/a", "1.5"], "budget")
    # an empty CSV field is the default, as a null; "5.0" (a JSONL column that mixes kinds reads as text) is 5
    assert limits[:4] == [3, 12, 4, None] and limits[8:10] == [None, 5] and sorted(problems) == [4, 5, 6, 7, 10, 11]
    table = pa.table({"gap": pa.array([1, 2], pa.duration("s")), "t": ["a", "b"]})
    prepared = prepare_texts(table, "{t} after {gap}", {})  # a duration is no text: not a crash
    assert {reason for reason, _ in prepared.errors.values()} == {"not_text"}


def test_a_chat_row_that_is_not_one_names_the_message_and_the_key():
    from batchinfer.messages import message_problem

    where = "column 'messages'"
    assert message_problem([{"role": "user", "content": "hi"}], where) is None
    assert message_problem([{"role": "user", "content": "hi"}, {"role": "user"}], where) == (
        Reason.NOT_TEXT,
        "column 'messages'[1].content: is missing",
    )
    assert (
        message_problem([{"role": 3, "content": "hi"}], where)[1]
        == "column 'messages'[0].role: must be text, not a number"
    )
    assert message_problem("hi", where)[1] == "column 'messages' must be a list of {role, content} messages, not str"
    assert message_problem([], where) == (Reason.EMPTY_TEXT, "column 'messages' holds no message")
    blank = [{"role": "system", "content": " "}, {"role": "user", "content": "\u200b"}]
    assert message_problem(blank, where) == (
        Reason.EMPTY_TEXT,
        "column 'messages': every message's content is empty, or only whitespace, invisible or control characters",
    )
    assert message_problem([{"role": "system", "content": ""}, {"role": "user", "content": "hi"}], where) is None


def test_a_template_whose_columns_hold_nothing_is_empty_text():
    """Its own words alone are no row to run: 'Q: ' with an empty question went to the model as a normal row."""
    table = pa.table({"title": ["A", "", " ", "C"], "body": ["one", "\u200b", "", "  "]})
    prepared = prepare_texts(table, "Title: {title}\nBody: {body}", {})
    assert prepared.texts == ["Title: A\nBody: one", "Title: C\nBody:   "]  # one field with something: it runs
    assert sorted(prepared.errors) == [1, 2] and prepared.errors[1] == (
        Reason.EMPTY_TEXT,
        "text: the template's columns ('title', 'body') are empty, or only whitespace, invisible or control "
        "characters: the model would read the template's own words alone",
    )
    assert prepare_texts(pa.table({"q": ["", "x"]}), "Q: {q}", {}).texts == ["Q: x"]


def test_a_parquet_messages_column_takes_text_parts_whose_struct_has_other_fields():
    """Arrow gives each part every field of the column's struct: a text part beside an image part carries
    image_url: None, which is no image. The image part itself is named, as a batch file's request's is."""
    from batchinfer.sources.prepare import prepare_messages

    text = [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]
    image = [{"type": "image_url", "image_url": {"url": "u"}}]
    column = pa.array([[{"role": "user", "content": text}], [{"role": "user", "content": image}]])
    assert column.to_pylist()[0][0]["content"][0] == {"type": "text", "text": "Hi", "image_url": None}
    prepared = prepare_messages(pa.table({"m": column}), "m", {})
    assert prepared.texts == [[{"role": "user", "content": "Hi\nthere"}]]
    assert (
        prepared.errors[1][0] == Reason.UNSUPPORTED
        and "content[0] is a content part of type image_url" in (prepared.errors[1][1])
    )
