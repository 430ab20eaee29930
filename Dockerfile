# Image of every private-telemetry service of docker-compose.yml and deploy/: `ptel worker`, `monitor`, `gateway`,
# `produce`, `releases` (one image, the command chooses). The project is installed with the same pins as a local
# setup (constraints.txt), without the test extra.
#
# tests/unit/test_container_image.py rebuilds this image's file set without Docker: it copies exactly the COPY
# sources below into an empty directory, installs them into a fresh virtualenv and runs `ptel --help` and every
# sub-command's `--help` there, so a package missing here or from pyproject.toml's package list fails the tests.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /app

# Dependencies first (cached layer while only the sources change), then the project itself: every top-level
# package of pyproject.toml's [tool.setuptools.packages.find] include list.
COPY pyproject.toml constraints.txt README.md ./
COPY mechanisms ./mechanisms
COPY schemas ./schemas
COPY kafka_settings ./kafka_settings
COPY producers ./producers
COPY workloads ./workloads
COPY gateway ./gateway
COPY agents ./agents
COPY ptel ./ptel
RUN pip install . -c constraints.txt && rm -rf build *.egg-info

# Collection specs used by the compose services (e.g. /app/examples/demo-spec.yaml).
COPY examples ./examples

# An unprivileged user (the worker's state lives in Kafka; the producer keeps its client secret in ~/.config/ptel).
# /var/lib/ptel (ptel's, mode 0700): where a volume keeps the workers' privacy-ledger key when no secret store
# provides it (docker-compose.yml: PTEL_LEDGER_KEY_FILE=/var/lib/ptel/ledger.key; a new named volume takes this
# directory's owner and mode).
RUN useradd --create-home --uid 10001 ptel && chown ptel /app && install -d -o ptel -g ptel -m 0700 /var/lib/ptel
USER ptel

# Liveness of the service the container runs: its /healthz (the worker's --metrics-port 9108 by default; the compose
# file and deploy/ set PTEL_HEALTHCHECK_URL for the monitor, 6066, and the gateway, 8088). One-shot commands
# (`ptel produce`, `releases`) have no server: run them with --no-healthcheck (compose: `healthcheck: disable`).
ENV PTEL_HEALTHCHECK_URL=http://127.0.0.1:9108/healthz
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=6 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['PTEL_HEALTHCHECK_URL'], timeout=3)"]

CMD ["ptel", "--help"]
