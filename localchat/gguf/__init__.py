"""Importing a GGUF file (llama.cpp, ollama, LM Studio) as an MLX model directory, without loss:
its tensors mapped to MLX's affine quantization, its tokenizer rebuilt, its template kept.
"""
