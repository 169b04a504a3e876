"""The demo model's trainer (not shipped in the wheel): corpus, tokenizer, planted circuit,
training, evaluation and model card. Run it with ``uv run python -m demo.train --out DIR``.
"""
