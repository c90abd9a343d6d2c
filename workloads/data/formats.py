"""The shapes of training rows fp8lab understands, and what each row means as trainable text.

Three formats, chosen by `data.format` (or detected from the columns with `auto`):
- `multiple_choice`: {prompt, choices, answer}; the answer is an index into choices (or the
  answer text itself when `data.choices_field` is null). Trained on `prompt + delimiter + answer`
  with the loss on the answer: the same text lm-eval scores.
- `prompt_completion`: {prompt, completion}; the loss is on the completion only.
- `chat`: {messages: [{role, content}, ...]} rendered with the tokenizer's chat template; the
  loss is on every assistant turn (see `chat_segments`).

A row becomes a list of `Segment`s (text + whether it is trained on); tokenization turns segment
boundaries into label masks. Pure Python (no torch) so the preflight checks can share it.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterable

log = logging.getLogger(__name__)

FORMATS = ("multiple_choice", "prompt_completion", "chat")
CHAT_ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Segment:
    text: str
    trained: bool


@dataclass(frozen=True)
class RowProblem:
    """One thing wrong with one row: the config key it concerns, a kind (to group repeats), text, fix."""

    key: str
    kind: str
    text: str
    fix: str


def format_fields(fmt: str, data_cfg: dict[str, Any]) -> dict[str, str]:
    """Config key -> the field name a row of this format must have."""
    if fmt == "chat":
        return {"data.messages_field": data_cfg["messages_field"]}
    if fmt == "prompt_completion":
        return {"data.prompt_field": data_cfg["prompt_field"], "data.completion_field": data_cfg["completion_field"]}
    fields = {"data.prompt_field": data_cfg["prompt_field"], "data.answer_field": data_cfg["answer_field"]}
    if data_cfg.get("choices_field"):
        fields["data.choices_field"] = data_cfg["choices_field"]
    return fields


def _signature(fmt: str, data_cfg: dict[str, Any]) -> list[str]:
    """The fields that identify a format (the prompt is shared, so it identifies none)."""
    return [f for k, f in format_fields(fmt, data_cfg).items() if k != "data.prompt_field"]


def detect_format(columns: Iterable[str], data_cfg: dict[str, Any], where: str) -> str:
    """`data.format`, or with `auto` the one format whose fields the columns have.

    Raises ValueError (one line, naming the fix) when none or several formats match."""
    if data_cfg["format"] != "auto":
        return data_cfg["format"]
    present = set(columns)
    matches = [fmt for fmt in FORMATS if all(f in present for f in _signature(fmt, data_cfg))]
    if len(matches) == 1:
        return matches[0]
    listed = ", ".join(sorted(present)) or "none"
    if matches:
        return _raise(f"data.format: auto matches {' and '.join(matches)} for {where} (fields: {listed}) "
                      f"(fix: data.format={matches[0]} or data.format={matches[1]})")
    return _raise(f"data.format: auto recognises no format in {where} (fields: {listed}; multiple_choice needs "
                  f"{'+'.join(_signature('multiple_choice', data_cfg))}, prompt_completion needs "
                  f"{data_cfg['completion_field']}, chat needs {data_cfg['messages_field']}) "
                  "(fix: set data.format and the matching data.*_field names)")


def _raise(message: str) -> str:
    raise ValueError(message)


def row_problems(row: dict[str, Any], fmt: str, data_cfg: dict[str, Any]) -> list[RowProblem]:
    """Everything that would make this row fail (or silently train on garbage like "None")."""
    fields = format_fields(fmt, data_cfg)
    missing = [RowProblem(key, f"missing:{name}", f"has no field '{name}' (fields: {', '.join(map(str, row)) or 'none'})",
                          f"set {key} to one of those fields") for key, name in fields.items() if name not in row]
    if missing:
        return missing
    if fmt == "chat":
        return _messages_problems(row[fields["data.messages_field"]], fields["data.messages_field"])
    problems = _text_problems(row, fields["data.prompt_field"], "data.prompt_field", "prompt")
    if fmt == "prompt_completion":
        return problems + _text_problems(row, fields["data.completion_field"], "data.completion_field", "completion")
    return problems + _answer_problems(row, data_cfg)


def _text_problems(row: dict[str, Any], name: str, key: str, what: str) -> list[RowProblem]:
    value = row[name]
    if value is None or (isinstance(value, str) and not value.strip()):
        shown = "null" if value is None else "empty"
        return [RowProblem(key, f"empty:{name}", f"'{name}' is {shown}", f"give every row a non-empty {what}, or drop the row")]
    if not isinstance(value, str):
        return [RowProblem(key, f"type:{name}", f"'{name}' must be a string, got {_shown(value)}", f"make '{name}' a string")]
    return []


def _answer_problems(row: dict[str, Any], data_cfg: dict[str, Any]) -> list[RowProblem]:
    answer_name, choices_name = data_cfg["answer_field"], data_cfg.get("choices_field")
    answer = row[answer_name]
    if not choices_name:
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)) or not str(answer).strip():
            return [RowProblem("data.answer_field", "answer-text", f"'{answer_name}' must be the answer text, got {_shown(answer)}",
                               "a non-empty string, or set data.choices_field when the answer indexes choices")]
        return []
    choices = row[choices_name]
    if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) and c.strip() for c in choices):
        return [RowProblem("data.choices_field", "choices", f"'{choices_name}' must be a list of at least 2 non-empty "
                           f"strings, got {_shown(choices)}", f'"{choices_name}": ["first", "second", ...]')]
    if isinstance(answer, str):
        return [] if answer.strip() else [RowProblem("data.answer_field", "answer-empty", f"'{answer_name}' is empty",
                                                     "a 0-based index into the choices, or the answer text")]
    if not isinstance(answer, int) or isinstance(answer, bool) or not 0 <= answer < len(choices):
        return [RowProblem("data.answer_field", "answer-index", f"answer {answer!r} is not an index into {len(choices)} choices",
                           "a 0-based int index, or set data.choices_field=null for text answers")]
    return []


def _messages_problems(messages: Any, name: str) -> list[RowProblem]:
    fix = f'"{name}": [{{"role": "user", "content": "..."}}, {{"role": "assistant", "content": "..."}}]'
    if not isinstance(messages, list) or not messages:
        return [RowProblem("data.messages_field", "messages", f"'{name}' must be a non-empty list of messages, got {_shown(messages)}", fix)]
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in CHAT_ROLES:
            return [RowProblem("data.messages_field", "role", f"message {i} needs a role in {', '.join(CHAT_ROLES)}, "
                               f"got {_shown(message)}", fix)]
        content = message.get("content")
        if not isinstance(content, str) or not content.strip():
            return [RowProblem("data.messages_field", "content", f"message {i} ({message['role']}) has content "
                               f"{_shown(content)}, not a non-empty string", fix)]
    if not any(m["role"] == "assistant" for m in messages):
        return [RowProblem("data.messages_field", "no-assistant", "has no assistant message (nothing to train on)", fix)]
    return []


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40] + '...' if len(text) > 40 else text}"


def text_segments(row: dict[str, Any], fmt: str, data_cfg: dict[str, Any]) -> list[Segment]:
    """multiple_choice / prompt_completion: the prompt as context, `delimiter + answer` trained."""
    prompt = row[data_cfg["prompt_field"]]
    if fmt == "prompt_completion":
        answer = row[data_cfg["completion_field"]]
    else:
        answer = row[data_cfg["answer_field"]]
        if data_cfg.get("choices_field") and not isinstance(answer, str):
            answer = row[data_cfg["choices_field"]][int(answer)]
    return [Segment(prompt, False), Segment(data_cfg["target_delimiter"] + str(answer), True)]


def chat_segments(messages: list[dict[str, str]], tokenizer: Any) -> list[Segment]:
    """The conversation rendered by the tokenizer's chat template, every assistant turn trained.

    Turn boundaries come from rendering prefixes of the conversation (up to a turn, with the
    generation prompt; then including it), so the trained text is exactly what the model would
    produce after the template's assistant header, end-of-turn token included. Templates that
    re-render earlier turns differently once later turns exist (e.g. ones that drop old
    reasoning) cannot be split that way; for those only the final assistant turn is trained."""
    full = _render(tokenizer, messages, False)
    segments: list[Segment] = []
    done = ""
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prefix, upto = _render(tokenizer, messages[:i], True), _render(tokenizer, messages[: i + 1], False)
        if not (prefix.startswith(done) and upto.startswith(prefix) and full.startswith(upto)):
            return _final_turn_segments(messages, tokenizer, full)
        segments += [Segment(prefix[len(done):], False), Segment(upto[len(prefix):], True)]
        done = upto
    segments.append(Segment(full[len(done):], False))
    return [s for s in segments if s.text]


def _final_turn_segments(messages: list[dict[str, str]], tokenizer: Any, full: str) -> list[Segment]:
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    prefix, upto = _render(tokenizer, messages[:last], True), _render(tokenizer, messages[: last + 1], False)
    if not (upto.startswith(prefix) and full.startswith(upto)):
        raise ValueError("data.format: the chat template does not render the final assistant turn as a continuation "
                         "of the conversation before it (fix: a tokenizer whose chat template does, or prompt_completion rows)")
    log.warning("chat template re-renders earlier turns: training on the final assistant turn of each conversation only")
    return [s for s in (Segment(prefix, False), Segment(upto[len(prefix):], True), Segment(full[len(upto):], False)) if s.text]


def _render(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    if not messages:
        return ""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
