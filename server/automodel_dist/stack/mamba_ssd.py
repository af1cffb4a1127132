"""A stand-in for mamba_ssm's fused Mamba-2 training kernel (``mamba_ssm.ops.triton.ssd_combined.
mamba_split_conv1d_scan_combined``) and its gated RMSNorm (``mamba_ssm.ops.triton.layernorm_gated.rmsnorm_fn``), so
AutoModel's Nemotron-H (``nemotron_v3``) Mamba-2 mixers hold on fake CPU tensors what they hold on a GPU. Those mixers
import both inside their forward; mamba_ssm (AutoModel's ``cuda`` extra) needs Triton on CUDA and causal_conv1d's CUDA
extension. Only the dry run's worker imports this module: the values it returns are not the scan's.

Memory model (mamba_ssm 2.3.2 ``MambaSplitConv1dScanCombinedFn`` with causal_conv1d 1.7.0, as AutoModel's training
path calls it: no initial state, no non-SSM part; the gated RMSNorm and out_proj fused, or, under context parallelism,
the gate applied by the scan and both left to the caller). b sequences of
s tokens; h heads of p, g groups of state n, ``dim = h p``, ``conv = dim + 2 g n``, chunks of c tokens (N = s / c),
``zxbcdt`` [b, s, 2 dim + 2 g n + h] in_proj's output:

  forward:   the conv output [b, s, conv]; the chunk cumsums dt and dA [b, h, N, c] fp32; the chunk states
             [b, N, h, p, n] fp32, passed along the chunks into a copy in the input's dtype with fp32 final states
             [b, h, p n]; C^T B per chunk [b, N, g, c, c] fp32; the scan's output [b, s, h, p]; the norm's output
             [b s, dim] and its fp32 rstd [g b s]; out_proj's output.
  saved:     zxbcdt, the scan's output and rstd (with the weights and ``seq_idx``).
  unfused:   the scan returns its gated output and keeps the ungated one [b, s, h, p]; no norm, no out_proj, no
             recomputed output; backward adds the scan's output gradient before the gate [b, s, h, p].
  backward:  the norm's output recomputed [b, s, dim]; the conv output recomputed; dzxbcdt like zxbcdt and dxBC
             [b, s, conv]; the incoming gradient through out_proj [b, s, dim]; the norm's backward (dx like its input,
             fp32 weight partials per row group); the scan's backward: dt cloned, the chunk cumsums, C^T B, the fp32
             states and their passed copy, the fp32 state gradients and their bf16 copies with the states', the
             fp32 dt/dA gradients per chunk, dB and dC [b, s, splits, g, n] fp32, d(C^T B) [b, N, splits, g, c, c]
             fp32, the stable ddA workspace [b, h, N, c / 16, c] fp32; out_proj's weight gradient; the conv's fp32
             weight and bias gradients.

Where zxbcdt's width is not a multiple of 8, ensure_stride's copy of xBC lives while each conv call runs. Workspaces
that scale with neither the tokens nor the chunks (per head, per SM) are left out. ``splits`` follows the
kernels' own rule from the GPU's SM count (``SM_COUNT``: an H100's 132).
(mamba_ssm/ops/triton/ssd_combined.py, ssd_chunk_state.py, ssd_state_passing.py, ssd_bmm.py, ssd_chunk_scan.py,
layernorm_gated.py; causal_conv1d/cpp_functions.py)
"""

from __future__ import annotations

import importlib.util
import math
import sys
import types
from typing import Any

import torch

from .stand_in import install_modules

SM_COUNT = 132  # an H100 SXM's streaming multiprocessors: the kernels size their split reductions by it
F32 = torch.float32
on_call: Any = None  # called at each fused-kernel call (the dry run's shim counts the mixers that ran it)


