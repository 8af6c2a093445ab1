# vLLM (GPU) with the Tenure engine adapter installed as a vLLM plugin.
#   docker build -f deploy/docker/vllm.Dockerfile -t tenure/vllm .
# The `vllm.general_plugins` entry point registers `"spec_name": "TenureOffloadingSpec"` and
# `"eviction_policy": "tenure"` in every vLLM process; no module paths are needed in
# --kv-transfer-config.
ARG VLLM_VERSION=v0.32.0
FROM vllm/vllm-openai:${VLLM_VERSION}
WORKDIR /opt/tenure
COPY pyproject.toml README.md ./
# tenure/ holds the import root: relative symlinks to the four folders below.
COPY tenure ./tenure
COPY service ./service
COPY engine_adapter ./engine_adapter
COPY clients ./clients
COPY benchmarks ./benchmarks
# --no-deps: vLLM's image already carries what the adapter imports (msgspec, pyzmq: the
# `engine` extra), and the sidecar's web stack must not replace vLLM's pinned versions.
RUN pip install --no-cache-dir --no-deps . \
 && python -c "from importlib.metadata import entry_points; assert any(e.name == 'tenure' for e in entry_points(group='vllm.general_plugins'))"
WORKDIR /
ENTRYPOINT ["vllm", "serve"]
