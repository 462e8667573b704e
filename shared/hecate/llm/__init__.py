"""A real language model split by layers, from its GGUF: ONNX Runtime on the file's own
quantised blocks (:mod:`hecate.llm.onnx_stage`), with the numpy float32 model
(:mod:`hecate.llm.llama`) as the reference it is tested against."""
