"""A real language model split by layers: SmolLM2-135M from GGUF, in numpy."""
