"""Session lifecycle state in Redis: key builders, atomic scripts, the repository."""
