"""``localchat bench``: scripted conversations (``scripts/*.yaml``, shipped in the package) played
through arms of history on/off; the runner returns data, the report renders it.
"""
