"""Tenure inside vLLM: the plugin, the policy over the decision core, the push-channel client.

Nothing is imported here: vLLM loads :mod:`tenure.engine_adapter.plugin` through its entry point,
and the rest lazily by name (see ``engine_adapter/README.md``).
"""

__all__: list[str] = []
