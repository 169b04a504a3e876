"""The gateway: the Anthropic Messages and OpenAI Responses APIs in front of an OpenAI-compatible
server (``mlx_lm.server``), for the agents and SDKs that speak only those.

Data flows one way, as in ``chat``: a request is read and checked (``anthropic_api``,
``responses_api``) into a ``GatewayRequest`` (chat messages, as the history builder's order makes
them); ``upstream`` sends it through the server backend, the one client path, and its typed events
are timed on the one clock; each API's reply shape turns them into its own JSON or event stream
(``app``). Nothing here imports the CLI.
"""
