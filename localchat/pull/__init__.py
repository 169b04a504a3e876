"""Getting a model from the Hugging Face Hub: the plan before a byte moves, the download in a
process of its own, its progress."""
