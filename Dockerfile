# HECATE: one image, every service. `docker run IMAGE <service> --nats URL [options]`,
# e.g. `docker run hecate:local node --id gpu --capacity-layers 12`.
# Configuration is by environment: HECATE_NATS (default NATS URL of every command),
# HECATE_LOG_LEVEL, OTEL_EXPORTER_OTLP_ENDPOINT (spans over OTLP/HTTP when set).
# Everything is installed at build time; the container fetches nothing at runtime.

# --- build: install the project and its dependencies into a self-contained venv --------
FROM python:3.11-slim AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
RUN python -m venv /opt/hecate \
    && /opt/hecate/bin/pip install .

# --- runtime: the venv, the example topology, a non-root user ---------------------------
FROM python:3.11-slim

ENV PATH=/opt/hecate/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HECATE_LOG_LEVEL=INFO

RUN groupadd --system --gid 10001 hecate \
    && useradd --system --uid 10001 --gid hecate --home-dir /app --no-create-home \
       --shell /usr/sbin/nologin hecate

COPY --from=build /opt/hecate /opt/hecate
COPY --chown=10001:10001 examples /app/examples
# The gateway's API keys file lives here (a volume in docker-compose, a Secret in
# Kubernetes); owned by the service user, so a fresh named volume is too.
RUN mkdir -p /var/lib/hecate && chown 10001:10001 /var/lib/hecate

WORKDIR /app
# Numeric, so Kubernetes can verify runAsNonRoot.
USER 10001:10001

ENTRYPOINT ["hecate"]
CMD ["--help"]
