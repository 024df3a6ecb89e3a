# syntax=docker/dockerfile:1
# deviceplugin image: the node daemon (`deviceplugin run`) and the scheduler extender
# (`deviceplugin extender`). Runtime dependencies are pinned in deploy/requirements.txt.
#
#   docker build -t ghcr.io/volcano-gpu/deviceplugin:0.1.0 .

# ---- builder: the project wheel plus a wheel for every pinned dependency -------------------
FROM python:3.11-slim AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY deploy/requirements.txt /wheels/requirements.txt
RUN pip wheel --wheel-dir /wheels --requirement /wheels/requirements.txt
COPY pyproject.toml README.md ./
COPY deviceplugin ./deviceplugin
# --no-deps: dependencies come only from the pinned list above
RUN pip wheel --no-deps --wheel-dir /wheels .

# ---- runtime -------------------------------------------------------------------------------
FROM python:3.11-slim
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_DRIVER_CAPABILITIES=utility
# Install from the builder's wheels only (no index); the wheels stay out of the image layers.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels --requirement /wheels/requirements.txt \
 && pip install --no-index --no-deps /wheels/deviceplugin-*.whl \
 && deviceplugin --help > /dev/null
# Non-root by default (the extender runs as this user). The node daemon needs kubelet's
# root-owned device-plugin directory: daemonset.yaml sets runAsUser: 0 and drops every
# capability (docs/deploy.md).
USER 65532:65532
ENTRYPOINT ["deviceplugin"]
CMD ["run"]
