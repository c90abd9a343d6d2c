"""What runs inside one fp8lab trial: model and data loading, precision policies and FP8
backends, the LoRA training loop, telemetry and lm-eval evaluation.

Never imports orchestrator: a trial gets a plain resolved config dict and an MLflow run id.
"""
