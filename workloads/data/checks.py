"""Preflight checks of the training data: every split file, every row, before any work starts.

A trial that meets a bad row late fails after minutes of training (or, worse, trains on the
text "None"); so every file of a data folder is read here, in the preflight child process:
encoding and JSON errors with file and line, missing fields, wrong field types, empty or null
prompts, the format's fields, and the chat template a chat format needs. Repeats of one problem
in one file are one line (first line number and how many more), and all problems are reported
together. The data an lm-eval task reads from the folder (`validation.jsonl`, `test.jsonl`) is
checked against what that task's loader accepts.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from fp8lab_conf.filesystem import special_path_problem
from workloads.data.chat_template import chat_template_problems
from workloads.data.load import DATA_SUFFIXES, DataSource, locate
from workloads.data.formats import RowProblem, detect_format, row_problems
from workloads.eval.metrics import EMBEDDED_TASK, configured_tasks
# What the embedded task's loader (workloads/embedded/tasks/dataset.py) reads from a data folder.
EVAL_SPLITS = ("train", "validation", "test")
DEFAULT_MAX_ROW_BYTES = 1 << 20  # data.max_row_bytes when unset
EVAL_FIELDS = {"prompt_field": "prompt", "choices_field": "choices", "answer_field": "answer"}


@dataclass
class FileReport:
    """Problems of one file, grouped so 3000 bad rows are one line, not 3000."""

    path: str
    unit: str  # "line" (JSONL) or "row" (Parquet, Arrow)
    groups: dict[tuple[str, str], list[Any]] = field(default_factory=dict)  # (key, kind) -> [first, count, text, fix]

    def add(self, where: int, problem: RowProblem) -> None:
        group = self.groups.setdefault((problem.key, problem.kind), [where, 0, problem.text, problem.fix])
        group[1] += 1

    def lines(self) -> list[str]:
        out = []
        for (key, _), (first, count, text, fix) in self.groups.items():
            more = f" (and {count - 1} more {self.unit}{'s' if count > 2 else ''})" if count > 1 else ""
            out.append(f"{key}: {self.path} {self.unit} {first} {text}{more} (fix: {fix})")
        return out


def check_data_inputs(config: dict[str, Any], embedded_dir: Path, embedded_model_dir: Path) -> list[str]:
    """Every problem with the training data (and the task data a data folder provides), one line each."""
    data_cfg, eval_cfg = config["data"], config["eval"]
    path = data_cfg["path"]
    local = Path(path).expanduser()
    special = _special_files(local) if path != "embedded" else []
    if special:
        return special
    if path != "embedded" and not local.exists():
        if path.startswith((".", "/", "~")) or local.suffix in DATA_SUFFIXES:
            return [f"data.path: {path} does not exist (fix: a JSONL/Parquet file, a folder of <split>.jsonl files, "
                    "or a folder saved with save_to_disk)"]
        return []  # a HF dataset name: `datasets` reports it when loading
    source = locate(path, embedded_dir)
    try:
        splits = dict(_split_rows(source, int(data_cfg.get("max_row_bytes") or DEFAULT_MAX_ROW_BYTES)))
    except ValueError as exc:
        return [str(exc)]
    split = "train" if local.is_file() else data_cfg["train_split"]  # one file is the training split
    if split not in splits:
        return [f"data.path: no '{split}' split in {path} (found: {', '.join(splits) or 'no .jsonl/.parquet files'}) "
                f"(fix: add {split}.jsonl or set data.train_split)"]
    problems, fmt = _training_format(splits[split], data_cfg)
    for name, rows in splits.items():  # without a format, still every encoding/JSON problem
        if fmt is not None or name != split:
            problems += _check_rows(rows, fmt, data_cfg)
    if fmt is None:
        return list(dict.fromkeys(problems))
    if fmt == "chat":
        problems += (chat_template_problems(data_cfg["chat_template"]) if data_cfg.get("chat_template")
                     else check_chat_template(config["model"], embedded_model_dir))
    if path != "embedded" and local.is_dir() and uses_embedded_task(eval_cfg):
        problems += _check_eval_folder(local, source, splits, fmt, data_cfg)
    return list(dict.fromkeys(problems))


def _special_files(local: Path) -> list[str]:
    """A symlink loop or a FIFO/device as data.path (or as a split file of its folder), named as
    what it is: `exists()` calls a loop missing, and reading a FIFO would block the check."""
    candidates = [local]
    if local.is_dir():
        candidates += sorted(p for p in local.iterdir() if p.suffix in DATA_SUFFIXES)
    return [f"data.path: {problem} (fix: point data.path at a regular JSONL/Parquet file or a folder of them)"
            for problem in map(special_path_problem, candidates) if problem]


@dataclass
class SplitRows:
    """One split's rows as (line or row number, row or None, problem or None). `read` yields them
    afresh on each pass, so a JSONL split is streamed from its file (one row in memory at a
    time), never held whole: memory stays bounded whatever the file's size."""

    path: str
    unit: str
    read: Callable[[], Iterator[tuple[int, dict[str, Any] | None, RowProblem | None]]]

    @property
    def rows(self) -> Iterator[tuple[int, dict[str, Any] | None, RowProblem | None]]:
        return self.read()

    def columns(self) -> list[str]:
        return list(dict.fromkeys(k for _, row, _ in self.rows if row for k in row))


