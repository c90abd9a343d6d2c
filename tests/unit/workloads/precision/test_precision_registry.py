"""The backend registry: a backend registered from outside the product (the toy backend in this
folder) is selectable, checked and applied through the same calls as the built-in ones; the
names the orchestrator validates against come from the registry without importing torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch import nn

from workloads.precision.backends import (
    BackendEntry,
    apply_backend,
    backend_policy_errors,
    register_backend,
    select_backend,
)
from workloads.precision.backends.entries import (
    auto_order,
    backend_names,
    requestable_names,
    unregister_backend,
)
from workloads.precision.policy import get_policy

TOY = "tests.unit.workloads.precision.toy_backend"


@pytest.fixture
def toy():
    """The toy backend registered as 'toy', in auto's order just before the emulated fallback."""
    register_backend(BackendEntry("toy", TOY, auto_rank=50, summary="test backend"))
    from tests.unit.workloads.precision import toy_backend

    toy_backend.BACKEND.applied.clear()
    yield toy_backend.BACKEND
    unregister_backend("toy")


def _tiny_lora() -> nn.Module:
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(32, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x)

    return get_peft_model(Block(), LoraConfig(r=2, target_modules=["proj"]))


def test_a_toy_backend_from_the_tests_folder_is_selected_checked_and_applied(toy):
    assert "toy" in backend_names() and "toy" in requestable_names()
    assert auto_order() == ("transformer_engine", "torchao", "toy", "emulated")

    explicit = select_backend("toy", "cpu")
    assert (explicit.name, explicit.emulated, explicit.requested) == ("toy", False, "toy")
    assert explicit.reason == "requested explicitly; the toy runs on cpu"
    auto = select_backend("auto", "cpu")  # TE and torchao need an FP8 GPU; the toy does not
    assert (auto.name, auto.emulated) == ("toy", False) and auto.reason.startswith("auto: the toy")

    assert backend_policy_errors("toy", "fp8_protected") == []
    assert backend_policy_errors("toy", "fp8_naive") == [
        "precision.backend=toy: policy 'fp8_naive': the toy keeps lm_head in BF16"
    ]
    model = _tiny_lora()
    handle = apply_backend(model, "fp8_protected", None, explicit)
    assert (handle.backend, handle.deviations) == ("toy", ("toy: nothing is really different",))
    assert toy.applied == [("fp8_protected", explicit)]
    y = model(torch.randn(3, 32))  # the emulated numerics it borrowed really run
    assert y.shape == (3, 32) and torch.isfinite(y).all()


def test_auto_falls_back_from_the_toy_to_the_next_backend_that_runs_the_policy(toy):
    choice = select_backend("auto", "cpu")
    assert choice.name == "toy"
    handle = apply_backend(_tiny_lora(), "fp8_naive", None, choice)  # FP8 lm_head: toy refuses
    assert (handle.backend, handle.emulated) == ("emulated", True)
    assert toy.applied == []
    assert backend_policy_errors("auto", "fp8_naive") == []


def test_unknown_and_reserved_names():
    with pytest.raises(ValueError, match="did you mean 'emulated'"):
        select_backend("emulatd", "cpu")
    with pytest.raises(ValueError, match="reserved"):
        register_backend(BackendEntry("auto", TOY))
    with pytest.raises(ValueError, match="already registered"):
        register_backend(BackendEntry("torchao", TOY))
    assert backend_policy_errors("nope", "bf16")[0].startswith("precision.backend='nope' not in")


def test_schema_reads_the_registry_and_selection_loads_only_the_chosen_backend():
    """In a fresh interpreter: the orchestrator's schema gets the names without torch, and
    choosing the emulated backend imports neither the torchao nor the TE backend module."""
    code = textwrap.dedent(
        """
        import sys
        from orchestrator.schema import SCHEMA
        from workloads.precision.backends.entries import requestable_names
        assert "torch" not in sys.modules, "schema/entries imported torch"
        assert SCHEMA["precision"]["backend"].allowed == "one of " + ", ".join(requestable_names())
        from workloads.precision.backends import select_backend
        assert select_backend("emulated", "cpu").name == "emulated"
        pkg = "workloads.precision.backends."
        loaded = {m for m in sys.modules if m.startswith(pkg)}
        assert pkg + "emulated_backend" in loaded, loaded
        assert not loaded & {pkg + "torchao_backend", pkg + "te_backend"}, loaded
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_torchao_frozen_module_pickles_by_its_module_level_name():
    """The frozen-base class and its autograd Function are module level (no factory), so
    torch.save / pickle find them by name."""
    import io
    import pickle

    float8 = pytest.importorskip("torchao.float8")
    from workloads.precision.backends import torchao_backend, torchao_frozen

    cls = torchao_backend.frozen_base_float8_linear_cls()
    assert cls is torchao_frozen.FrozenBaseFloat8Linear
    assert cls.__module__ == torchao_frozen.__name__ and cls.__qualname__ == cls.__name__
    lin = nn.Linear(32, 16, bias=False).to(torch.bfloat16).requires_grad_(False)
    config = torchao_backend.map_policy("fp8_naive").float8_config(emulate=True)
    mod = cls.from_float8_linear(
        float8.convert_to_float8_training(lin, config=config),
        name="lin", plain=frozenset(), telemetry=None,
    )  # fmt: skip
    buf = io.BytesIO()
    pickle.dump(mod, buf)
    again = pickle.loads(buf.getvalue())
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    assert type(again) is cls and torch.equal(again(x), mod(x))


def test_torchao_modules_are_imported_inside_functions_only():
    """torchao_backend (the policy mapping, used by preflight) imports neither torchao nor the
    frozen module at module level; only torchao_frozen does, and it is loaded on conversion."""
    import ast
    from pathlib import Path

    import workloads.precision.backends as pkg

    source = Path(pkg.__file__).with_name("torchao_backend.py").read_text()
    top = [n for n in ast.parse(source).body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [a.name for n in top for a in n.names] + [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
    assert not [n for n in names if n.startswith("torchao") or n.endswith("torchao_frozen")]
