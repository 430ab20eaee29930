# Image for the private-telemetry worker and producer services of docker-compose.yml.
# The project is installed with the same pins as a local setup (constraints.txt), without the test extra.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /app

# Dependencies first (cached layer while only the sources change), then the project itself.
COPY pyproject.toml constraints.txt README.md ./
COPY mechanisms ./mechanisms
COPY schemas ./schemas
COPY producers ./producers
COPY agents ./agents
COPY ptel ./ptel
RUN pip install . -c constraints.txt

# Collection specs used by the compose services (e.g. /app/examples/demo-spec.yaml).
COPY examples ./examples

# An unprivileged user (the worker's state lives in Kafka; the producer keeps its client secret in ~/.config/ptel).
RUN useradd --create-home --uid 10001 ptel && chown ptel /app
USER ptel

CMD ["ptel", "--help"]
