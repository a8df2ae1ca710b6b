"""Where each sequence lies: in-kernel helpers every family shares, and the host-side
length of the longest packed sequence (:func:`longest_sequence`).

Two launch shapes need them. Sequence programs (a state pass, a recurrent scan) own one
sequence and ask :func:`sequence_bounds` for its first token and length. Chunk programs
keep per-chunk states in a buffer of *slots* (:func:`state_slots`,
:func:`first_state_slot`). Token programs find the sequence of each token with
:func:`token_sequence`.

Token kernels tile ``[B, T]`` as ``B * cdiv(T, BLOCK)`` tiles that never straddle two
batch rows, so a tile's rows sit at a fixed stride from one base pointer. Without
``cu_seqlens`` batch row ``b`` is sequence ``b``; with it (``B == 1``) a tile may straddle
sequences, and each token finds its own by bisection over the offsets here. No host
table is needed: the launch grid depends on ``B`` and ``T`` alone and the offsets are
never read on the host to launch.
"""

from __future__ import annotations

import weakref

import triton
import triton.language as tl

from ._utils import host_to_device, shapes_only


def search_steps(num_sequences: int) -> int:
    """Bisection steps that narrow ``[0, N]`` to one sequence: ``ceil(log2(N))``."""
    return max(1, (num_sequences - 1).bit_length())


@triton.jit
def tile_origin(tile, T, BLOCK_T: tl.constexpr):
    """``(b, t0)``: batch row and first token of token tile ``tile`` (``cdiv(T, BLOCK_T)`` a row)."""
    tiles_per_row = tl.cdiv(T, BLOCK_T)
    return tile // tiles_per_row, (tile % tiles_per_row) * BLOCK_T


@triton.jit
def token_sequence(t, b, cu_seqlens, T, N, steps, VARLEN: tl.constexpr, BLOCK: tl.constexpr):
    """``(n, start, end)`` as int64 ``[BLOCK]`` vectors for tokens ``t`` of batch row ``b``.

    Without ``VARLEN`` the row is the sequence: ``(b, 0, T)``. With it, bisection keeps
    ``cu[lo] <= t < cu[hi]`` and stops at the largest ``n`` with ``cu[n] <= t``, which
    skips empty sequences. Tokens past ``T`` (masked by the caller) still index
    ``cu_seqlens`` inside ``[0, N]``.
    """
    if VARLEN:
        lo = tl.zeros([BLOCK], dtype=tl.int32)
        hi = lo + N
        for _ in range(steps):
            mid = (lo + hi) // 2
            right = tl.load(cu_seqlens + mid).to(tl.int64) <= t
            lo = tl.where(right, mid, lo)
            hi = tl.where(right, hi, mid)
        start = tl.load(cu_seqlens + lo).to(tl.int64)
        end = tl.load(cu_seqlens + lo + 1).to(tl.int64)
        return lo.to(tl.int64), start, end
    else:
        zero = tl.zeros([BLOCK], dtype=tl.int64)
        return zero + b, zero, zero + T


@triton.jit
def sequence_bounds(cu_seqlens, i_n, T, IS_VARLEN: tl.constexpr):
    """(first token, length) of sequence ``i_n`` (int64 first token): from ``cu_seqlens``
    when packed, else row ``i_n`` of a ``[B, T]`` batch."""
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        T_seq = (tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos).to(tl.int32)
    else:
        bos = i_n * T
        T_seq = T
    return bos, T_seq


@triton.jit
def first_state_slot(bos, i_n, T, CHUNK: tl.constexpr, IS_VARLEN: tl.constexpr):
    """Slot of a sequence's first chunk in a per-chunk state buffer (see ``state_slots``)."""
    if IS_VARLEN:
        slot = bos // CHUNK + i_n
    else:
        slot = i_n * tl.cdiv(T, CHUNK)
    return slot


def state_slots(B: int, T: int, N: int, chunk: int, varlen: bool) -> int:
    """Rows of a per-chunk state buffer. Fixed length: sequence b's chunk c is row
    ``b * ceil(T / chunk) + c``. Packed: sequence n's chunk c is row
    ``cu_seqlens[n] // chunk + n + c``, which is injective (a sequence of length L starting
    at s ends before row ``(s + L) // chunk + n + 1``, where the next one starts) and below
    ``T // chunk + N``; so no host-side prefix sum over the lengths is needed."""
    return T // chunk + N if varlen else B * -(-T // chunk)


# (id(host offsets), what) -> (weakref to them, the value derived from them)
_derived: dict[tuple[int, str], tuple[weakref.ref, object]] = {}


def _per_offsets(offsets_host, what: str, derive):
    """``derive(offsets_host)``, cached per offsets object: ``check_cu_seqlens`` hands back
    the same host copy for the same ``cu_seqlens`` tensor, so a decoding loop pays once."""
    key = (id(offsets_host), what)
    hit = _derived.get(key)
    if hit is not None and hit[0]() is offsets_host:
        return hit[1]
    value = derive(offsets_host)
    if len(_derived) > 256:
        _derived.clear()
    _derived[key] = (weakref.ref(offsets_host), value)
    return value


def longest_sequence(offsets_host, T: int) -> int:
    """The longest sequence's length, from the validated host offsets (no device sync);
    T for fake offsets (shapes only, under torch.compile: it picks launch configs only).
    Cached per offsets object (``_per_offsets``)."""
    if offsets_host is None or shapes_only():
        return T
    return _per_offsets(offsets_host, "longest", lambda o: int((o[1:] - o[:-1]).max()) if o.numel() > 1 else 0)


def empty_sequences(offsets_host, device):
    """The indices (int64, on ``device``) of the packed sequences of no tokens, or None when
    there are none (the common case) or the offsets are fake (shapes only). From the
    validated host offsets, copied without blocking the host; cached per offsets object
    and device (``_per_offsets``)."""
    if offsets_host is None or shapes_only():
        return None

    def derive(o):
        rows = (o[1:] == o[:-1]).nonzero().flatten()
        return host_to_device(rows, device) if rows.numel() else None
    return _per_offsets(offsets_host, f"empty on {device}", derive)
