"""Evaluation with lm-eval: running the tasks on the in-memory model (`harness`), which metric
of each task counts and how per-item results are read (`metrics`), and the checks of the eval
section before training (`checks`)."""
