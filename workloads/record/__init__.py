"""Recording a trial in MLflow: the buffered logger that writes into the run the orchestrator
created (`logger`) and the run's dataset inputs (`run_inputs`)."""
