"""Command lines that measure attnlab (README.md: the groups and the old names)."""
