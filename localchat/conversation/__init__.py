"""A conversation and its turns: the one history builder, the turn, its clock and figures,
JSON answer mode and turn records. Nothing here prints.
"""
