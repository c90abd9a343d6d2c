"""Reliability round 3, case 12: a symlink loop and a FIFO as data.path (or model.name_or_path)
are named as what they are, not as "does not exist" / "no train split"."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.config_loader import compose_config, to_container
from workloads.data.checks import check_data_inputs
from workloads.embedded.paths import embedded_paths
from workloads.preflight import check_model


@pytest.fixture(scope="module")
def base_config() -> dict:
    return to_container(compose_config([]))


def _data_problems(config: dict, path: Path) -> list[str]:
    paths = embedded_paths()
    return check_data_inputs({**config, "data": {**config["data"], "path": str(path)}}, paths.data_dir, paths.model_dir)


def test_symlink_loop_is_called_a_loop(base_config: dict, tmp_path: Path) -> None:
    loop = tmp_path / "train.jsonl"
    os.symlink(loop.name, loop)  # points at itself
    problems = _data_problems(base_config, loop)
    assert len(problems) == 1 and "symbolic link loop" in problems[0] and "does not exist" not in problems[0], problems
    assert problems[0].startswith("data.path: ")
    model = check_model({"name_or_path": str(loop)})
    assert len(model) == 1 and "symbolic link loop" in model[0] and model[0].startswith("model.name_or_path: "), model


def test_fifo_is_called_a_named_pipe_without_blocking(base_config: dict, tmp_path: Path) -> None:
    fifo = tmp_path / "train.jsonl"
    os.mkfifo(fifo)
    problems = _data_problems(base_config, fifo)
    assert len(problems) == 1 and "named pipe (FIFO)" in problems[0] and "split" not in problems[0], problems


def test_fifo_split_file_inside_a_data_folder_is_named(base_config: dict, tmp_path: Path) -> None:
    (tmp_path / "train.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
    os.mkfifo(tmp_path / "test.jsonl")  # reading it would block the preflight forever
    problems = _data_problems(base_config, tmp_path)
    assert problems and "test.jsonl is a named pipe (FIFO)" in problems[0], problems
