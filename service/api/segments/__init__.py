"""Segments and spawns: reasoning and sub-agent segments of a session, split, placed and tracked."""
