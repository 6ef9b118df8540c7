# A Weir node: `docker build -t weir .`; configured by WEIR_* variables.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app

# Dependencies first, so source edits reuse this layer.
COPY requirements.lock ./
RUN pip install --no-cache-dir -r requirements.lock

COPY pyproject.toml README.md ./
COPY services ./services
COPY streams ./streams
COPY bench ./bench
RUN pip install --no-cache-dir --no-deps . \
    && useradd --system --create-home weir \
    && mkdir -p /var/lib/weir && chown weir /var/lib/weir
USER weir

EXPOSE 1883 8083 18083
CMD ["weir", "up"]
