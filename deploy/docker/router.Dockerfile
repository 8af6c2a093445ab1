# vllm-router from the package index (a Rust binary in a manylinux wheel): the router between
# the Tenure sidecars and the vLLM engines (deploy/k8s/router.yaml, docker-compose.scaled.yml).
FROM python:3.11-slim
RUN pip install --no-cache-dir vllm-router==0.1.17
USER 10001
EXPOSE 8000
ENTRYPOINT ["vllm-router"]
