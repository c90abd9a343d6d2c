"""Runs INSIDE the vLLM virtual environment (``vllm_load.py`` starts it): imports nothing of fp8lab.

``generate``: ``vllm.LLM`` loads the fp8-block128 folder and generates greedily for the prompts;
``check``: vLLM's own config parsing (``Fp8Config.from_config``) and block-shape validation
(``validate_fp8_block_shape``, with the merged qkv / gate_up partitions vLLM builds) on the folder,
without starting an engine. Both write a JSON result to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from types import SimpleNamespace

MERGED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def generate(model: str, prompts: list[str], max_tokens: int) -> dict:
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(model=model, dtype="bfloat16", max_model_len=256, enforce_eager=True, max_num_seqs=16, seed=0)
    loaded = time.perf_counter()
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    done = time.perf_counter()
    return {"token_ids": [list(o.outputs[0].token_ids) for o in outputs],
            "texts": [o.outputs[0].text for o in outputs],
            "load_s": loaded - started, "generate_s": done - loaded}


def check(model: str) -> dict:
    """vLLM's own parsing of quantization_config and its block-shape checks, per (merged) layer."""
    from safetensors import safe_open
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config
    from vllm.model_executor.layers.quantization.utils.fp8_utils import validate_fp8_block_shape

    import vllm.distributed

    # The check reads the TP world size even for tp_size=1 layers (a getattr default): a single
    # process without an engine has no TP group, so answer 1, what an engine on one CPU would.
    vllm.distributed.get_tensor_model_parallel_world_size = lambda: 1
    folder = Path(model)
    qcfg = json.loads((folder / "config.json").read_text())["quantization_config"]
    config = Fp8Config.from_config(qcfg)
    block_n, block_k = config.weight_block_size
    shapes: dict[str, tuple[list[int], list[int]]] = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            for key in f.keys():
                if key.endswith(".weight_scale_inv"):
                    layer = key[: -len(".weight_scale_inv")]
                    shapes[layer] = (list(f.get_slice(layer + ".weight").get_shape()), list(f.get_slice(key).get_shape()))
    problems = []
    for layer, (w, s) in shapes.items():
        want = [math.ceil(w[0] / block_n), math.ceil(w[1] / block_k)]
        if s != want:  # what Fp8LinearMethod.create_weights allocates for weight_scale_inv
            problems.append(f"{layer}: weight_scale_inv {s}, vLLM allocates {want}")
    checked = 0
    for prefix, fused, parts in _vllm_layers(shapes):
        sizes = [shapes[p][0][0] for p in parts]
        in_size = shapes[parts[0]][0][1]
        try:
            validate_fp8_block_shape(SimpleNamespace(tp_size=1), in_size, sum(sizes), in_size, sizes,
                                     config.weight_block_size)
            checked += 1
        except ValueError as exc:
            problems.append(f"{prefix}.{fused}: {exc}")
    return {"quant_method": config.get_name(), "serialized": config.is_checkpoint_fp8_serialized,
            "activation_scheme": config.activation_scheme, "weight_block_size": config.weight_block_size,
            "ignored_layers": config.ignored_layers, "fp8_layers": len(shapes), "vllm_layers_checked": checked,
            "problems": problems}


def _vllm_layers(shapes: dict) -> list[tuple[str, str, list[str]]]:
    """(prefix, vLLM layer name, checkpoint layers) with q/k/v and gate/up merged as vLLM does."""
    out, used = [], set()
    for layer in sorted(shapes):
        prefix, _, leaf = layer.rpartition(".")
        for fused, members in MERGED.items():
            if leaf == members[0] and all(f"{prefix}.{m}" in shapes for m in members):
                parts = [f"{prefix}.{m}" for m in members]
                out.append((prefix, fused, parts))
                used.update(parts)
    out += [(layer.rpartition(".")[0], layer.rpartition(".")[2], [layer]) for layer in sorted(shapes) if layer not in used]
    return out


if __name__ == "__main__":  # vLLM spawns its engine: LLM(...) only under this guard
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("generate", "check"))
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", help="JSON file: a list of prompt strings (generate)")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.mode == "generate":
        result = generate(args.model, json.loads(Path(args.prompts).read_text()), args.max_tokens)
    else:
        result = check(args.model)
    import vllm

    result["vllm_version"] = vllm.__version__
    Path(args.out).write_text(json.dumps(result))
