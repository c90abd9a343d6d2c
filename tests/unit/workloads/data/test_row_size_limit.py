"""Reliability round 3, case 3 (preflight part): data is read streaming with a per-row size
limit, `data.max_row_bytes`; a huge single-line file is refused with one line, before any work,
without ever holding the line (or the file) in memory."""
from __future__ import annotations

import json
import resource
from pathlib import Path

import pytest

from orchestrator.config_loader import compose_config, to_container
from workloads.data.checks import check_data_inputs, jsonl_rows
from workloads.embedded.paths import embedded_paths


@pytest.fixture(scope="module")
def base_config() -> dict:
    return to_container(compose_config([]))


def _problems(config: dict, path: Path, max_row_bytes: int) -> list[str]:
    paths = embedded_paths()
    data = {**config["data"], "path": str(path), "max_row_bytes": max_row_bytes}
    return check_data_inputs({**config, "data": data}, paths.data_dir, paths.model_dir)


def test_a_line_longer_than_the_limit_is_one_line_naming_the_key(base_config: dict, tmp_path: Path) -> None:
    file = tmp_path / "one-line.jsonl"
    row = {"prompt": "x" * 50_000, "completion": "y"}
    file.write_text(json.dumps(row) + "\n" + json.dumps({"prompt": "a", "completion": "b"}) + "\n")
    problems = _problems(base_config, file, 10_000)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"data.max_row_bytes: {file} line 1 is {len(json.dumps(row)) + 1} bytes, more than "
                                  "data.max_row_bytes=10000"), problems
    assert "(fix: " in problems[0]
    assert _problems(base_config, file, 100_000) == []


def test_a_huge_single_line_file_is_refused_in_bounded_memory(base_config: dict, tmp_path: Path) -> None:
    file = tmp_path / "huge.jsonl"
    with file.open("w") as handle:  # 48 MB, one line, no newline at the end
        handle.write('{"prompt": "')
        for _ in range(48):
            handle.write("z" * (1 << 20))
        handle.write('", "completion": "c"}')
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB, the process's peak so far
    problems = _problems(base_config, file, 1 << 20)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert len(problems) == 1 and "data.max_row_bytes=1048576" in problems[0], problems
    assert grown_mib < 16, f"peak RSS grew {grown_mib:.0f} MiB reading a 48 MiB line"  # the file is never held whole


def test_rows_are_streamed_not_held(tmp_path: Path) -> None:
    file = tmp_path / "rows.jsonl"
    file.write_text("".join(json.dumps({"prompt": str(i), "completion": "c"}) + "\n" for i in range(1000)))
    rows = jsonl_rows(file, 1 << 20)
    assert next(rows)[1] == {"prompt": "0", "completion": "c"}  # a generator: one row at a time


def test_memory_estimate_covers_tokenization(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trial's memory estimate counts the tokenized rows and their text: a data file too large
    for one trial's memory is refused in preflight, naming data.max_train_examples."""
    from workloads.model import sizing
    from workloads.preflight import check_model_fit, training_data_size

    file = tmp_path / "train.jsonl"
    file.write_text("".join(json.dumps({"prompt": f"q{i}", "completion": "a"}) + "\n" for i in range(2000)))
    config = to_container(compose_config([f"data.path={file}"]))
    rows, size = training_data_size(config)
    assert (rows, size) == (2000, file.stat().st_size)
    config["data"]["max_train_examples"] = 500
    assert training_data_size(config)[0] == 500
    config["data"]["max_train_examples"] = None
    need = 2000 * 32 * 24 + size * sizing.DATA_BYTES_FACTOR
    facts_budget = sizing.trial_memory(config)
    assert facts_budget is not None
    monkeypatch.setattr(sizing, "trial_memory", lambda _: (need // 2, "a test budget"))
    monkeypatch.setattr(sizing, "DATA_BYTES_FACTOR", 10**6)  # as if the file were far larger than memory
    problems = check_model_fit(config)
    assert len(problems) == 1 and problems[0].startswith("data.max_train_examples: a trial needs"), problems
    assert "tokenized data" in problems[0]
