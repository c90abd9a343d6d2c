"""Every benchmark's --smoke mode runs and writes its JSON, so the benchmarks never rot.

The in-process ones (telemetry, FP8 emulation, memory) run here in seconds; the ones that launch
`fp8lab trial` / `fp8lab sweep` processes (plain-script comparison, orchestration, growth) are
marked integration. The figures of a smoke run mean nothing; only the shape of the JSON is checked.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    """Import a benchmark module by name; torch threads are restored afterwards."""
    import torch

    threads = torch.get_num_threads()
    monkeypatch.syspath_prepend(str(BENCH))
    yield lambda name: importlib.import_module(name)
    torch.set_num_threads(threads)


def run_script(name: str, out: Path, timeout: int = 600) -> dict:
    proc = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), "--smoke", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(out.read_text())


def test_telemetry_overhead_smoke(bench, tmp_path):
    out = tmp_path / "t.json"
    every = "off,default,every_step,item_loop"
    assert bench("telemetry_overhead").main(["--smoke", "--variants", every, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["smoke"] and data["environment"]["torch"]
    variants = data["results"][0]["variants"]
    assert set(variants) == {"off", "off_again", "default", "every_step", "item_loop"}  # the control always
    assert variants["default"]["wall"]["ratio"]["n"] == 1 and "overhead_pct" in variants["default"]["cpu"]
    control = data["summary"]["controls"]["bf16"]  # off measured twice: the method's noise floor
    assert control["rounds"] == 1 and control["p25"] <= control["median"] <= control["p75"]
    assert data["summary"]["passes"] == 5  # one cycle: a pass per variant, so each leads once


def test_telemetry_overhead_refuses_a_chunk_that_holds_no_recorded_step(bench, tmp_path, capsys):
    """A chunk restarts the step count, so 4-step chunks never reach the 10th step that telemetry
    records: the default variant would time the health signals alone. Refused before any work."""
    out = tmp_path / "t.json"
    with pytest.raises(SystemExit) as refused:
        bench("telemetry_overhead").main(["--chunk", "4", "--json", str(out)])
    assert refused.value.code == 2
    assert "--chunk 4: must be a multiple of precision.telemetry.every (10" in capsys.readouterr().err
    assert not out.exists()


def test_telemetry_overhead_refuses_an_unknown_variant_zero_cycles_and_a_contradiction(bench, tmp_path, capsys):
    """A misspelt variant would silently not be measured; zero cycles would time nothing; asking to
    leave the control out and to measure it cannot both be honoured."""
    out = tmp_path / "t.json"
    for args, message in ((["--variants", "off,item-loop"], "--variants: unknown item-loop (choose from off, off_again"),
                          (["--cycles", "0"], "--cycles 0: must be at least 1"),
                          (["--no-control", "--variants", "off,off_again"], "--no-control leaves out off_again, which --variants asks for")):
        with pytest.raises(SystemExit) as refused:
            bench("telemetry_overhead").main([*args, "--json", str(out)])
        assert refused.value.code == 2 and message in capsys.readouterr().err
    assert not out.exists()


def test_fp8_emulation_smoke(bench, tmp_path):
    out = tmp_path / "e.json"
    assert bench("fp8_emulation").main(["--smoke", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    sizes = {r["hidden"]: r for r in data["results"]}
    assert set(sizes) == {128, 192}
    for res in sizes.values():
        assert {"bf16", "fp8_protected", "fp8_naive"} <= set(res["variants"])
        assert res["variants"]["fp8_protected"]["cpu"]["ratio"]["median"] > 0
    if data["torchao"]:
        assert "ratio_vs_torchao" in sizes[128]["variants"]["fp8_protected"]["wall"]


def test_memory_smoke(bench, tmp_path):
    out = tmp_path / "m.json"
    assert bench("memory").main(["--smoke", "--json", str(out)]) == 0
    by_policy = json.loads(out.read_text())["results"]["default"]
    assert by_policy["bf16"]["base_linear_ratio"] == 1.0
    assert by_policy["fp8_protected"]["base_linear_ratio"] < 0.52  # FP8 + 128x128 FP32 scales


@pytest.mark.integration
def test_vs_plain_script_smoke(tmp_path):
    data = run_script("vs_plain_script", tmp_path / "p.json")
    assert data["summary"]["tokens_per_s"]["fp8lab"] > 0 and data["summary"]["tokens_per_s"]["plain"] > 0


@pytest.mark.integration
def test_orchestration_smoke(tmp_path):
    data = run_script("orchestration", tmp_path / "o.json")
    assert data["summary"]["all_finished"] and data["summary"]["first_step_s"] > 0
    assert len(data["sweep"]["trials"]) == 2


@pytest.mark.integration
def test_growth_smoke(tmp_path):
    data = run_script("growth", tmp_path / "g.json", timeout=900)
    assert [p["trials"] for p in data["summary"]] == [1]
    assert all(p["store_bytes"] > 0 for p in data["summary"])


def test_projection_validation_smoke(bench, tmp_path):
    out = tmp_path / "p.json"
    assert bench("projection_validation").main(["--smoke", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert len(data["results"]) == 5 and data["validated"] == all(r["ok"] for r in data["results"])
    assert len(data["sensitivity"]) == 9


def test_garbage_collection_smoke(bench, tmp_path):
    out = tmp_path / "x.json"
    assert bench("garbage_collection").main(["--smoke", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["smoke"] and list(data["results"]) == ["import"]
    variants = data["results"]["import"]
    assert list(variants) == ["plain", "skip", "paused+skip"]
    for figures in variants.values():
        assert figures["cpu_s"]["n"] == figures["ratio"]["n"] == 1 and figures["cpu_s"]["median"] > 0
    assert variants["plain"]["ratio"]["median"] == 1.0
