"""What localchat keeps for the user: the home directory, its config file and saved sessions.
"""
