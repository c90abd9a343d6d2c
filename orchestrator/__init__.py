"""fp8lab orchestrator: CLI, config validation, sweep matrix, Ray scheduling, MLflow runs.

This package never imports torch: it must start fast and run on a machine (or Ray head)
without the training stack's heavy imports.
"""
