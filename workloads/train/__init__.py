"""The LoRA training loop (`loop`) and what it uses while it runs: checkpoints (`checkpoint`),
injected faults for the reliability tests (`faults`), and peak-memory measurement (`memory`)."""
