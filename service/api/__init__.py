"""The sidecar's HTTP surface: the OpenAI-compatible proxy, lifecycle routes, admin REST."""
