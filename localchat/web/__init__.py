"""The chat page ``serve`` answers ``/`` with: the same conversations as the terminal's, through the
same turn code, kept in the same log (docs/web.md)."""
