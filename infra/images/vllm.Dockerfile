# vLLM's OpenAI-compatible server for policy.engine: openai on a GPU host (CUDA 12.x driver).
# Build:  docker build -f infra/images/vllm.Dockerfile -t harnessrl-vllm infra/images
FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/vllm && /opt/vllm/bin/pip install --no-cache-dir "vllm==0.32.0"
ENV PATH=/opt/vllm/bin:$PATH
EXPOSE 8000
# The model and flags come from compose.yaml's command (see infra/compose.yaml).
ENTRYPOINT ["vllm", "serve"]