def _split_rows(source: DataSource, max_row_bytes: int) -> Iterator[tuple[str, SplitRows]]:
    if source.saved is not None:
        yield from _saved_rows(source.saved)
        return
    for split, file in (source.files or {}).items():
        if DATA_SUFFIXES[file.suffix] == "parquet":
            rows = list(_parquet_rows(file))
            yield split, SplitRows(str(file), "row", lambda rows=rows: iter(rows))
        else:
            yield split, SplitRows(str(file), "line", lambda file=file: jsonl_rows(file, max_row_bytes))


def _lines(handle: Any, max_row_bytes: int) -> Iterator[tuple[int, bytes | None, int]]:
    """(line number, the line or None when it is longer than `max_row_bytes`, its length). A line
    is read at most `max_row_bytes` + 1 bytes at a time, so one huge line (a 200 MB single-line
    file) never sits in memory whole."""
    lineno = 0
    while chunk := handle.readline(max_row_bytes + 1):
        lineno += 1
        if len(chunk) <= max_row_bytes or chunk.endswith(b"\n"):
            yield lineno, chunk, len(chunk)
            continue
        length = len(chunk)
        while chunk and not chunk.endswith(b"\n"):  # skip the rest of the over-long line
            chunk = handle.readline(1 << 20)
            length += len(chunk)
        yield lineno, None, length


def jsonl_rows(path: Path, max_row_bytes: int = 0) -> Iterator[tuple[int, dict[str, Any] | None, RowProblem | None]]:
    """Each non-blank line: decoded as UTF-8 and parsed as one JSON object, or why not (a line
    longer than `max_row_bytes` is a problem of its own and is not parsed)."""
    limit = max_row_bytes or DEFAULT_MAX_ROW_BYTES
    with path.open("rb") as handle:
        for lineno, raw, length in _lines(handle, limit):
            if raw is None:
                yield lineno, None, RowProblem("data.max_row_bytes", "row-size", f"is {length} bytes, more than "
                                               f"data.max_row_bytes={limit}", "split it into rows of one example each, "
                                               f"or raise data.max_row_bytes if one example really is that long")
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield lineno, None, RowProblem("data.path", "encoding", f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} "
                                               f"at column {exc.start + 1})", "save the file as UTF-8")
                continue
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                yield lineno, None, RowProblem("data.path", "json", f"is not valid JSON ({exc.msg} at column {exc.colno})",
                                               "one JSON object per line")
                continue
            if not isinstance(row, dict):
                yield lineno, None, RowProblem("data.path", "json", f"is not a JSON object (got {type(row).__name__})",
                                               "one JSON object per line")
                continue
            yield lineno, row, None


