"""The hop to the engine: the upstream HTTP client and the relay of its answers."""
