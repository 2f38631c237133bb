# Prefect 3 server (API + UI) at the version harnessrl pins, talking to Postgres through asyncpg.
# Build:  docker build -f infra/images/prefect-server.Dockerfile -t harnessrl-prefect-server infra/images
FROM python:3.11-slim-bookworm
RUN python -m pip install --no-cache-dir "prefect==3.9.1" "asyncpg==0.32.0"
ENV PREFECT_SERVER_ANALYTICS_ENABLED=false
EXPOSE 4200
CMD ["prefect", "server", "start", "--host", "0.0.0.0", "--port", "4200"]
