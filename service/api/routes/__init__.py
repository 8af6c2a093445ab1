"""The HTTP surface: the ASGI app, the lifecycle and admin routes, the schema, the server."""
