"""What a finished trial leaves behind for its user: the LoRA adapter, a merged BF16 model, and a
block-scaled FP8 checkpoint in the layout inference servers load.

`adapter` saves and reloads PEFT adapters; `fp8_block` writes (and independently reads back) the
FP8 checkpoint with the project's own block quantizer; `run` turns an MLflow trial run into one
of the three export formats. Torch lives here, never in `orchestrator`.
"""