def _splits(batch: int, nchunks: int, nheads: int, ngroups: int) -> int:
    """``nsplits`` of mamba_ssm's dB / dC / dCB kernels (_chunk_state_bwd_db, _chunk_scan_bwd_dC,
    _chunk_scan_bwd_dcb)."""
    ratio = nheads // ngroups
    per_program = max(min(math.ceil(batch * nchunks * nheads / SM_COUNT), ratio), 1)
    return -(-ratio // per_program)


def _norm_row_groups(group_size: int, ngroups: int) -> int:
    """Rows of fp32 weight partials in layernorm_gated's backward (``nrow_groups``)."""
    block_n = 1 << max(group_size - 1, 0).bit_length()
    num_warps = min(max(block_n // 256, 1), 8)
    return math.ceil(SM_COUNT * math.ceil(4 / num_warps) / ngroups)


class _Dims:
    def __init__(
        self, zxbcdt: torch.Tensor, conv_weight: torch.Tensor, nheads: int, headdim: int, ngroups: int, c: int
    ):
        self.b, self.s, width = zxbcdt.shape
        self.h, self.p, self.g = nheads, headdim, ngroups
        self.dim = nheads * headdim
        self.conv = conv_weight.shape[0]
        self.n = (self.conv - self.dim) // ngroups // 2
        if width != 2 * self.dim + 2 * ngroups * self.n + nheads:
            raise NotImplementedError(
                "the dry run's mamba_ssm stand-in takes zxbcdt without a non-SSM part (AutoModel's Nemotron-H mixer): "
                f"width {width} for dim {self.dim}, {ngroups} groups of state {self.n} and {nheads} heads"
            )
        self.c = c
        self.nc = -(-self.s // c)
        self.device, self.dtype = zxbcdt.device, zxbcdt.dtype
        self.aligned = width % 8 == 0  # ensure_stride copies xBC for causal_conv1d where its row stride is not

    @classmethod
    def of_scan(cls, x: torch.Tensor, b_in: torch.Tensor, c: int) -> _Dims:
        """The dims of mamba_chunk_scan_combined's call: x [b, s, h, p], B [b, s, g, n]."""
        d = cls.__new__(cls)
        d.b, d.s, d.h, d.p = x.shape
        d.g, d.n = b_in.shape[2], b_in.shape[3]
        d.dim = d.h * d.p
        d.conv = d.dim + 2 * d.g * d.n
        d.c, d.nc = c, -(-d.s // c)
        d.device, d.dtype = x.device, x.dtype
        d.aligned = True
        return d

    def conv_input(self) -> torch.Tensor | None:
        """ensure_stride's copy of xBC, alive while causal_conv1d runs on it (None: no copy)."""
        return None if self.aligned else self.empty(self.b, self.s, self.conv, dtype=self.dtype)

    def empty(self, *shape: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=self.device)

    def per_chunk(self) -> torch.Tensor:  # [b, h, N, c] fp32: dt, dA cumsums and their gradients
        return self.empty(self.b, self.h, self.nc, self.c, dtype=F32)

    def states(self, dtype: torch.dtype) -> torch.Tensor:  # [b, N, h, p, n]
        return self.empty(self.b, self.nc, self.h, self.p, self.n, dtype=dtype)

    def cb(self) -> torch.Tensor:  # [b, N, g, c, c] fp32
        return self.empty(self.b, self.nc, self.g, self.c, self.c, dtype=F32)


def _scan_forward(d: _Dims, dt_: torch.dtype, *, gated: bool) -> tuple[torch.Tensor, ...]:
    """_mamba_chunk_scan_combined_fwd's allocations (the scan's forward, fused or not): the chunk cumsums, the fp32
    chunk states (released once passed), the passed states in the input's dtype with the fp32 final states, C^T B
    (local to it) and the output, with ``gated`` the ungated output too. Returns what lives past it: dt_out, the dA
    cumsum, the passed states, the final states, the output and the ungated output (the output itself without a
    gate)."""
    dt_out, da_cumsum = d.per_chunk(), d.per_chunk()  # _chunk_cumsum_fwd
    states = d.states(F32)  # _chunk_state_fwd, states_in_fp32
    passed, final = d.states(dt_), d.empty(d.b, d.h, d.p, d.n, dtype=F32)  # _state_passing_fwd(out_dtype=C's)
    del states
    cb = d.cb()  # _bmm_chunk_fwd(output_dtype=fp32)
    out = d.empty(d.b, d.s, d.h, d.p, dtype=dt_)  # _chunk_scan_fwd; with z also the ungated out_x
    out_x = d.empty(d.b, d.s, d.h, d.p, dtype=dt_) if gated else out
    del cb  # local to _mamba_chunk_scan_combined_fwd
    return dt_out, da_cumsum, passed, final, out, out_x


def _scan_backward(
    d: _Dims, dt_: torch.dtype, A: torch.Tensor, dt_bias: torch.Tensor | None, D: torch.Tensor | None, *, gated: bool
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """_mamba_chunk_scan_combined_bwd's working set (the scan's backward, fused or not): the chunk cumsums, C^T B and
    the states recomputed, the state gradients, and the split fp32 buffers for dB, dC and d(C^T B); ``gated``: the
    gate's output gradient too. Returns dA, ddt_bias and dD (fp32)."""
    # _mamba_chunk_scan_combined_bwd: every local below lives until it returns
    dt_in = d.empty(d.b, d.s, d.h, dtype=dt_)  # dt.clone()
    da_cumsum, dt_out = d.per_chunk(), d.per_chunk()  # _chunk_cumsum_fwd
    cb = d.cb()  # _bmm_chunk_fwd
    states = d.states(F32)  # _chunk_state_fwd
    passed, final = d.states(F32), d.empty(d.b, d.h, d.p * d.n, dtype=F32)  # _state_passing_fwd, no out_dtype
    del states
    dout_x = d.empty(d.b, d.s, d.h, d.p, dtype=dt_) if gated else None  # _chunk_scan_bwd_dz (dz given)
    dstates = d.states(F32)  # _chunk_scan_bwd_dstates(dtype=states.dtype)
    # _state_passing_bwd: the state gradients and the states converted to x's dtype, its fp32 workspace per
    # 64-block of p * n; the fp32 states and state gradients are released when their names are rebound
    dstates_x, states_x = d.states(dt_), d.states(dt_)
    dda_chunk = d.empty(d.b, d.h, d.nc, -(-(d.p * d.n) // 64), dtype=F32)
    del dstates, passed
    ddt = d.per_chunk()  # _chunk_scan_chunk_state_bwd_dx (dx written into dxBC)
    splits = _splits(d.b, d.nc, d.h, d.g)
    # dB, dC and d(C^T B): the fp32 ddA tile workspace, then the split fp32 buffers summed, written into dB / dC
    # given (views of dxBC) with residuals
    dda_next = d.per_chunk()  # _chunk_state_bwd_db
    db = d.empty(d.b, d.s, splits, d.g, d.n, dtype=F32).sum(2)
    dda_cumsum_prev = d.per_chunk()  # _chunk_scan_bwd_dC
    dc = d.empty(d.b, d.s, splits, d.g, d.n, dtype=F32).sum(2)
    dcb = d.empty(d.b, d.nc, splits, d.g, d.c, d.c, dtype=F32).sum(2)  # _chunk_scan_bwd_dcb
    dda_prev = dda_cumsum_prev.flip([-1]).cumsum(dim=-1).flip([-1])
    dda = d.empty(d.b, d.h, d.nc, -(-d.c // 32), d.c, dtype=F32).sum(3)  # _chunk_scan_bwd_ddAcs_stable
    dda += dda_next + dda_prev
    dA = torch.empty_like(A, dtype=F32)  # _chunk_cumsum_bwd (ddt into dzxbcdt)
    ddt_bias = torch.empty_like(dt_bias, dtype=F32) if dt_bias is not None else None
    dD = torch.empty_like(D, dtype=F32) if D is not None else None
    del db, dda_next, dc, dda_cumsum_prev, dcb, dda_prev, dda, ddt, states_x, dstates_x, dda_chunk, cb
    del dt_out, da_cumsum, dt_in, final, dout_x
    return dA, ddt_bias, dD


class _SplitConv1dScan(torch.autograd.Function):
    """Shapes and memory of mamba_ssm's MambaSplitConv1dScanCombinedFn (module docstring); values are not the scan's.
    ``norm``: the gated RMSNorm inside the kernel (AutoModel's path without CP), else the gate ``z`` applied by the
    scan; ``fused``: out_proj inside the kernel (AutoModel's path without CP, and transformers' Falcon-H1 mixer
    without its cache, with or without its norm), else the raw output returned (AutoModel's CP path, whose norm and
    out_proj run outside)."""

    @staticmethod
    def forward(
        ctx: Any,
        zxbcdt: torch.Tensor,
        conv_weight: torch.Tensor,
        conv_bias: torch.Tensor | None,
        dt_bias: torch.Tensor,
        A: torch.Tensor,
        D: torch.Tensor,
        seq_idx: torch.Tensor | None,
        rmsnorm_weight: torch.Tensor | None,
        outproj_weight: torch.Tensor | None,
        outproj_bias: torch.Tensor | None,
        meta: tuple[int, int, int, int],
    ) -> torch.Tensor:
        nheads, headdim, ngroups, chunk = meta
        norm, fused = rmsnorm_weight is not None, outproj_weight is not None
        d = _Dims(zxbcdt, conv_weight, nheads, headdim, ngroups, chunk)
        dt_ = zxbcdt.dtype
        copy = d.conv_input()
        xbc_conv = d.empty(d.b, d.s, d.conv, dtype=dt_)  # causal_conv1d_fwd_function: empty_like(xBC)
        del copy
        dt_out, da_cumsum, passed, final, out, out_x = _scan_forward(d, dt_, gated=not norm)
        rstd = None
        if norm:
            normed = d.empty(d.b * d.s, d.dim, dtype=dt_)  # _layer_norm_fwd: empty_like(x)
            rstd = d.empty(d.g * d.b * d.s, dtype=F32)
            y = torch.nn.functional.linear(normed.view(d.b, d.s, d.dim), outproj_weight, outproj_bias)
            del normed
        elif fused:  # the scan's gated output straight into out_proj
            y = torch.nn.functional.linear(out.view(d.b, d.s, d.dim), outproj_weight, outproj_bias)
        else:
            y = out.view(d.b, d.s, d.dim)
        del xbc_conv, dt_out, da_cumsum, passed, final, out
        ctx.save_for_backward(
            zxbcdt, conv_weight, conv_bias, out_x, A, D, dt_bias, seq_idx, rmsnorm_weight, rstd, outproj_weight
        )
        ctx.meta, ctx.has_outproj_bias = meta, outproj_bias is not None
        return y

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        zxbcdt, conv_weight, conv_bias, out_x, A, D, dt_bias, _, rmsnorm_weight, _, outproj_weight = ctx.saved_tensors
        nheads, headdim, ngroups, chunk = ctx.meta
        norm, fused = rmsnorm_weight is not None, outproj_weight is not None
        d = _Dims(zxbcdt, conv_weight, nheads, headdim, ngroups, chunk)
        dt_ = zxbcdt.dtype
        out_recompute = d.empty(d.b, d.s, d.dim, dtype=dt_) if fused else None  # recompute_output
        copy = d.conv_input()
        xbc_conv = d.empty(d.b, d.s, d.conv, dtype=dt_)  # the conv recomputed
        del copy
        dzxbcdt = torch.empty_like(zxbcdt)
        dxbc = d.empty(d.b, d.s, d.conv, dtype=dt_)  # empty_like(xBC), a strided view: dense
        dy = dnorm = drmsnorm_weight = None
        if fused:
            dy = torch.nn.functional.linear(dout, outproj_weight.t())  # lives to the end (dy_rms is a view of it)
        if norm:
            # _layer_norm_bwd: dx like its input, dz and the output recomputed into the buffers given, fp32 partials
            dnorm = d.empty(d.b * d.s, d.dim, dtype=dt_)
            dw_partial = d.empty(_norm_row_groups(d.dim // d.g, d.g), d.dim, dtype=F32)
            drmsnorm_weight = dw_partial.sum(0).to(rmsnorm_weight.dtype)
            del dw_partial
        dA, ddt_bias, dD = _scan_backward(d, dt_, A, dt_bias, D, gated=not norm)
        doutproj_weight = doutproj_bias = None
        if fused:
            doutproj_weight = torch.empty_like(outproj_weight)  # einsum("bso,bsd->od", dout, out_recompute)
            doutproj_bias = dout.sum(dim=(0, 1)) if ctx.has_outproj_bias else None
        del out_recompute, xbc_conv, dy, dnorm
        # causal_conv1d_bwd_function: dx into dxBC's part of dzxbcdt; fp32 weight and bias gradients, cast
        copies = (d.conv_input(), d.conv_input())  # ensure_stride on xBC and on dxBC's part of dzxbcdt
        dweight = torch.zeros_like(conv_weight, dtype=F32).type_as(conv_weight)
        dbias = None if conv_bias is None else torch.zeros_like(conv_bias, dtype=F32).type_as(conv_bias)
        del dxbc, copies
        return (dzxbcdt, dweight, dbias, ddt_bias, dA, dD, None, drmsnorm_weight, doutproj_weight, doutproj_bias, None)


def mamba_split_conv1d_scan_combined(
    zxbcdt: torch.Tensor,
    conv1d_weight: torch.Tensor,
    conv1d_bias: torch.Tensor | None,
    dt_bias: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor,
    chunk_size: int,
    initial_states: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    return_final_states: bool = False,
    activation: str = "silu",
    rmsnorm_weight: torch.Tensor | None = None,
    rmsnorm_eps: float = 1e-6,
    outproj_weight: torch.Tensor | None = None,
    outproj_bias: torch.Tensor | None = None,
    headdim: int | None = None,
    ngroups: int = 1,
    norm_before_gate: bool = True,
) -> torch.Tensor:
    """mamba_ssm's signature: the gated RMSNorm and out_proj fused (AutoModel's path without CP), out_proj alone
    (transformers' Falcon-H1 mixer without its cache and gated norm) or neither (AutoModel's CP path)."""
    if initial_states is not None or return_final_states:
        raise NotImplementedError("the dry run's mamba_ssm stand-in runs training steps only (no recurrent state)")
    if rmsnorm_weight is not None and outproj_weight is None:
        raise NotImplementedError(
            "the dry run's mamba_ssm stand-in fuses the gated RMSNorm only with out_proj (as AutoModel's Nemotron-H "
            "and transformers' Falcon-H1 mixers call it)"
        )
    if D.dim() != 1 or headdim is None:
        raise NotImplementedError("the dry run's mamba_ssm stand-in takes per-head D with headdim given")
    meta = (D.shape[0], int(headdim), int(ngroups), int(chunk_size))
    if on_call is not None:
        on_call()
    return _SplitConv1dScan.apply(
        zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, seq_idx, rmsnorm_weight, outproj_weight, outproj_bias, meta
    )


class _ChunkScan(torch.autograd.Function):
    """Shapes and memory of mamba_ssm's MambaChunkScanCombinedFn (the scan alone: transformers' Mamba-2 mixers call it
    with their cache on, the conv and the gated norm around it their own): the chunk cumsums, states, C^T B and the
    output in forward; the output (the ungated one with ``z``), x, dt, its fp32 dA cumsum, B, C and the small
    parameters saved; the fp32 final states returned with ``return_final_states``. Values are not the scan's."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        dt: torch.Tensor,
        A: torch.Tensor,
        b_in: torch.Tensor,
        c_in: torch.Tensor,
        D: torch.Tensor | None,
        z: torch.Tensor | None,
        dt_bias: torch.Tensor | None,
        chunk: int,
        return_final_states: bool,
    ) -> Any:
        d = _Dims.of_scan(x, b_in, chunk)
        dt_out, da_cumsum, passed, final, out, out_x = _scan_forward(d, x.dtype, gated=z is not None)
        del dt_out, passed
        ctx.save_for_backward(out_x, x, dt, da_cumsum, A, b_in, c_in, D, z, dt_bias)
        ctx.chunk, ctx.return_final_states = chunk, return_final_states
        return (out, final) if return_final_states else out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor, *dfinal: Any) -> tuple[Any, ...]:
        _, x, dt, _, A, b_in, c_in, D, z, dt_bias = ctx.saved_tensors
        d = _Dims.of_scan(x, b_in, ctx.chunk)
        # _mamba_chunk_scan_combined_bwd's outputs, allocated first (empty_like each input)
        dx, ddt, db, dc = torch.empty_like(x), torch.empty_like(dt), torch.empty_like(b_in), torch.empty_like(c_in)
        dz = torch.empty_like(z) if z is not None else None
        dA, ddt_bias, dD = _scan_backward(d, x.dtype, A, dt_bias, D, gated=z is not None)
        return dx, ddt, dA, db, dc, dD, dz, ddt_bias, None, None


def mamba_chunk_scan_combined(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    return_final_states: bool = False,
    return_varlen_states: bool = False,
) -> Any:
    """mamba_ssm's signature (a training step: no initial or varlen states)."""
    if initial_states is not None or return_varlen_states:
        raise NotImplementedError("the dry run's mamba_ssm chunk-scan stand-in runs training steps only")
    if D is not None and D.dim() != 1:
        raise NotImplementedError("the dry run's mamba_ssm chunk-scan stand-in takes per-head D")
    if on_call is not None:
        on_call()
    return _ChunkScan.apply(x, dt, A, B, C, D, z, dt_bias, int(chunk_size), bool(return_final_states))


class _CausalConv1d(torch.autograd.Function):
    """causal_conv1d 1.7.0's CausalConv1dFn (cpp_functions.py): x made contiguous unless one of its last two dims is,
    the output like x, x and the weights saved; backward: dx like x, fp32 weight and bias gradients, cast."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if x.stride(2) != 1 and x.stride(1) != 1:
            x = x.contiguous()
        out = torch.empty_like(x)
        ctx.save_for_backward(x, weight, bias)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        x, weight, bias = ctx.saved_tensors
        if dout.stride(2) != 1 and dout.stride(1) != 1:
            dout = dout.contiguous()
        dx = torch.empty_like(x)
        dweight = torch.zeros_like(weight, dtype=F32).type_as(weight)
        dbias = torch.zeros_like(bias, dtype=F32).type_as(bias) if bias is not None else None
        return dx, dweight, dbias


def causal_conv1d_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    return_final_states: bool = False,
    final_states_out: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor:
    """causal_conv1d's signature (a training step: no initial or final states)."""
    if initial_states is not None or return_final_states:
        raise NotImplementedError("the dry run's causal_conv1d stand-in runs training steps only")
    return _CausalConv1d.apply(x, weight, bias)


class _GatedRMSNorm(torch.autograd.Function):
    """layernorm_gated's LayerNormFn as rmsnorm_fn calls it: output like x, fp32 rstd per row and group saved."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, z: torch.Tensor | None, ngroups: int) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        y = torch.empty_like(x)
        rstd = torch.empty(ngroups * rows, dtype=F32, device=x.device)
        ctx.save_for_backward(x, weight, z, rstd)
        ctx.ngroups = ngroups
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        x, weight, z, rstd = ctx.saved_tensors
        dx = torch.empty_like(x)
        dz = torch.empty_like(z) if z is not None else None
        partial = torch.empty(
            (_norm_row_groups(x.shape[-1] // ctx.ngroups, ctx.ngroups), x.shape[-1]), dtype=F32, device=x.device
        )
        dw = partial.sum(0).to(weight.dtype)
        return dx, dw, dz, None


def rmsnorm_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    z: torch.Tensor | None = None,
    eps: float = 1e-6,
    group_size: int | None = None,
    norm_before_gate: bool = True,
) -> torch.Tensor:
    """layernorm_gated.rmsnorm_fn's signature (no bias: AutoModel's Nemotron-H norm passes none)."""
    if bias is not None:
        raise NotImplementedError("the dry run's gated RMSNorm stand-in takes no bias")
    ngroups = 1 if group_size is None else x.shape[-1] // group_size
    return _GatedRMSNorm.apply(x, weight, z, ngroups)


def _inference_only(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError("the dry run's mamba_ssm stand-in has no inference (prefill / decode) kernels")


def install(*, causal_conv1d: bool = False) -> dict[str, types.ModuleType]:
    """Put the stand-in where AutoModel's ``from mamba_ssm.ops.triton... import ...`` finds it; nothing where the
    real mamba_ssm is installed. ``causal_conv1d``: causal_conv1d's stand-in too (transformers' Mamba-2 mixers with
    their cache on run it; AutoModel's own mixers import it only in inference paths, so it stays absent for them)."""
    if "mamba_ssm" in sys.modules or importlib.util.find_spec("mamba_ssm") is not None:
        return {}
    tree: dict[str, dict[str, Any]] = {
        "mamba_ssm": {"__version__": "2.3.2", "_stand_in": True},
        "mamba_ssm.ops": {},
        "mamba_ssm.ops.triton": {},
        "mamba_ssm.ops.triton.ssd_combined": {
            "mamba_split_conv1d_scan_combined": mamba_split_conv1d_scan_combined,
            "mamba_chunk_scan_combined": mamba_chunk_scan_combined,
        },
        "mamba_ssm.ops.triton.layernorm_gated": {"rmsnorm_fn": rmsnorm_fn},
        "mamba_ssm.ops.triton.selective_state_update": {"selective_state_update": _inference_only},
    }
    if causal_conv1d and "causal_conv1d" not in sys.modules and importlib.util.find_spec("causal_conv1d") is None:
        tree["causal_conv1d"] = {
            "__version__": "1.7.0",
            "_stand_in": True,
            "causal_conv1d_fn": causal_conv1d_fn,
            "causal_conv1d_update": _inference_only,
        }
    return install_modules(tree)


__all__ = ["causal_conv1d_fn", "install", "mamba_chunk_scan_combined", "mamba_split_conv1d_scan_combined", "rmsnorm_fn"]
