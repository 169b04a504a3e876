"""Answers that always parse: what an answer must be (``formats``: JSON against a schema, a regular
expression, one of some choices), that format as a grammar for a model's tokenizer (``compile``,
with llguidance), and the mask that lets only tokens keeping the answer a valid prefix through
while mlx_lm decodes (``mask``)."""
