"""The base model: loading it with the Hugging Face loaders and attaching PEFT LoRA (`loading`),
inspecting a model folder before training (`checks`), and whether a trial fits the device
(`sizing`)."""
