# claude-proxy container: docker run --env-file .env.kimi -p 8082:8082 claude-proxy
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --upgrade pip \
    && /opt/venv/bin/pip install --no-cache-dir .

FROM python:3.11-slim
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOST=0.0.0.0 \
    PORT=8082 \
    LOG_FILE=/app/logs/claude-proxy.log
RUN useradd --create-home --uid 10001 proxy
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
RUN mkdir -p /app/logs && chown proxy:proxy /app/logs
USER proxy
EXPOSE 8082
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('PORT', '8082'), timeout=4)"
ENTRYPOINT ["claude-proxy"]
CMD ["serve"]
