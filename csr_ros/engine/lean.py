"""A lean llama forward over transformers' own weights, writing into the engine's K/V buffers.

Llama and Qwen2 run it: a Qwen2 layer is a llama layer with q/k/v biases (any projection's bias
is added after its matmul, fused like its weight).

transformers runs a general forward: per layer it builds masks, dispatches through attention
interfaces and cache objects, and issues three projections for q/k/v and two for gate/up. At
batch 1 on a CPU every op costs a dispatch and, with several threads, a synchronization of the
threads. This module runs the same math with
the few tensor ops a llama layer needs (fused q/k/v and gate/up matmuls, a precomputed rotary
table, grouped-query attention reading the K/V buffers in place), and nothing else:

    embed → per layer [rmsnorm → qkv → rope → write K/V → attention → o
                       → rmsnorm → gate/up → down]
          → rmsnorm (last position only) → lm_head

The last layer writes every row's K/V but runs attention and MLP only for the rows that reach
lm_head (one for a prefill block or a query: 1/30 of its attention and MLP on SmolLM2).

Weights stay transformers' tensors for float formats (fused copies replace the separate ones, the
transformers modules see views of them, so memory is not doubled and `model` stays the reference).
Decode steps may run weight-only quantized copies kept next to the float model:

    "float"  fp32/bf16/fp16 matmuls (oneDNN/MKL)
    "int8"   per-output-channel symmetric int8, bf16 activations (torch._weight_int8pack_mm)
    "int4"   groups of 32 along the input, asymmetric (scale and zero per group: the layout of the
             GGUF Q4_1 the embedded model ships in), bf16 activations
             (torch._weight_int4pack_mm_for_cpu)
    "fp16"   half-precision copies, float32 activations and accumulation (fbgemm's fp16 GEMM,
             x86 with AVX2 and F16C: `fp16_available`): half the bytes a float32 decode step
             reads, for CPUs without native bf16

Transformers' forward stays available (`forward="transformers"`) and is what hybrid and other
architectures run.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from csr_ros.errors import ConfigError

WEIGHT_FORMATS = ("float", "int8", "int4", "fp16")
INT4_GROUP_SIZE = 32
# Blocks of at most this many decode tokens (a sampled token and the tokens a grammar forces
# after it) may run the decode weights: the weight-only kernels stay faster than float matmuls
# up to about 4 rows (1.1 to 1.6x at 4, even at 8, 2x slower at 32, measured on 1 and 2 threads).
STEP_MAX_TOKENS = 4
# A weight-only decode step's attention is split over the threads from this many cached keys on,
# in parts of at least SPLIT_MIN_PART_KEYS (`decode_kv_parts`).
SPLIT_MIN_KEYS = 2048
SPLIT_MIN_PART_KEYS = 1024


def unsupported_reason(model) -> str | None:
    """Why the lean forward cannot run `model` (None when it can)."""
    config = model.config
    if getattr(config, "model_type", None) not in ("llama", "qwen2"):
        return f"model_type {getattr(config, 'model_type', None)!r} is not 'llama' or 'qwen2'"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp != 1"
    layer_types = getattr(config, "layer_types", None)
    if layer_types and set(layer_types) != {"full_attention"}:
        return f"layer types {sorted(set(layer_types))}"
    inner = getattr(model, "model", None)
    if inner is None or not all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm",
                                                              "rotary_emb")):
        return "not a LlamaForCausalLM module layout"
    if getattr(model.get_output_embeddings(), "bias", None) is not None:
        return "a biased output head"
    return None


class _Linear:
    """y = x @ W.T (+ b) for one (possibly fused) weight in one format; x is [q, in]."""

    __slots__ = ("op", "args", "bias")

    def __init__(self, weight: torch.Tensor, fmt: str, dtype: torch.dtype,
                 bias: torch.Tensor | None = None):
        self.bias = None
        if fmt == "float":
            # A module's own Parameter is kept as is: it follows the model's later `.to(dtype)`.
            self.op, self.args = F.linear, (weight, bias)
            return
        elif fmt == "int8":
            w = weight.float()
            scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
            q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
            self.op, self.args = torch._weight_int8pack_mm, (q, scale.to(dtype))
        elif fmt == "int4":
            self.op, self.args = _int4_mm, _pack_int4(weight.float(), INT4_GROUP_SIZE)
        elif fmt == "fp16":
            packed = torch.ops.quantized.linear_prepack_fp16(weight.float().contiguous(), None)
            self.op, self.args = torch.ops.quantized.linear_dynamic_fp16, (packed,)
        else:
            raise ConfigError(f"weight format must be one of {WEIGHT_FORMATS}, got {fmt!r}")
        self.bias = None if bias is None else bias.to(dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.op(x, *self.args)
        return y if self.bias is None else y + self.bias


def fp16_available() -> bool:
    """fbgemm's fp16-weight GEMM is in this torch build (x86 builds; not on ARM)."""
    return "fbgemm" in torch.backends.quantized.supported_engines


