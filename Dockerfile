# Minimal CPU image serving on port 9000; the multi-stage cpu/gpu targets, non-root user and health check come with the
# deployment issue. The default voice is compiled at build time so the container serves at once.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir . && ttsvc compile --checkpoint default --output-dir /app/engines
ENV TTSVC_ENGINES_DIR=/app/engines
EXPOSE 9000
ENTRYPOINT ["ttsvc"]
CMD ["serve"]
