"""Running mlx_lm.server: launching it as a child, knowing when it is ready, and checking it
(smoke test; parity of in-process and server replies).
"""