def _int4_mm(x: torch.Tensor, packed: torch.Tensor, group_size: int,
             scales_and_zeros: torch.Tensor) -> torch.Tensor:
    return torch._weight_int4pack_mm_for_cpu(x, packed, group_size, scales_and_zeros)


def _pack_int4(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, int, torch.Tensor]:
    """Asymmetric min/max quantization per group: w ≈ (q - 8) * scale + zero, q in 0..15."""
    out_features, in_features = w.shape
    if in_features % group_size:
        raise ConfigError(f"int4 needs input sizes divisible by {group_size}, got {in_features}")
    groups = w.reshape(out_features, in_features // group_size, group_size)
    low, high = groups.amin(dim=2), groups.amax(dim=2)
    scale = ((high - low) / 15.0).clamp(min=1e-12)
    q = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15)
    q = q.reshape(out_features, in_features).to(torch.int32).contiguous()
    zero = low + 8.0 * scale
    packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
    scales_and_zeros = torch.stack([scale.t(), zero.t()], dim=-1).to(torch.bfloat16).contiguous()
    return packed, group_size, scales_and_zeros


class _Layer:
    __slots__ = ("ln1", "ln2", "block", "step")


class LeanLlama:
    """The llama forward over `model`'s weights, writing K/V into a `BufferCache` (batch 1).

    Blocks of several tokens (prefill, a query's dynamic part) are compute-bound and run the
    float weights in `dtype`. Single-token steps (decoding) are bound by reading the weights, so
    they run `step_weights` ("float", or a weight-only "int8"/"int4" copy with bf16 activations).
    Build it on the model before casting the model to `dtype`: quantized copies are then made
    from the loaded (fp32) weights, and the float matmuls follow the model's own parameters.
    """

    def __init__(self, model, *, max_len: int, device: torch.device, dtype: torch.dtype,
                 step_weights: str = "float"):
        reason = unsupported_reason(model)
        if reason is not None:
            raise ConfigError(f"the lean forward does not run this model: {reason}")
        if step_weights not in WEIGHT_FORMATS:
            msg = f"weight format must be one of {WEIGHT_FORMATS}, got {step_weights!r}"
            raise ConfigError(msg)
        if step_weights in ("int8", "int4") and (dtype != torch.bfloat16 or device.type != "cpu"):
            msg = (f"{step_weights} decode weights run on CPU with bfloat16 activations, not "
                   f"{dtype} on {device}")
            raise ConfigError(msg)
        if step_weights == "fp16" and (dtype != torch.float32 or device.type != "cpu"
                                       or not fp16_available()):
            msg = (f"fp16 decode weights run on an x86 CPU (fbgemm) with float32 activations, "
                   f"not {dtype} on {device}"
                   + ("" if fp16_available() else " (fbgemm is not in this torch build)"))
            raise ConfigError(msg)
        config, inner = model.config, model.model
        self.step_weights, self.dtype = step_weights, dtype
        self.n_heads = config.num_attention_heads
        self.n_kv = config.num_key_value_heads
        self.head_dim = (getattr(config, "head_dim", None)
                         or config.hidden_size // config.num_attention_heads)
        self.groups = self.n_heads // self.n_kv
        self.eps = float(config.rms_norm_eps)
        self.scale = self.head_dim ** -0.5
        self.embed = inner.embed_tokens.weight
        self.norm = inner.norm.weight
        with torch.inference_mode():
            # transformers' own rotary module gives the table, so positions match it exactly.
            positions = torch.arange(max_len, device=device)[None]
            probe = torch.empty((), dtype=dtype, device=device)
            cos, sin = inner.rotary_emb(probe, positions)
            # The rotation's sign lives in the sine table: rotate_half(x) * sin equals
            # roll(x, D/2) * [-sin_1, sin_2] bit for bit, in two ops fewer per layer.
            half = self.head_dim // 2
            sin = torch.cat((-sin[0, :, :half], sin[0, :, half:]), dim=-1)
            self.cos, self.sin = cos[0].contiguous(), sin.contiguous()      # [max_len, D]
            self.layers = []
            for block in inner.layers:
                attn, mlp = block.self_attn, block.mlp
                parts = ([attn.q_proj, attn.k_proj, attn.v_proj], [attn.o_proj],
                         [mlp.gate_proj, mlp.up_proj], [mlp.down_proj])
                layer = _Layer()
                layer.ln1 = block.input_layernorm.weight
                layer.ln2 = block.post_attention_layernorm.weight
                if step_weights != "float":      # from the weights as loaded, before any cast
                    layer.step = tuple(_Linear(_cat(p), step_weights, dtype, _cat_bias(p))
                                       for p in parts)
                layer.block = tuple(_Linear(w, "float", dtype, b)
                                    for w, b in (self._fused(p) for p in parts))
                if step_weights == "float":
                    layer.step = layer.block
                self.layers.append(layer)
            head = model.get_output_embeddings().weight
            # The output head decides the token: it gets at least int8 (in the embedded GGUF it
            # is the Q8_0 token embedding, which int4 would coarsen).
            head_format = "int8" if step_weights == "int4" else step_weights
            self.head_step = (_Linear(head.float(), head_format, dtype)
                              if step_weights != "float" else None)
            self.head_block = _Linear(head, "float", dtype)
            self.head_step = self.head_step or self.head_block

    def _fused(self, modules: list) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One weight (and bias) for several projections; the modules keep views of them."""
        if len(modules) == 1:
            return modules[0].weight, modules[0].bias
        fused = _cat(modules).to(self.dtype).contiguous()
        bias = _cat_bias(modules)
        bias = None if bias is None else bias.to(self.dtype).contiguous()
        start = 0
        for m in modules:
            rows = m.weight.shape[0]
            m.weight.data = fused[start:start + rows]
            if m.bias is not None:
                m.bias.data = bias[start:start + rows]
            start += rows
        return fused, bias

    @staticmethod
    def buffers(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, (keys, values) views [H_kv, max_len, D] of `cache`'s buffers."""
        return [(layer.keys[0], layer.values[0]) for _, layer in cache.attention_layers()]

    def forward(self, input_ids: torch.Tensor, buffers: list, pos: int, *,
                step: bool | None = None, positions: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, n_logits: int = 1) -> torch.Tensor:
        """Run `input_ids` ([q] long) into buffer slots pos..pos+q, writing their K/V into
        `buffers` (see `buffers()`); the logits after the last `n_logits` of them, [V] (or
        [n_logits, V] when n_logits > 1) in the compute dtype.

        `step`: run the decode weights (`step_weights`); default: for a single token.
        `positions` ([q] long, rotary positions; default pos..pos+q) and `mask` ([q, pos+q] bool,
        True where a token may attend; default causal) let a token tree share the slots.
        """
        q = input_ids.shape[0]
        end = pos + q
        step = q == 1 if step is None else step
        one = q == 1 and mask is None
        x = F.embedding(input_ids, self.embed).to(self.dtype)              # [q, hidden]
        if positions is None:
            cos, sin = self.cos[pos:end], self.sin[pos:end]                 # [q, D]
        else:
            cos, sin = self.cos[positions], self.sin[positions]
        half = self.head_dim // 2
        n_qk = self.n_heads + self.n_kv
        causal, tree_mask = False, mask
        if not one and mask is None:
            if pos == 0:
                causal = True      # nothing cached: SDPA's top-left causal mask is the right one
            else:
                mask = _causal_mask(pos, end, x.device)                        # [q, end]
        last = len(self.layers) - 1
        # The exact float path keeps SDPA's own summation order (the engine tests' reference).
        kv_parts = (decode_kv_parts(self.n_kv, torch.get_num_threads(), end)
                    if step and self.step_weights != "float" else 1)
        for i, (layer, (keys_buf, values_buf)) in enumerate(zip(self.layers, buffers)):
            qkv, o, gate_up, down = layer.step if step else layer.block
            h = _rms_norm(x, layer.ln1, self.eps)
            qkvh = qkv(h)
            # Rotary embedding of the query and key heads together: [H + H_kv, q, D].
            qk = qkvh[:, :n_qk * self.head_dim].view(q, n_qk, self.head_dim).transpose(0, 1)
            qk = qk * cos + qk.roll(half, -1) * sin
            qh, kh = qk[:self.n_heads], qk[self.n_heads:]                    # [H, q, D], [H_kv..]
            vh = qkvh[:, n_qk * self.head_dim:].view(q, self.n_kv, self.head_dim)
            keys_buf[:, pos:end].copy_(kh)
            values_buf[:, pos:end].copy_(vh.transpose(0, 1))
            keys, values = keys_buf[None, :, :end], values_buf[None, :, :end]
            rows, layer_mask, layer_causal = q, mask, causal
            if i == last and n_logits < q:
                # Only the last n_logits rows reach the output head: the other rows' K/V are
                # written above, and their attention and MLP in this layer would go unused.
                rows, x, qh = n_logits, x[-n_logits:], qh[:, -n_logits:]
                layer_mask, layer_causal = _tail_mask(tree_mask, n_logits, end, x.device), False
            if rows == 1 and layer_mask is None:
                # One query row that sees every cached position: the query heads of a K/V group
                # become that group's "queries", so K/V are read once and never repeated.
                grouped = qh.reshape(self.n_kv, self.groups, self.head_dim)
                if kv_parts > 1:
                    out = split_attention(grouped, keys_buf, values_buf, end, kv_parts,
                                          self.scale)
                else:
                    out = F.scaled_dot_product_attention(grouped[None], keys, values,
                                                         scale=self.scale)
                out = out.reshape(1, self.n_heads * self.head_dim)
            else:
                out = F.scaled_dot_product_attention(qh[None], keys, values, attn_mask=layer_mask,
                                                     is_causal=layer_causal, scale=self.scale,
                                                     enable_gqa=True)
                out = out[0].transpose(0, 1).reshape(rows, self.n_heads * self.head_dim)
            x = x + o(out)
            h = _rms_norm(x, layer.ln2, self.eps)
            gate, up = gate_up(h).chunk(2, dim=-1)
            x = x + down(F.silu(gate) * up)
        hidden = _rms_norm(x[-n_logits:], self.norm, self.eps)
        logits = (self.head_step if step else self.head_block)(hidden)
        return logits[0] if n_logits == 1 else logits


def decode_kv_parts(n_kv: int, threads: int, n_keys: int) -> int:
    """Parts a decode step's attention over `n_keys` cached keys is split into (1: none).

    SDPA's CPU kernel shares its work out per (K/V head, query block): a decode step has n_kv of
    them (3 on SmolLM2), so of 2 threads one does 2 and the other 1, idle a third of the time.
    Splitting the keys into parts that make n_kv * parts a multiple of the threads keeps every
    thread busy (`split_attention`). Worth it over long histories only (measured on 2 threads,
    30 layers, K/V beyond the CPU caches: 0.9x at 1024 keys, level at 2048, 1.15x at 4096, 1.2x
    at 8000), so from SPLIT_MIN_KEYS on, in parts of at least SPLIT_MIN_PART_KEYS.
    """
    if threads < 2 or n_keys < SPLIT_MIN_KEYS:
        return 1
    parts = next(p for p in range(1, threads + 1) if n_kv * p % threads == 0)
    return max(1, min(parts, n_keys // SPLIT_MIN_PART_KEYS))


def split_attention(grouped: torch.Tensor, keys_buf: torch.Tensor, values_buf: torch.Tensor,
                    end: int, parts: int, scale: float) -> torch.Tensor:
    """One decode row's attention over keys 0..end, in `parts` equal slices of the buffers
    (strided views, no copy) and a short tail, merged by their log-sum-exp (flash decoding).

    `grouped`: [n_kv, groups, D] (the query heads of each K/V head); `keys_buf`, `values_buf`:
    [n_kv, max_len, D]. Returns [n_kv, groups, D], SDPA's result up to rounding.
    """
    n_kv, groups, head_dim = grouped.shape
    part = end // parts
    shape = (n_kv, parts, part, head_dim)
    keys, values = (buf.as_strided(shape, (buf.stride(0), part * buf.stride(1), buf.stride(1),
                                           buf.stride(2))) for buf in (keys_buf, values_buf))
    queries = grouped[:, None].expand(n_kv, parts, groups, head_dim)
    # The CPU flash kernel returns each slice's log-sum-exp next to its output.
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    out, lse = flash(queries, keys, values, scale=scale)[:2]        # [n_kv, S, G, D], [.., G]
    if parts * part < end:
        tail_out, tail_lse = flash(grouped[:, None], keys_buf[:, None, parts * part:end],
                                   values_buf[:, None, parts * part:end], scale=scale)[:2]
        out, lse = torch.cat((out, tail_out), 1), torch.cat((lse, tail_lse), 1)
    weights = torch.softmax(lse.float(), dim=1)                      # [n_kv, S, G]
    return (out.float() * weights[..., None]).sum(1).to(grouped.dtype)


def _cat(modules: list) -> torch.Tensor:
    return torch.cat([m.weight for m in modules], dim=0)


def _cat_bias(modules: list) -> torch.Tensor | None:
    """The modules' biases end to end (zeros for one without), or None when none has one."""
    if all(m.bias is None for m in modules):
        return None
    return torch.cat([m.weight.new_zeros(m.weight.shape[0]) if m.bias is None else m.bias
                      for m in modules], dim=0)


def _tail_mask(tree_mask: torch.Tensor | None, n_rows: int, end: int,
               device: torch.device) -> torch.Tensor | None:
    """The mask of the last `n_rows` query rows of a block that ends at key `end`: those rows of
    a given (tree) mask, else causal rows (none for one row: the last row sees every key)."""
    if tree_mask is not None:
        return tree_mask[-n_rows:]
    if n_rows == 1:
        return None
    return _causal_mask(end - n_rows, end, device)


def _causal_mask(start: int, end: int, device: torch.device) -> torch.Tensor:
    """[end - start, end] bool: query row i (at position start + i) sees keys 0..start + i."""
    rows = torch.arange(start, end, device=device)[:, None]
    return torch.arange(end, device=device)[None, :] <= rows


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # transformers' LlamaRMSNorm: statistics in fp32, scale in the input dtype.
    # In place where the op makes its own tensor (fewer allocations in a decode step); the
    # values are those of `x32 * rsqrt(x32.pow(2).mean(-1) + eps)`, bit for bit.
    x32 = x.float()
    inv = x32.square().mean(-1, keepdim=True).add_(eps).rsqrt_()
    x32 = x32 * inv if x32 is x else x32.mul_(inv)      # never write into the caller's x
    return weight * x32.to(x.dtype)
