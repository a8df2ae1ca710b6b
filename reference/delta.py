"""Delta-rule recurrences: delta_rule, gated_delta_rule, kda, dplr_delta_rule, rwkv7.

Per head, S [K, V]; o_t = S_t^T (scale q_t) reads the state after the token's update.
"""
import torch

from ._recurrence import outer, read, run_recurrence
from .norm import l2norm


def kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
        cu_seqlens=None, use_qk_l2norm_in_kernel=False):
    """Kimi delta attention: a per-channel decay, then the delta-rule write.

        S'  = diag(e^{g_t}) S_{t-1}
        S_t = (I - β_t k_t k_t^T) S' + β_t k_t v_t^T
        o_t = S_t^T (scale q_t)

    Grouped value heads: q, k [B, T, H, K]; v [B, T, HV, V]; g [B, T, HV, K]; beta [B, T, HV];
    HV % H == 0 and value head j reads query/key head j // (HV // H). State [N, HV, K, V],
    o [B, T, HV, V]. use_qk_l2norm_in_kernel: q and k go through l2norm first.
    """
    q, k, v, g, beta = q.double(), k.double(), v.double(), g.double(), beta.double()
    B, T, H, K = q.shape
    HV, V = v.shape[2:]
    assert k.shape == q.shape and v.shape[:2] == (B, T) and HV % H == 0
    assert g.shape == (B, T, HV, K) and beta.shape == (B, T, HV)
    scale = K ** -0.5 if scale is None else scale
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    q = q.repeat_interleave(HV // H, dim=2)
    k = k.repeat_interleave(HV // H, dim=2)

    def step(S, q_t, k_t, v_t, g_t, beta_t):
        S = g_t.exp()[..., None] * S
        # (I - β k k^T) S + β k v^T, regrouped as S + β k (v - S^T k)^T
        S = S + outer(beta_t[..., None] * k_t, v_t - read(S, k_t))
        return S, read(S, scale * q_t)

    return run_recurrence(step, (q, k, v, g, beta), (HV, K, V), (HV, V),
                          initial_state, output_final_state, cu_seqlens)


def gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                     cu_seqlens=None, use_qk_l2norm_in_kernel=False):
    """Gated delta rule: one scalar log decay per value head and step.

        S_t = e^{g_t} (I - β_t k_t k_t^T) S_{t-1} + β_t k_t v_t^T
        o_t = S_t^T (scale q_t)

    q, k [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV]; grouped value heads as in kda.
    A scalar decay commutes with (I - β k k^T), so this is kda with g repeated over the
    key channels.
    """
    B, T, H, K = q.shape
    HV = v.shape[2]
    assert g.shape == (B, T, HV)
    return kda(q, k, v, g[..., None].expand(B, T, HV, K), beta, scale, initial_state,
               output_final_state, cu_seqlens, use_qk_l2norm_in_kernel)


def delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
               cu_seqlens=None, use_qk_l2norm_in_kernel=False):
    """S_t = (I - β_t k_t k_t^T) S_{t-1} + β_t k_t v_t^T, o_t = S_t^T (scale q_t).

    q, k [B, T, H, K]; v [B, T, H, V]; beta [B, T, H]: gated_delta_rule with g = 0.
    """
    no_decay = torch.zeros(beta.shape, dtype=torch.float64, device=beta.device)
    return gated_delta_rule(q, k, v, no_decay, beta, scale, initial_state, output_final_state,
                            cu_seqlens, use_qk_l2norm_in_kernel)


def dplr_delta_rule(q, k, v, a, b, gk, scale=None, initial_state=None, output_final_state=False,
                    cu_seqlens=None):
    """Diagonal-plus-low-rank transition.

        S_t = (diag(e^{gk_t}) + b_t a_t^T) S_{t-1} + k_t v_t^T
        o_t = S_t^T (scale q_t)

    The rank-1 term acts on the undecayed S_{t-1}. q, k, a, b, gk [B, T, H, K];
    v [B, T, H, V]; state [N, H, K, V].
    """
    q, k, v, a, b, gk = (x.double() for x in (q, k, v, a, b, gk))
    B, T, H, K = q.shape
    V = v.shape[-1]
    assert k.shape == a.shape == b.shape == gk.shape == q.shape and v.shape[:3] == (B, T, H)
    scale = K ** -0.5 if scale is None else scale

    def step(S, q_t, k_t, v_t, a_t, b_t, gk_t):
        # b a^T S = b (S^T a)^T
        S = gk_t.exp()[..., None] * S + outer(b_t, read(S, a_t)) + outer(k_t, v_t)
        return S, read(S, scale * q_t)

    return run_recurrence(step, (q, k, v, a, b, gk), (H, K, V), (H, V),
                          initial_state, output_final_state, cu_seqlens)


def rwkv7(r, w, k, v, a, b, scale=1.0, initial_state=None, output_final_state=False,
          cu_seqlens=None):
    """RWKV-7: dplr_delta_rule with q = r, gk = w (log decay), default scale 1.0.

        S_t = (diag(e^{w_t}) + b_t a_t^T) S_{t-1} + k_t v_t^T
        o_t = S_t^T (scale r_t)
    """
    return dplr_delta_rule(r, k, v, a, b, w, scale, initial_state, output_final_state, cu_seqlens)