def _parquet_rows(path: Path) -> Iterator[tuple[int, dict[str, Any] | None, RowProblem | None]]:
    import pyarrow.parquet as pq  # datasets' own storage library

    try:
        table = pq.read_table(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for unreadable files
        raise ValueError(f"data.path: {path} is not a readable Parquet file ({_first_line(exc)}) "
                         "(fix: write it with pandas/pyarrow/datasets .to_parquet)") from None
    for index, row in enumerate(table.to_pylist(), start=1):
        yield index, row, None


def _saved_rows(folder: Path) -> Iterator[tuple[str, SplitRows]]:
    """Every split of a save_to_disk folder, through `datasets` itself."""
    import datasets

    try:
        loaded = datasets.load_from_disk(str(folder))
    except Exception as exc:  # noqa: BLE001 - datasets raises many types for damaged folders
        raise ValueError(f"data.path: {folder} looks like a save_to_disk folder but datasets cannot load it "
                         f"({_first_line(exc)}) (fix: save it again with Dataset.save_to_disk)") from None
    parts = loaded.items() if isinstance(loaded, datasets.DatasetDict) else [("train", loaded)]
    for split, dataset in parts:
        rows = [(i, row, None) for i, row in enumerate(dataset.to_list(), start=1)]
        yield split, SplitRows(f"{folder} split '{split}'", "row", lambda rows=rows: iter(rows))


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def _training_format(rows: SplitRows, data_cfg: dict[str, Any]) -> tuple[list[str], str | None]:
    """The format the training split is read in, or the line saying why it cannot be decided."""
    if not any(row for _, row, _ in rows.rows):  # nothing readable: say why, or that it is empty
        return _check_rows(rows, None, data_cfg) or [f"data.path: {rows.path} has no examples (fix: add at least one JSON line)"], None
    try:
        return [], detect_format(rows.columns(), data_cfg, rows.path)
    except ValueError as exc:
        return [str(exc)] + _check_rows(rows, None, data_cfg), None


def _check_rows(rows: SplitRows, fmt: str | None, data_cfg: dict[str, Any]) -> list[str]:
    """Grouped problems of one split (`fmt` None: only what needs no format, e.g. encoding)."""
    report = FileReport(rows.path, rows.unit)
    for where, row, problem in rows.rows:
        if problem is not None:
            report.add(where, problem)
        elif row is not None and fmt is not None:
            for found in row_problems(row, fmt, data_cfg):
                report.add(where, found)
    return report.lines()


def uses_embedded_task(eval_cfg: dict[str, Any]) -> bool:
    """Whether evaluation runs fp8lab's embedded task (alone, among several, or by default)."""
    return EMBEDDED_TASK in configured_tasks(eval_cfg)


def _check_eval_folder(folder: Path, source: DataSource, splits: dict[str, SplitRows], fmt: str,
                       data_cfg: dict[str, Any]) -> list[str]:
    """The embedded task scores a data folder's test.jsonl (and reads its train/validation.jsonl)
    as {"prompt", "choices", "answer": index} rows: check them the way its loader will."""
    files = source.files or {}
    missing = [s for s in ("train", "test") if s not in files or files[s].suffix != ".jsonl"]
    if missing:
        return [f"data.path: eval.task={EMBEDDED_TASK} evaluates {folder}/test.jsonl and reads {folder}/train.jsonl; "
                f"{', '.join(f'{s}.jsonl' for s in missing)} missing (fix: add it, or choose another eval.task)"]
    if fmt != "multiple_choice" or any(data_cfg.get(k) != v for k, v in EVAL_FIELDS.items()):
        fields = ", ".join(f"{k}={data_cfg.get(k)}" for k in ("format", "prompt_field", "choices_field", "answer_field"))
        return [f"eval.task: {EMBEDDED_TASK} scores {folder}/test.jsonl as multiple-choice rows with fields prompt, "
                f"choices, answer, but the data is read with {fields} (fix: an eval.task for your data, or "
                "data.path=<the training file> so the embedded task keeps its own data)"]
    problems = []
    for split in (s for s in EVAL_SPLITS if s in files and files[s].suffix == ".jsonl"):
        # Training also accepts the answer as text; the task's loader needs the index (other row
        # problems were reported by the training check already).
        report = FileReport(f"{splits[split].path} (read by eval.task={EMBEDDED_TASK})", "line")
        for where, row, _ in splits[split].rows:
            if row is not None and isinstance(row.get("answer"), str):
                report.add(where, RowProblem("data.answer_field", "eval-answer-text", f"answer {row['answer'][:40]!r} is text, "
                                             "the task needs an index into choices", "a 0-based int index into choices"))
        problems += report.lines()
    return problems


def check_chat_template(model_cfg: dict[str, Any], embedded_model_dir: Path) -> list[str]:
    """Chat rows need the tokenizer's chat template; a base model's tokenizer often has none."""
    from transformers import AutoTokenizer

    from workloads.model.loading import resolve_model_path

    path = resolve_model_path(model_cfg["name_or_path"], embedded_model_dir)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=bool(model_cfg.get("trust_remote_code")))
    except Exception:  # noqa: BLE001 - the model checks report an unloadable tokenizer
        return []
    if getattr(tokenizer, "chat_template", None):
        return []
    return [f"data.format: chat rows are rendered with the tokenizer's chat template, and {model_cfg['name_or_path']} has "
            "none (fix: data.chat_template=<a .jinja file or the template text>, an instruct/chat model whose "
            "tokenizer_config.json has a chat_template, or prompt_completion rows)"]

