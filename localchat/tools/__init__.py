"""Tools, the fourth role: the user's Python functions offered to the model (``schema``), run in a
process of their own (``worker``, ``host``), each call checked, approved and answered (``runner``).
The turn's rounds of calls and results are the conversation's (``conversation.tool_rounds``)."""
