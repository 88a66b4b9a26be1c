"""Bad input gets a clear error and loses nothing (the state is unchanged after a refusal)."""

from __future__ import annotations

import pytest

from csr_ros.chunks import ChunkPolicy
from csr_ros.errors import (ChunkOrderError, ChunkTooLargeError, ConfigError, EmptyChunkError,
                            NonUtf8ChunkError, SpecialTokenInChunkError)
from csr_ros.layout import Layout
from csr_ros.state import Chunk, CsrState, Seq

LONG_TEXT = " ".join(f"obstacle{i} at bearing {i % 360} deg range {i * 0.37:.2f} m" for i in range(200))


def make_state(tokenizer, mode="token", **policy) -> CsrState:
    return CsrState(tokenizer, Layout.from_tokenizer(tokenizer), "profile", mode=mode,
                    policy=ChunkPolicy(**policy))


def test_an_empty_chunk_raises_and_appends_nothing(tokenizer):
    state = make_state(tokenizer)
    for empty in ["", "   ", "\n\t\n", b""]:
        with pytest.raises(EmptyChunkError, match="empty"):
            state.add(empty, source="x")
    assert state.chunks == [] and state.next_seq == 0 and state.n_static == len(state.prefix_ids)


def test_non_utf8_bytes_raise_with_the_offset_by_default(tokenizer):
    state = make_state(tokenizer)
    with pytest.raises(NonUtf8ChunkError, match=r"byte 4"):
        state.add(b"scan\xff\xfe ok", source="scan")
    assert state.chunks == []


def test_non_utf8_bytes_are_kept_with_replacement_characters_when_configured(tokenizer):
    state = make_state(tokenizer, invalid_utf8="replace")
    (chunk,) = state.add(b"scan\xff ok", source="scan")
    assert chunk.text == "scan\ufffd ok\n"


def test_text_with_a_lone_surrogate_raises_non_utf8_chunk_error_and_appends_nothing(tokenizer):
    state = make_state(tokenizer)
    with pytest.raises(NonUtf8ChunkError, match=r"character 6: a lone surrogate"):
        state.add("speech\udcff ok", source="speech")
    assert state.chunks == [] and state.next_seq == 0


def test_a_lone_surrogate_is_kept_as_a_replacement_character_when_configured(tokenizer):
    state = make_state(tokenizer, invalid_utf8="replace")
    (chunk,) = state.add("speech\udcff ok", source="speech")
    assert chunk.text == "speech\ufffd ok\n"


def test_valid_utf8_bytes_are_accepted(tokenizer):
    state = make_state(tokenizer)
    (chunk,) = state.add("über 😀".encode(), source="speech")
    assert chunk.text == "über 😀\n"


def test_an_oversized_chunk_is_split_into_pieces_that_each_fit_and_keep_every_word(tokenizer):
    state = make_state(tokenizer, max_chunk_tokens=64)
    chunks = state.add(LONG_TEXT, source="scan")
    assert len(chunks) > 1
    assert all(c.n_tokens <= 64 for c in chunks)
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert " ".join(c.text.strip() for c in chunks).split() == LONG_TEXT.split()


def test_a_long_word_without_spaces_is_still_split_to_fit(tokenizer):
    state = make_state(tokenizer, max_chunk_tokens=16)
    chunks = state.add("x" * 500, source="blob")
    assert all(c.n_tokens <= 16 for c in chunks)
    assert "".join(c.text.strip() for c in chunks) == "x" * 500


def test_an_oversized_chunk_is_truncated_with_a_marker_when_configured(tokenizer):
    state = make_state(tokenizer, max_chunk_tokens=64, oversize="truncate")
    (chunk,) = state.add(LONG_TEXT, source="scan")
    assert chunk.n_tokens <= 64
    assert "[truncated" in chunk.text and LONG_TEXT.startswith(chunk.text.split(" …[")[0])


def test_an_oversized_chunk_is_refused_when_configured(tokenizer):
    state = make_state(tokenizer, max_chunk_tokens=64, oversize="reject")
    with pytest.raises(ChunkTooLargeError, match="max_chunk_tokens=64"):
        state.add(LONG_TEXT, source="scan")
    assert state.chunks == []


def test_a_special_token_spelling_is_refused_in_text_mode_when_configured(tokenizer):
    state = make_state(tokenizer, mode="text", special_tokens="reject")
    with pytest.raises(SpecialTokenInChunkError, match="im_end"):
        state.add("say <|im_end|>", source="speech")
    assert state.chunks == []


def test_a_chunk_out_of_sequence_is_refused(tokenizer):
    state = make_state(tokenizer)
    state.add("first", source="a")
    stray = Chunk(seq=Seq(5), source="a", stamp_ns=0, text="late\n", token_ids=(1,))
    with pytest.raises(ChunkOrderError, match="expected 1"):
        state.append(stray)
    assert len(state.chunks) == 1


@pytest.mark.parametrize("bad", [dict(oversize="drop"), dict(invalid_utf8="ignore"),
                                 dict(special_tokens="allow"), dict(max_chunk_tokens=0)])
def test_a_bad_chunk_policy_is_a_config_error(bad):
    with pytest.raises(ConfigError):
        ChunkPolicy(**bad)


def test_an_unknown_mode_is_a_config_error(tokenizer):
    with pytest.raises(ConfigError, match="mode"):
        make_state(tokenizer, mode="json")


def test_eviction_derives_a_new_version_and_keeps_the_prefix(tokenizer):
    state = make_state(tokenizer)
    for i in range(6):
        state.add(f"event {i}", source="e")
    evicted = state.evicted(3)
    assert evicted.version == state.version + 1
    assert [c.seq for c in evicted.chunks] == [3, 4, 5]
    assert evicted.static_ids[: len(state.prefix_ids)] == list(state.prefix_ids)
    assert evicted.next_seq == state.next_seq
    assert len(state.chunks) == 6, "the source state is not mutated"
