"""The tasks a job can run: what each writes, what its model must have, what its rows need.

One registry, read by the job file's validation (task names, result columns), by the model loader
(which auto class, which head) and by the runners (runners/<task>.py implements each). No package
imports, so the job file can be checked without loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TaskSpec:
    name: str
    summary: str  # for the job-file reference
    columns: tuple[str, ...]  # result columns it writes (besides source, row, id and kept columns)
    auto_class: str  # the transformers Auto class that loads its model
    head: tuple[str, ...] = ()  # architecture name parts the model must have (any), e.g. ForSequenceClassification
    needs: str = ""  # that head in words
    head_fix: str = ""  # what to do when it has none
    pairs: bool = False  # rows are (text, text_pair)


TASKS = {
    spec.name: spec
    for spec in (
        TaskSpec("embed", "one embedding vector per row", ("embedding", "truncated"), "AutoModel"),
        TaskSpec(
            "classify",
            "label, label_id and score per row",
            ("label", "label_id", "score", "scores", "truncated"),
            "AutoModelForSequenceClassification",
            ("ForSequenceClassification",),
            "a sequence-classification head",
            "use a model fine-tuned for classification, set model.task: embed, or give model.labels to score "
            "them with a causal language model",
        ),
        TaskSpec(
            "score",
            "a relevance score per (text, text_pair): cross-encoders, rerankers",
            ("score", "scores", "truncated"),
            "AutoModelForSequenceClassification",
            ("ForSequenceClassification",),
            "a sequence-classification head",
            "use a cross-encoder (a sequence-classification model trained on pairs)",
            pairs=True,
        ),
        TaskSpec(
            "token-classify",
            "entities per row (NER, PII): label, score and character offsets",
            ("entities", "truncated"),
            "AutoModelForTokenClassification",
            ("ForTokenClassification",),
            "a token-classification head",
            "use a model fine-tuned for token classification (NER)",
        ),
        TaskSpec(
            "zero-shot",
            "label, score and scores over model.labels, with an NLI model",
            ("label", "score", "scores", "truncated"),
            "AutoModelForSequenceClassification",
            ("ForSequenceClassification",),
            "a sequence-classification head",
            "use an NLI model (labels entailment, neutral, contradiction)",
        ),
        TaskSpec(
            "generate",
            "a completion per row (settings under generation)",
            ("text", "finish_reason", "prompt_tokens", "completion_tokens", "truncated"),
            "AutoModelForCausalLM",
            ("ForCausalLM", "LMHeadModel"),
            "a causal language model",
            "use a model saved from an AutoModelForCausalLM (Llama, GPT-2, Qwen, ...)",
        ),
    )
}

# task classify with model.labels: a causal LM scores each label by likelihood (runners/label_score.py)
LABEL_SCORING = TaskSpec(
    "classify",
    TASKS["classify"].summary,
    TASKS["classify"].columns,
    "AutoModelForCausalLM",
    TASKS["generate"].head,
    "a causal language model (model.labels are scored by their likelihood)",
    "use a model saved from an AutoModelForCausalLM, or remove model.labels to run a classification head",
)


def model_spec(task: str, labels: list[str]) -> TaskSpec:
    """What the model of `task` must be: a causal LM when classify has labels to score, else the task's own."""
    return LABEL_SCORING if task == "classify" and labels else TASKS[task]
