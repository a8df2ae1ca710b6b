"""Chunked HGRN: ``chunk_hgrn``, a parallel scan over time, forward and backward in Triton.

    h_t = e^{g_t} ⊙ h_{t-1} + x_t,    o_t = h_t            x, g: [B, T, D]; state [N, D]

Time is cut into chunks of ``BT = 64`` tokens; every pass below runs all chunks (or all
sequences) of all channel blocks at once. Forward, two launches:

1. ``_summary``: per (chunk, channel block), the chunk's scan from a zero state
   (``kernels.hgrn.scan``), reduced to the affine map it applies to the state entering
   it, ``h_out = A h_in + B``: ``A`` the product of the chunk's decays, ``B`` its last
   value. fp32, one row per chunk slot (``kernels._sequence.state_slots``). The last
   program of a (sequence, channel block) to store its map (an atomic count) then scans
   the sequence's maps, ``NC`` chunks a step (one step for T <= 4096), from the initial
   state: the state entering every chunk, and the final state, and sets the count back
   to zero (so the forward's counters serve its backward: one fill, a launch, fewer). One
   program does each sequence's scan in a fixed order, so the result does not depend on
   which finished last; folding it into this launch saves a launch's host time (15-30 us each, and
   this op's forward+backward is host-bound: ``kernels/README.md``).
2. ``_output``: per (chunk, channel block), the chunk's scan from its entering state,
   written as ``o``.

Backward, the same two passes run from each sequence's end (``REVERSE``): the maps
carry ``e^{g} dh`` of a chunk's first token back to the chunk before it, starting from
the final state's gradient, and end at the initial state's gradient; the last pass
writes ``dx = dh`` and ``dg = dh e^{g} h_{t-1}`` with ``h_{t-1}`` read from the saved
output. Every grid is one axis of (chunks or sequences) x channel blocks; offsets are
64-bit (int64 token indices times D). A sequence of no tokens has no chunk program: its
final state (gradient) is its initial state (``_sequences_without_chunks``).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .. import _arch, _utils
from .. import _library as library
from .._arch import COMPILE_OPTIONS
from .._chunk import chunk_coords, chunk_span
from .._sequence import empty_sequences, state_slots
from .inputs import check_hgrn_inputs, configs
from .scan import affine_scan, backward_chunk, backward_tile, channel_block, forward_chunk, forward_tile, last_row

OP = "chunk_hgrn"
BT = 64  # chunk length


@triton.jit
def _chunk_of_program(cu_seqlens, chunk_map, T, D, BT: tl.constexpr, BD: tl.constexpr, IS_VARLEN: tl.constexpr):
    """This program's chunk and channel block: sequence, first token, rows, slot, first channel."""
    ND = tl.cdiv(D, BD)
    pid = tl.program_id(0).to(tl.int64)
    i_n, t0, eos, slot = chunk_coords(pid // ND, cu_seqlens, chunk_map, T, BT, IS_VARLEN)
    return i_n, t0, tl.minimum(eos - t0, BT).to(tl.int32), slot, (pid % ND) * BD


@triton.jit
def _scan_chunk_maps(A, B, carry_in, init, final, i_n, slot0, n, cols, m_d, D, NC: tl.constexpr, BD: tl.constexpr,
                     REVERSE: tl.constexpr, USE_INIT: tl.constexpr, STORE_FINAL: tl.constexpr):
    """Scan sequence ``i_n``'s ``n`` chunk maps in order (REVERSE: last chunk first), ``NC``
    at a time, writing the state entering each chunk and the final one. The maps were
    stored by other programs: read past L1 (``.cg``), which may hold none of them."""
    carry = tl.zeros([BD], dtype=tl.float32)
    if USE_INIT:
        carry += tl.load(init + i_n * D + cols, mask=m_d, other=0.0).to(tl.float32)
    i = tl.arange(0, NC)
    for c0 in range(0, n, NC):
        c = c0 + i  # position in scan order
        chunk = n - 1 - c if REVERSE else c
        step = -1 if REVERSE else 1
        mask = (c < n)[:, None] & m_d[None, :]
        rows = (slot0 + chunk)[:, None] * D + cols[None, :]
        a = tl.load(A + rows, mask=mask, other=1.0, cache_modifier=".cg")
        b = tl.load(B + rows, mask=mask, other=0.0, cache_modifier=".cg")
        tl.store(carry_in + rows, tl.broadcast_to(carry[None, :], (NC, BD)), mask=mask & (i[:, None] == 0))
        b = tl.where(i[:, None] == 0, b + a * carry[None, :], b)
        _, h = affine_scan(a, b, NC, BD)
        # each chunk's outgoing state enters the next chunk in scan order
        tl.store(carry_in + rows + step * D, h, mask=mask & (c + 1 < n)[:, None])
        carry = last_row(h, NC)
    if STORE_FINAL:
        tl.store(final + i_n * D + cols, carry.to(final.dtype.element_ty), mask=m_d)


@triton.jit
def _maps(maps, slots, D):
    """The three ``[slots, D]`` planes of ``maps`` (``_Layout.maps``): A, B, the entering states."""
    plane = tl.cast(slots, tl.int64) * D
    return maps, maps + plane, maps + 2 * plane


@triton.jit
def _summary(xs, g, maps, slots, init, final, done, cu_seqlens, chunk_map, T, D, BT: tl.constexpr,
             NC: tl.constexpr, BD: tl.constexpr, REVERSE: tl.constexpr, USE_INIT: tl.constexpr,
             STORE_FINAL: tl.constexpr, IS_VARLEN: tl.constexpr):
    """The chunk's map ``state_out = A state_in + B`` (forward: xs = x; REVERSE: xs = do);
    the sequence's last program to finish its map scans them all (``_scan_chunk_maps``)."""
    A, B, carry_in = _maps(maps, slots, D)
    i_n, t0, n_rows, slot, d0 = _chunk_of_program(cu_seqlens, chunk_map, T, D, BT, BD, IS_VARLEN)
    cols, m_d = channel_block(d0, D, BD)
    zero = tl.zeros([BD], dtype=tl.float32)
    if REVERSE:
        decay, value, _, _ = backward_tile(xs, g, t0, n_rows, d0, D, zero, BT, BD)
        # the map ends at e^{g} dh of the chunk's first token
        first = tl.exp(tl.load(g + t0 * D + cols, mask=m_d, other=0.0).to(tl.float32))
    else:
        decay, value, _, _ = forward_tile(xs, g, t0, n_rows, d0, D, zero, BT, BD)
        first = tl.full([BD], 1.0, dtype=tl.float32)
    tl.store(A + slot * D + cols, first * last_row(decay, BT), mask=m_d)
    tl.store(B + slot * D + cols, first * last_row(value, BT), mask=m_d)
    # every thread's stores above, then one release-acquire count per (sequence, channel
    # block): the program that counts last sees every map of its sequence
    tl.debug_barrier()
    bos, eos, slot0 = chunk_span(i_n, cu_seqlens, T, BT, IS_VARLEN)
    n = tl.cdiv(eos - bos, BT)
    ND = tl.cdiv(D, BD)
    counter = done + i_n * ND + d0 // BD
    finished = tl.atomic_add(counter, 1, sem="acq_rel")
    if finished == n - 1:
        _scan_chunk_maps(A, B, carry_in, init, final, i_n, slot0, n, cols, m_d, D, NC, BD, REVERSE, USE_INIT,
                         STORE_FINAL)
        # every program of this sequence and block has counted: back to zero, so that the
        # next launch on the stream (the backward's) needs no fill (``Layout.counters``)
        tl.store(counter, 0)


@triton.jit
def _output_fwd(x, g, o, maps, slots, cu_seqlens, chunk_map, T, D, BT: tl.constexpr, BD: tl.constexpr,
                IS_VARLEN: tl.constexpr):
    _, _, carry_in = _maps(maps, slots, D)
    i_n, t0, n_rows, slot, d0 = _chunk_of_program(cu_seqlens, chunk_map, T, D, BT, BD, IS_VARLEN)
    cols, m_d = channel_block(d0, D, BD)
    carry = tl.load(carry_in + slot * D + cols, mask=m_d, other=0.0)
    forward_chunk(x, g, o, t0, n_rows, d0, D, carry, BT, BD)


@triton.jit
def _output_bwd(g, o, h0, do, dx, dg, maps, slots, cu_seqlens, chunk_map, T, D, BT: tl.constexpr, BD: tl.constexpr,
                USE_H0: tl.constexpr, IS_VARLEN: tl.constexpr):
    _, _, carry_in = _maps(maps, slots, D)
    i_n, t0, n_rows, slot, d0 = _chunk_of_program(cu_seqlens, chunk_map, T, D, BT, BD, IS_VARLEN)
    cols, m_d = channel_block(d0, D, BD)
    bos, _, _ = chunk_span(i_n, cu_seqlens, T, BT, IS_VARLEN)
    carry = tl.load(carry_in + slot * D + cols, mask=m_d, other=0.0)
    backward_chunk(g, o, h0, do, dx, dg, i_n, t0, n_rows, t0 == bos, d0, D, carry, USE_H0, BT, BD)


class _Layout:
    """Sizes, chunk table and launch constants of a call (shared by the calls of one shape:
    ``_layout``)."""

    __slots__ = ("N", "T", "D", "cu_seqlens", "varlen", "chunk_map", "empty_sequences", "n_chunks", "slots",
                 "channel_blocks", "NC", "grid", "args")

    def __init__(self, x: torch.Tensor, cu_seqlens, offsets_host, NC: Optional[int] = None):
        B, T, D = x.shape
        self.N = B if cu_seqlens is None else cu_seqlens.numel() - 1
        self.T, self.D = T, D
        self.cu_seqlens = cu_seqlens
        self.varlen = varlen = offsets_host is not None
        if varlen:
            self.chunk_map = _utils.chunk_map(offsets_host, BT, x.device)
            self.n_chunks = self.chunk_map.shape[0]
            self.empty_sequences = empty_sequences(offsets_host, x.device)
        else:
            self.chunk_map = self.empty_sequences = None
            self.n_chunks = B * _utils.cdiv(T, BT)
        self.slots = state_slots(B, T, self.N, BT, varlen)
        launch, self.channel_blocks, self.NC = _launch_constants(D)
        if NC is not None:  # a narrower carry scan (tests: a sequence over several steps)
            self.NC = NC
        self.grid = (self.n_chunks * self.channel_blocks,)
        # the keyword arguments every chunk launch takes (sizes, block, warps, options)
        self.args = dict(launch, T=T, IS_VARLEN=varlen)

    def counters(self, device) -> torch.Tensor:
        """The summary's per (sequence, channel block) counts, zero. Each launch leaves them
        zero again, so the forward's serve its backward: one fill a forward+backward, whose
        host time counts (each fill is a launch; ``kernels/README.md``)."""
        return torch.zeros(self.N * self.channel_blocks, dtype=torch.int32, device=device)


# Built once per target arch and size, since this op's calls are host-bound and nothing
# here depends on the tensors' values or storage: under (arch, D) the chunk launches'
# constants (``_launch_constants``), under (arch, D, B, T) the whole ``_Layout`` of
# sequences of one length. Packed sequences take the constants from here and build the
# rest of their layout each call.
_cache: dict = {}


def _cached(key, value):
    """Store ``value`` under ``key`` (emptying a full cache first) and return it."""
    if len(_cache) > 256:
        _cache.clear()
    _cache[key] = value
    return value


def _layout(x: torch.Tensor, cu_seqlens, offsets_host) -> _Layout:
    """The call's ``_Layout``: for sequences of one length, one per target arch and shape,
    built once; packed sequences and symbolic sizes (while torch.compile traces) build
    theirs each call."""
    B, T, D = x.shape
    if cu_seqlens is not None or not (type(B) is int and type(T) is int and type(D) is int):
        return _Layout(x, cu_seqlens, offsets_host)
    key = (_arch.target_arch(), D, B, T)
    lay = _cache.get(key)
    return lay if lay is not None else _cached(key, _Layout(x, None, None))


def _launch_constants(D):
    """(the chunk launches' constant keyword arguments, channel blocks, maps a step of the
    carry scan) for ``D`` channels on the target arch (a symbolic size, while torch.compile
    traces, worked out each time)."""
    arch = _arch.target_arch()
    if not isinstance(D, int):
        return _constants(arch, D)
    key = (arch, D)
    constants = _cache.get(key)
    return constants if constants is not None else _cached(key, _constants(arch, D))


def _constants(arch: int, D):
    cfg = configs(D, arch)
    c = cfg["chunk"]
    launch = dict(D=D, BT=BT, BD=c["BD"], num_warps=c["num_warps"])
    return launch, _utils.cdiv(D, c["BD"]), cfg["carry"]["NC"]


def _scan_passes(xs, g, init, final_dtype, lay: _Layout, reverse: bool, counters):
    """Pass 1 (module docstring): the state entering every chunk (in the buffer it returns,
    ``_maps``), and the final one in ``final_dtype`` (None: not wanted). ``counters``: zero
    (``_Layout.counters``), and left zero."""
    need_final = final_dtype is not None
    # the maps A, B and the entering states in one allocation, split in the kernels (three
    # views would cost an unbind's host time on every pass)
    maps = _utils.empty((3, lay.slots, lay.D), torch.float32, g.device)
    final = _utils.empty((lay.N, lay.D), final_dtype, g.device) if need_final else None
    if lay.n_chunks > 0:
        _summary[lay.grid](xs, g, maps, lay.slots, init, final, counters, lay.cu_seqlens, lay.chunk_map, **lay.args,
                           NC=lay.NC, REVERSE=reverse, USE_INIT=init is not None, STORE_FINAL=need_final,
                           **COMPILE_OPTIONS)
    if need_final:
        _sequences_without_chunks(final, init, lay)
    return maps, final


def _sequences_without_chunks(final, init, lay: _Layout) -> None:
    """A sequence of no tokens has no program: its final state is its initial state (zero
    without one). The empty sequences are known on the host (validated offsets); none in
    the common case, and then nothing is launched."""
    if lay.n_chunks == 0:
        final.copy_(init) if init is not None else final.zero_()
    elif lay.empty_sequences is not None:
        rows = lay.empty_sequences
        if init is not None:
            final.index_copy_(0, rows, init.index_select(0, rows).to(final.dtype))
        else:
            final.index_fill_(0, rows, 0.0)


def _forward(x: torch.Tensor, g: torch.Tensor, initial_state: Optional[torch.Tensor],
             cu_seqlens: Optional[torch.Tensor], cu_seqlens_cpu: Optional[torch.Tensor], output_final_state: bool,
             *, keep, offsets):
    """Passes 1-2 forward; the backward reads the output (``h_{t-1}``) and the summary's
    counters, which the forward left zero."""
    x, g = x.contiguous(), g.contiguous()
    if initial_state is not None:
        initial_state = initial_state.contiguous()
    lay = _layout(x, cu_seqlens, offsets)
    counters = lay.counters(x.device)
    maps, final_state = _scan_passes(x, g, initial_state, torch.float32 if output_final_state else None, lay,
                                         False, counters)
    o = _utils.empty_like(x)
    if lay.n_chunks > 0:
        _output_fwd[lay.grid](x, g, o, maps, lay.slots, cu_seqlens, lay.chunk_map, **lay.args, **COMPILE_OPTIONS)
    return (o, final_state), ((counters,) if keep else ())


def _backward(grads, saved, x, g, initial_state, cu_seqlens, cu_seqlens_cpu, output_final_state,
              *, needs_grad, offsets, outputs):
    (o, _), (do, dht) = outputs, grads
    g = g.contiguous()
    # only the final state was used: no output gradient
    do = torch.zeros_like(o) if do is None else do.contiguous()
    initial_state, dht = _utils.contiguous(initial_state, dht)
    lay = _layout(o, cu_seqlens, offsets)
    need_dh0 = initial_state is not None and needs_grad["initial_state"]
    counters = saved[0] if saved else lay.counters(o.device)
    maps, dh0 = _scan_passes(do, g, dht, initial_state.dtype if need_dh0 else None, lay, True, counters)
    dx = _utils.empty(o.shape, x.dtype, o.device)
    dg = _utils.empty_like(g)
    if lay.n_chunks > 0:
        _output_bwd[lay.grid](g, o, initial_state, do, dx, dg, maps, lay.slots, cu_seqlens, lay.chunk_map, **lay.args,
                              USE_H0=initial_state is not None, **COMPILE_OPTIONS)
    return dict(x=dx, g=dg, initial_state=dh0)


CHUNK_HGRN = library.register(OP, _forward, _backward)


def chunk_hgrn(x: torch.Tensor, g: torch.Tensor, initial_state: torch.Tensor | None = None,
               output_final_state: bool = False, cu_seqlens: torch.Tensor | None = None,
               cu_seqlens_cpu: torch.Tensor | None = None):
    """HGRN, chunked (a parallel scan over time): ``h_t = e^{g_t} ⊙ h_{t-1} + x_t``, ``o_t = h_t``.

    x, g: ``[B, T, D]`` (g of any float dtype; its gradient in that dtype).
    ``initial_state``: float32 ``[N, D]``. With ``cu_seqlens`` (``B == 1``) the N packed
    sequences run independently; pass ``cu_seqlens_cpu`` to validate without a
    device-to-host copy. Returns ``(o, final_state)``, ``final_state`` float32 ``[N, D]``
    or None.
    """
    offsets = check_hgrn_inputs(OP, x, g, initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu)
    return CHUNK_HGRN(x, g, initial_state, cu_seqlens, cu_seqlens_cpu, output_final_state,
                      offsets=offsets)
