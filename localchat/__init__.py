"""localchat: multi-turn chat with local MLX models."""

__version__ = "0.1.0"
