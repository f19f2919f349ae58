# syntax=docker/dockerfile:1
# One image serves every role: api (`memstore serve`), worker (`memstore worker`), migrate
# (`memstore db upgrade`), encoder (`encoder`) and maintenance (`memstore-maint daemon`).
#
#   docker build -t memstore:latest .                                        # CUDA torch (GPU hosts; runs on CPU too)
#   docker build -t memstore:cpu --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu .
#
# The CPU variant takes torch from PyTorch's CPU-only wheel index: about 1 GB smaller.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_INDEX_URL=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/memstore
ENV PATH=/opt/memstore/bin:$PATH
WORKDIR /src
# Dependencies first, so code changes do not reinstall torch.
COPY pyproject.toml README.md ./
RUN if [ -n "$TORCH_INDEX_URL" ]; then \
        pip install --index-url "$TORCH_INDEX_URL" torch==2.14.1 torchvision==0.29.1; \
    fi \
 && for d in memstore memstore/api memstore/api/routes memstore/commands memstore/compact memstore/services memstore/ui memstore/ui/static memstore/ui/templates \
             sql migrations migrations/versions encoder encoder/model_configs maintenance; do \
        mkdir -p "$d" && touch "$d/__init__.py"; \
    done \
 && pip install . \
 && pip uninstall -y memstore
COPY memstore memstore
COPY encoder encoder
COPY maintenance maintenance
COPY sql sql
COPY migrations migrations
# The stubs' __init__.py files in data folders (migrations/versions, encoder/model_configs, the web
# pages' static files and templates) go with the reinstall: only what the COPY brought is installed.
# The Python client (memstore ingest talks to the API through it): httpx, pydantic, tenacity and tqdm,
# all already installed with memstore.
COPY client client
RUN find migrations/versions encoder/model_configs memstore/ui/static memstore/ui/templates -name __init__.py -size 0 -delete \
 && pip install --no-deps . && pip install ./client && python -m compileall -q /opt/memstore

FROM ${PYTHON_IMAGE} AS runtime
# libgomp for torch's CPU kernels; tini reaps children and forwards SIGTERM for a clean stop;
# Tesseract with its English data reads the text in images (collections with OCR on).
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 tini tesseract-ocr tesseract-ocr-eng \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --create-home --home-dir /home/memstore memstore \
 && mkdir -p /var/lib/memstore /var/cache/huggingface \
 && chown memstore:memstore /var/lib/memstore /var/cache/huggingface
COPY --from=build /opt/memstore /opt/memstore
ENV PATH=/opt/memstore/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    MEMSTORE_DATA_DIR=/var/lib/memstore \
    HF_HOME=/var/cache/huggingface \
    HF_HUB_OFFLINE=1
USER memstore
WORKDIR /home/memstore
EXPOSE 8000 8001
ENTRYPOINT ["tini", "--"]
CMD ["memstore", "serve", "--host", "0.0.0.0"]
