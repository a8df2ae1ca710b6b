"""Linear recurrences whose state only decays and accumulates: linear_attn, simple_gla,
retention, gla, rwkv6, hgrn.

Per head, S [K, V]; o_t = S_t^T (scale q_t) reads the state after the token's update
(rwkv6 reads before it).
"""
import math

import torch

from ._recurrence import outer, read, run_recurrence


def gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """Gated linear attention: a log decay per key channel.

        S_t = diag(e^{g_t}) S_{t-1} + k_t v_t^T
        o_t = S_t^T (scale q_t)

    q, k, g [B, T, H, K]; v [B, T, H, V]; state [N, H, K, V].
    """
    q, k, v, g = q.double(), k.double(), v.double(), g.double()
    B, T, H, K = q.shape
    V = v.shape[-1]
    assert k.shape == g.shape == q.shape and v.shape[:3] == (B, T, H)
    scale = K ** -0.5 if scale is None else scale

    def step(S, q_t, k_t, v_t, g_t):
        S = g_t.exp()[..., None] * S + outer(k_t, v_t)
        return S, read(S, scale * q_t)

    return run_recurrence(step, (q, k, v, g), (H, K, V), (H, V),
                          initial_state, output_final_state, cu_seqlens)


def simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None,
               output_final_state=False, cu_seqlens=None):
    """One scalar log decay per head and step.

        S_t = e^{g_t} S_{t-1} + k_t v_t^T
        o_t = S_t^T (scale q_t)

    The log decay is g [B, T, H], or g_gamma [H] at every step, or g + g_gamma when both are
    given; with neither it is 0 (linear_attn). Computed as gla with the decay repeated over
    the key channels.
    """
    B, T, H, K = q.shape
    log_decay = torch.zeros((B, T, H), dtype=torch.float64, device=q.device)
    if g is not None:
        log_decay = log_decay + g.double()
    if g_gamma is not None:
        log_decay = log_decay + g_gamma.double()
    return gla(q, k, v, log_decay[..., None].expand(B, T, H, K), scale,
               initial_state, output_final_state, cu_seqlens)


def linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False,
                cu_seqlens=None):
    """S_t = S_{t-1} + k_t v_t^T, o_t = S_t^T (scale q_t): simple_gla without a gate."""
    return simple_gla(q, k, v, scale=scale, initial_state=initial_state,
                      output_final_state=output_final_state, cu_seqlens=cu_seqlens)


def retention(q, k, v, scale=None, initial_state=None, output_final_state=False,
              cu_seqlens=None):
    """simple_gla with the fixed per-head decay g_gamma[h] = log(1 - 2^(-5-h))."""
    H = q.shape[2]
    g_gamma = torch.tensor([math.log(1 - 2.0 ** (-5 - h)) for h in range(H)],
                           dtype=torch.float64, device=q.device)
    return simple_gla(q, k, v, g_gamma=g_gamma, scale=scale, initial_state=initial_state,
                      output_final_state=output_final_state, cu_seqlens=cu_seqlens)


def rwkv6(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False,
          cu_seqlens=None):
    """RWKV-6: the output reads the state before the update, plus a bonus u for the current token.

        o_t = (S_{t-1} + diag(u) k_t v_t^T)^T (scale r_t)
        S_t = diag(e^{w_t}) S_{t-1} + k_t v_t^T

    r, k, w [B, T, H, K]; v [B, T, H, V]; u [H, K]; state [N, H, K, V].
    """
    r, k, v, w, u = r.double(), k.double(), v.double(), w.double(), u.double()
    B, T, H, K = r.shape
    V = v.shape[-1]
    assert k.shape == w.shape == r.shape and v.shape[:3] == (B, T, H) and u.shape == (H, K)
    scale = K ** -0.5 if scale is None else scale

    def step(S, r_t, k_t, v_t, w_t):
        o = read(S + outer(u * k_t, v_t), scale * r_t)
        S = w_t.exp()[..., None] * S + outer(k_t, v_t)
        return S, o

    return run_recurrence(step, (r, k, v, w), (H, K, V), (H, V),
                          initial_state, output_final_state, cu_seqlens)


def hgrn(x, g, initial_state=None, output_final_state=False, cu_seqlens=None):
    """HGRN, an elementwise recurrence without heads.

        h_t = e^{g_t} ⊙ h_{t-1} + x_t
        o_t = h_t

    x, g [B, T, D]; state [N, D].
    """
    x, g = x.double(), g.double()
    D = x.shape[-1]
    assert g.shape == x.shape

    def step(h, x_t, g_t):
        h = g_t.exp() * h + x_t
        return h, h

    return run_recurrence(step, (x, g), (D,), (D,), initial_state, output_final_state, cu_seqlens)
