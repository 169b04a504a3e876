"""``localchat load``: many simulated users with multi-turn history against an OpenAI-compatible
server (``run``: the users; ``metrics``: per request and per run; ``sweep``: options, the server
and the runs; ``report``: tables and files)."""
