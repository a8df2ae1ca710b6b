"""Softmax attention, one masked score matrix per sequence."""
import torch

from ._sequences import per_sequence


def attention(q, k, v, scale=None, causal=True, window_size=None, cu_seqlens=None):
    """o_i = Σ_j softmax_j(scale q_i · k_j) v_j

    over the keys j of query i's own sequence, restricted to j <= i when causal and to
    i - j < window_size when a window is given (so a non-causal window still sees every later
    key). q [B, T, H, D]; k [B, T, HKV, D], v [B, T, HKV, DV] with H % HKV == 0: query head h
    reads kv head h // (H // HKV). Returns o [B, T, H, DV].
    """
    q, k, v = q.double(), k.double(), v.double()
    B, T, H, D = q.shape
    HKV = k.shape[2]
    assert k.shape == (B, T, HKV, D) and v.shape[:3] == (B, T, HKV) and H % HKV == 0
    assert window_size is None or window_size >= 1, "every query must see at least itself"
    scale = D ** -0.5 if scale is None else scale

    def attend(n, q_seq, k_seq, v_seq):
        L = q_seq.shape[0]
        k_seq = k_seq.repeat_interleave(H // HKV, dim=1)
        v_seq = v_seq.repeat_interleave(H // HKV, dim=1)
        scores = torch.einsum("ihd,jhd->hij", scale * q_seq, k_seq)
        i = torch.arange(L, device=q.device)[:, None]
        j = torch.arange(L, device=q.device)[None, :]
        allowed = torch.ones((L, L), dtype=torch.bool, device=q.device)
        if causal:
            allowed = allowed & (j <= i)
        if window_size is not None:
            allowed = allowed & (i - j < window_size)
        scores = scores.masked_fill(~allowed, float("-inf"))
        # softmax as exp(s - log Σ exp s); torch's own float64 softmax starts a thread pool
        # even on 3x3 rows, which dominates small CPU runs
        weights = (scores - scores.logsumexp(dim=-1, keepdim=True)).exp()
        return torch.einsum("hij,jhd->ihd", weights, v_seq), None

    o, _ = per_sequence(attend, (q, k, v), cu_seqlens)
    return o
