"""FAISS backends: Flat, IVF-Flat, IVF-SQ8 and HNSW, inner product on unit vectors."""

from rag.index.faiss.common import gpu_available
from rag.index.faiss.flat import FaissFlatIndex
from rag.index.faiss.hnsw import FaissHNSWIndex
from rag.index.faiss.ivf import FaissIVFIndex, FaissIVFSQ8Index

__all__ = ["FaissFlatIndex", "FaissHNSWIndex", "FaissIVFIndex", "FaissIVFSQ8Index", "gpu_available"]
