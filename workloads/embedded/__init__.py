"""The model and task fp8lab ships so that a sweep runs with no downloads.

- `assets/base_model/`: a small Llama (LlamaForCausalLM + byte-level BPE tokenizer) pretrained
  on a synthetic corpus (`synth.py`), loadable with the HF Auto classes;
- `assets/task/{train,validation,test}.jsonl`: the "largest" multiple-choice task;
- `tasks/`: its lm-eval YAML (`fp8lab_embedded`) and a template for other JSONL tasks.

`python -m workloads.embedded.build` regenerates the assets from a seed;
`python -m workloads.embedded.calibrate` measures how fast a BF16 LoRA learns the task.
Locate the folders with `workloads.eval.harness.embedded_paths()`.
"""
