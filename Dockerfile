# claude-proxy container: docker run --env-file .env.kimi -p 8082:8082 claude-proxy
# Build stage: a virtualenv with the proxy and its dependencies; nothing else leaves it.
FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt
# binutils' strip, for this stage only: the wheels' extension modules keep their debug symbols
# (uvloop's 13.6 MB are 2.2 MB stripped; 20 MB in all).
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
       binutils >/dev/null \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
# pip and setuptools are build tools: uninstalled once the proxy is in (no cache is kept).
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install '.[otel]' \
    && /opt/venv/bin/pip uninstall --yes pip setuptools \
    && find /opt/venv -name '*.so' -exec strip --strip-unneeded {} +

# Final stage: the base image, one unprivileged user and the virtualenv.
FROM python:3.11-slim
# Debian's base-passwd already has a user called `proxy` (uid 13): ours is claude-proxy, 10001.
RUN groupadd --gid 10001 claude-proxy \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /app --no-log-init \
       --shell /usr/sbin/nologin claude-proxy \
    && mkdir -p /app/logs && chown 10001:10001 /app/logs
COPY --from=build /opt/venv /opt/venv
# Logs go to stdout, where the engine keeps them; set LOG_FILE (e.g. /app/logs/claude-proxy.log
# on a volume) to also write a rotated file.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOST=0.0.0.0 \
    PORT=8082 \
    LOG_FILE=
WORKDIR /app
# Numeric, so that Kubernetes' runAsNonRoot can check it without reading /etc/passwd.
USER 10001:10001
EXPOSE 8082
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('PORT', '8082'), timeout=4)"]
ENTRYPOINT ["claude-proxy"]
CMD ["serve"]
