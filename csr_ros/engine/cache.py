"""The engine's execution state on the device: preallocated K/V buffers plus linear-attention state.

Attention layers write K/V by position into buffers allocated once at `max_len` and return views
of the valid prefix, so a forward never concatenates the history and rolling back is moving one
length pointer. Linear-attention (hybrid) layers keep transformers' own fixed-size conv and
recurrent states; those are small and are copied by capsules.

    keys, values: [1, H_kv, max_len, D] per attention layer; valid prefix [:, :, :length]
    conv state:   [1, C, kernel]          per linear-attention layer (transformers' layout)
    recurrent:    [1, H_v, D_k, D_v]      per linear-attention layer
"""

from __future__ import annotations

import bisect

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, LinearAttentionLayer

from csr_ros.errors import ConfigError

SUPPORTED_LAYER_TYPES = ("full_attention", "linear_attention")


class _Cursor:
    """The one position pointer every attention layer of a cache shares."""

    __slots__ = ("length",)

    def __init__(self) -> None:
        self.length = 0


class KVBufferLayer(CacheLayerMixin):
    """K/V of one attention layer in preallocated buffers, written at the shared cursor."""

    is_sliding = False
    is_compileable = False
    is_croppable = True

    def __init__(self, cursor: _Cursor, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self._cursor = cursor
        self.keys = keys                   # [1, H_kv, max_len, D]
        self.values = values
        self.max_len = keys.shape[2]
        self.device = keys.device
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:
        raise AssertionError("KV buffers are allocated up front, never lazily")

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        start = self._cursor.length
        end = start + key_states.shape[2]
        assert end <= self.max_len, f"K/V write to {end} past the buffer length {self.max_len}"
        self.keys[:, :, start:end].copy_(key_states)
        self.values[:, :, start:end].copy_(value_states)
        # Views of the valid prefix: attention cost follows the real length, nothing is copied.
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._cursor.length + query_length, 0

    def get_seq_length(self) -> int:
        return self._cursor.length

    def get_max_length(self) -> int:
        return self.max_len

    def crop(self, tokens_to_remove: int) -> None:
        raise AssertionError("move the cursor with BufferCache.truncate, not per layer")

    def reset(self) -> None:
        raise AssertionError("reset the cursor with BufferCache.reset, not per layer")


class OverwriteLog:
    """Where already-written K/V positions were written again, for cheap staleness checks.

    A capsule taken when the log stood at `seq` with `n` tokens is still valid iff no later
    overwrite started below `n`. The log keeps only the suffix minima: a stack of (seq, pos)
    with both increasing, so `min_since` is a binary search and the stack stays short.
    """

    def __init__(self) -> None:
        self.seq = 0
        self._stack: list[tuple[int, int]] = []

    def record(self, pos: int) -> None:
        self.seq += 1
        while self._stack and self._stack[-1][1] >= pos:
            self._stack.pop()
        self._stack.append((self.seq, pos))

    def min_since(self, seq: int) -> int | None:
        """The lowest position overwritten after `seq`, or None."""
        i = bisect.bisect_right(self._stack, (seq, float("inf")))
        return self._stack[i][1] if i < len(self._stack) else None


class BufferCache(Cache):
    """A transformers `Cache` over preallocated buffers; one per engine, batch size 1."""

    def __init__(self, config, *, max_len: int, dtype: torch.dtype, device: torch.device):
        layer_types = list(getattr(config, "layer_types", None)
                           or ["full_attention"] * config.num_hidden_layers)
        unsupported = sorted(set(layer_types) - set(SUPPORTED_LAYER_TYPES))
        if unsupported:
            msg = (f"layer types {unsupported} are not supported by the local engine "
                   f"(supported: {list(SUPPORTED_LAYER_TYPES)})")
            raise ConfigError(msg)
        self.cursor = _Cursor()
        n_kv = config.num_key_value_heads
        head_dim = (getattr(config, "head_dim", None)
                    or config.hidden_size // config.num_attention_heads)
        layers: list = []
        for kind in layer_types:
            if kind == "full_attention":
                keys = torch.zeros((1, n_kv, max_len, head_dim), dtype=dtype, device=device)
                layers.append(KVBufferLayer(self.cursor, keys, torch.zeros_like(keys)))
            else:
                layers.append(LinearAttentionLayer())
        super().__init__(layers=layers)
        self.layer_types = tuple(layer_types)
        self.max_len = max_len
        self.dtype = dtype
        self.device = device
        self.overwrites = OverwriteLog()
        self.high_water = 0            # furthest position ever written

    # -- position ---------------------------------------------------------------------------

    @property
    def length(self) -> int:
        return self.cursor.length

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.cursor.length

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return self.cursor.length

    def begin_write(self, n_tokens: int) -> None:
        """Called before a forward of `n_tokens`: logs overwrites of existing history."""
        start = self.cursor.length
        assert start + n_tokens <= self.max_len, f"{start}+{n_tokens} exceeds {self.max_len}"
        if start < self.high_water:
            self.overwrites.record(start)
        self.high_water = max(self.high_water, start + n_tokens)

    def advance(self, n_tokens: int) -> None:
        """Called after a forward: the `n_tokens` just written are now part of the state."""
        self.cursor.length += n_tokens

    def truncate(self, length: int) -> None:
        """Move the attention length pointer back (O(1)). Linear-attention state is NOT touched:
        on hybrid models restore a capsule instead."""
        assert 0 <= length <= self.cursor.length, f"cannot cut {self.cursor.length} to {length}"
        self.cursor.length = length

    def reset(self) -> None:
        self.cursor.length = 0
        for layer in self.linear_layers():
            for i in range(layer.number_of_states):
                layer.has_previous_state[i] = False

    # -- layers -----------------------------------------------------------------------------

    def attention_layers(self) -> list[tuple[int, KVBufferLayer]]:
        return [(i, layer) for i, layer in enumerate(self.layers)
                if isinstance(layer, KVBufferLayer)]

    def linear_layers(self) -> list[LinearAttentionLayer]:
        return [layer for layer in self.layers if isinstance(layer, LinearAttentionLayer)]

    @property
    def has_linear_layers(self) -> bool:
        return any(isinstance(layer, LinearAttentionLayer) for layer in self.layers)

    # -- linear-attention state: copied by capsules -------------------------------------------

    def linear_state(self) -> dict[str, torch.Tensor]:
        """Copies of every conv/recurrent state that holds history; keys name layer and slot."""
        state: dict[str, torch.Tensor] = {}
        for idx, layer in enumerate(self.layers):
            if not isinstance(layer, LinearAttentionLayer):
                continue
            for s in range(layer.number_of_states):
                if not layer.has_previous_state[s]:
                    continue
                if layer.is_conv_states_initialized[s]:
                    state[f"conv.{idx}.{s}"] = layer.conv_states[s].clone()
                if layer.is_recurrent_states_initialized[s]:
                    state[f"recurrent.{idx}.{s}"] = layer.recurrent_states[s].clone()
        return state

    def set_linear_state(self, state: dict[str, torch.Tensor]) -> None:
        """Put linear-attention state back exactly as `linear_state()` returned it."""
        for idx, layer in enumerate(self.layers):
            if not isinstance(layer, LinearAttentionLayer):
                continue
            for s in range(layer.number_of_states):
                conv = state.get(f"conv.{idx}.{s}")
                recurrent = state.get(f"recurrent.{idx}.{s}")
                layer.has_previous_state[s] = conv is not None or recurrent is not None
                if conv is not None:
                    _put(layer.conv_states, layer.is_conv_states_initialized, s, conv, self.device)
                    layer.conv_kernel_size[s] = conv.shape[-1]
                    layer.dtype, layer.device = conv.dtype, conv.device
                if recurrent is not None:
                    _put(layer.recurrent_states, layer.is_recurrent_states_initialized, s,
                         recurrent, self.device)


def _put(slots: dict, initialized: dict, s: int, value: torch.Tensor, device) -> None:
    # Copy in place where the tensor exists: its address stays stable (marked static upstream).
    if initialized[s] and slots[s] is not None and slots[s].shape == value.shape:
        slots[s].copy_(value)
    else:
        slots[s] = value.to(device=device, copy=True)
        initialized[s] = True
