"""Tests of reference/: every op against an independent formulation of its math, packed
(cu_seqlens) sequences against separate calls, and float64 gradcheck.

Independent forms used: closed (parallel) sums for the decaying recurrences, dense [K, K]
transition matrices for the delta-rule family, algebraic identities of the delta rule,
torch's scaled_dot_product_attention, complex multiplication for rotary, and torch's
normalize / rms_norm / conv1d.
"""
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

import reference as ref
from pytest_fla.checks.generic import sequence_slice
from pytest_fla.ops.inputs import cu_seqlens_for
from pytest_fla.ops.spec import Sample
from specs import reference_specs


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def randn(*shape):
    return torch.randn(*shape, dtype=torch.float64)


def log_gate(*shape, normalizer=1.0):
    """A realistic log decay: logsigmoid(randn) / normalizer, <= 0."""
    return F.logsigmoid(randn(*shape)) / normalizer


def unit(*shape):
    return F.normalize(randn(*shape), dim=-1)


def sigmoid_randn(*shape):
    return torch.sigmoid(randn(*shape))


def rwkv7_inputs(B, T, H, K, V):
    kk = unit(B, T, H, K)
    return dict(r=randn(B, T, H, K), w=-math.exp(-0.5) * sigmoid_randn(B, T, H, K),
                k=randn(B, T, H, K), v=randn(B, T, H, V), a=-kk, b=kk * sigmoid_randn(B, T, H, K))


def dplr_inputs(B, T, H, K, V):
    """rwkv7's realistic inputs under dplr_delta_rule's names (q = r, gk = w)."""
    r, w, k, v, a, b = rwkv7_inputs(B, T, H, K, V).values()
    return dict(q=r, k=k, v=v, a=a, b=b, gk=w)


def causal_mask(T, strict=False):
    """visible[i, j]: j <= i (j < i when strict)."""
    return torch.ones(T, T, dtype=torch.bool).tril(-1 if strict else 0)


def retention_g_gamma(H):
    return torch.log(1 - 2.0 ** (-5 - torch.arange(H, dtype=torch.float64)))


# ---------------------------------------------------------------- decaying recurrences, closed form

def decayed_sum(q, k, v, log_q, log_k, visible):
    """o_i = Σ_j visible_ij (q_i ⊙ e^{log_q_i - log_k_j}) · k_j v_j; q, k, logs [B, T, H, K]."""
    exponent = log_q[:, :, None] - log_k[:, None, :]  # [B, i, j, H, K]
    # masked entries get -inf before exp: their exponent can be large and positive
    exponent = exponent.masked_fill(~visible[None, :, :, None, None], float("-inf"))
    return torch.einsum("bihk,bijhk,bjhk,bjhv->bihv", q, exponent.exp(), k, v)


def decayed_final_state(k, v, G, S0):
    """S_T = Σ_j diag(e^{G_T - G_j}) k_j v_j^T + diag(e^{G_T}) S_0, G the cumulative log decay."""
    written = torch.einsum("bjhk,bjhv->bhkv", (G[:, -1:] - G).exp() * k, v)
    return written + G[:, -1].exp()[..., None] * S0


def gla_closed_form(q, k, v, g, scale, S0):
    """o_i = Σ_{j<=i} (scale q_i ⊙ e^{G_i - G_j}) · k_j v_j + (scale q_i ⊙ e^{G_i})^T S_0,
    G = cumsum(g); the final state likewise."""
    G = g.cumsum(1)
    q = scale * q
    o = decayed_sum(q, k, v, G, G, causal_mask(q.shape[1]))
    o = o + torch.einsum("bthk,bhkv->bthv", q * G.exp(), S0)
    return o, decayed_final_state(k, v, G, S0)


def simple_gla_with_g(q, k, v, S0, scale, normalizer):
    g = log_gate(*q.shape[:3], normalizer=normalizer)
    out = ref.simple_gla(q, k, v, g=g, scale=scale, initial_state=S0, output_final_state=True)
    return out, g[..., None].expand_as(q)


def simple_gla_with_g_gamma(q, k, v, S0, scale, normalizer):
    g_gamma = log_gate(q.shape[2], normalizer=normalizer)
    out = ref.simple_gla(q, k, v, g_gamma=g_gamma, scale=scale, initial_state=S0,
                         output_final_state=True)
    return out, g_gamma[:, None].expand_as(q)


def simple_gla_with_g_plus_g_gamma(q, k, v, S0, scale, normalizer):
    g = log_gate(*q.shape[:3], normalizer=normalizer)
    g_gamma = log_gate(q.shape[2], normalizer=normalizer)
    out = ref.simple_gla(q, k, v, g=g, g_gamma=g_gamma, scale=scale, initial_state=S0,
                         output_final_state=True)
    return out, (g + g_gamma)[..., None].expand_as(q)


def linear_attn_ungated(q, k, v, S0, scale, normalizer):
    out = ref.linear_attn(q, k, v, scale=scale, initial_state=S0, output_final_state=True)
    return out, torch.zeros_like(q)


def retention_fixed_decay(q, k, v, S0, scale, normalizer):
    out = ref.retention(q, k, v, scale=scale, initial_state=S0, output_final_state=True)
    return out, retention_g_gamma(q.shape[2])[:, None].expand_as(q)


def gla_per_channel(q, k, v, S0, scale, normalizer):
    g = log_gate(*q.shape, normalizer=normalizer)
    out = ref.gla(q, k, v, g, scale=scale, initial_state=S0, output_final_state=True)
    return out, g


GLA_FAMILY = {
    "linear_attn": linear_attn_ungated,
    "simple_gla_g": simple_gla_with_g,
    "simple_gla_g_gamma": simple_gla_with_g_gamma,
    "simple_gla_g_plus_g_gamma": simple_gla_with_g_plus_g_gamma,
    "retention": retention_fixed_decay,
    "gla": gla_per_channel,
}


@pytest.mark.parametrize("scale", [None, 0.5], ids=["default_scale", "scale0.5"])
@pytest.mark.parametrize("normalizer", [0.02, 1.0, 10.0], ids=lambda n: f"norm{n}")
@pytest.mark.parametrize("op", GLA_FAMILY.values(), ids=GLA_FAMILY.keys())
def test_gla_family_matches_closed_form(op, normalizer, scale):
    B, T, H, K, V = 2, 6, 2, 3, 4
    q, k, v = randn(B, T, H, K), randn(B, T, H, K), randn(B, T, H, V)
    S0 = randn(B, H, K, V)
    (o, final), g = op(q, k, v, S0, scale, normalizer)
    expected_o, expected_final = gla_closed_form(q, k, v, g, scale or K ** -0.5, S0)
    torch.testing.assert_close(o, expected_o)
    torch.testing.assert_close(final, expected_final)


@pytest.mark.parametrize("normalizer", [0.02, 1.0, 10.0], ids=lambda n: f"norm{n}")
def test_rwkv6_matches_closed_form(normalizer):
    """o_i = Σ_{j<i} (s r_i ⊙ e^{W_{i-1} - W_j}) · k_j v_j + (s r_i ⊙ u) · k_i v_i
    + (s r_i ⊙ e^{W_{i-1}})^T S_0, W = cumsum(w), W_{-1} = 0."""
    B, T, H, K, V = 2, 6, 2, 3, 4
    r, k, v = randn(B, T, H, K), randn(B, T, H, K), randn(B, T, H, V)
    w, u, S0 = log_gate(B, T, H, K, normalizer=normalizer), randn(H, K), randn(B, H, K, V)
    o, final = ref.rwkv6(r, k, v, w, u, initial_state=S0, output_final_state=True)

    rs = K ** -0.5 * r
    W = w.cumsum(1)
    W_before = W - w
    expected = decayed_sum(rs, k, v, W_before, W, causal_mask(T, strict=True))
    expected = expected + (rs * u * k).sum(-1, keepdim=True) * v
    expected = expected + torch.einsum("bthk,bhkv->bthv", rs * W_before.exp(), S0)
    torch.testing.assert_close(o, expected)
    torch.testing.assert_close(final, decayed_final_state(k, v, W, S0))


@pytest.mark.parametrize("normalizer", [0.02, 1.0, 10.0], ids=lambda n: f"norm{n}")
def test_hgrn_matches_closed_form(normalizer):
    """h_t = Σ_{j<=t} e^{G_t - G_j} x_j + e^{G_t} h_0, G = cumsum(g)."""
    B, T, D = 2, 6, 5
    x, g, h0 = randn(B, T, D), log_gate(B, T, D, normalizer=normalizer), randn(B, D)
    o, final = ref.hgrn(x, g, initial_state=h0, output_final_state=True)

    G = g.cumsum(1)
    exponent = (G[:, :, None] - G[:, None, :]).masked_fill(~causal_mask(T)[None, :, :, None],
                                                           float("-inf"))
    expected = torch.einsum("btjd,bjd->btd", exponent.exp(), x) + G.exp() * h0[:, None]
    torch.testing.assert_close(o, expected)
    torch.testing.assert_close(final, expected[:, -1])


# ---------------------------------------------------------------- delta-rule family

def dense_transition_scan(q, k_write, v, transition, S0, scale):
    """S_t = A_t @ S_{t-1} + k_write_t v_t^T, o_t = S_t^T (scale q_t), head by head, with a
    dense [K, K] transition A_t per head and step."""
    B, T, H, K = q.shape
    o = torch.zeros(B, T, H, v.shape[-1], dtype=torch.float64)
    S = S0.clone()
    for b in range(B):
        for h in range(H):
            for t in range(T):
                S[b, h] = transition[b, t, h] @ S[b, h] + torch.outer(k_write[b, t, h], v[b, t, h])
                o[b, t, h] = S[b, h].T @ (scale * q[b, t, h])
    return o, S


def eye_minus_beta_kkT(k, beta):
    """I - β k k^T per head and step: [B, T, H, K, K]."""
    K = k.shape[-1]
    kkT = k[..., :, None] * k[..., None, :]
    return torch.eye(K, dtype=torch.float64) - beta[..., None, None] * kkT


def by_value_head(x, HV):
    """Query/key tensor [B, T, H, ...] indexed for value heads j: head j // (HV // H)."""
    return x[:, :, torch.arange(HV) // (HV // x.shape[2])]


def delta_rule_dense(B, T, H, K, V):
    q, k, v, beta = randn(B, T, H, K), unit(B, T, H, K), randn(B, T, H, V), sigmoid_randn(B, T, H)
    S0 = randn(B, H, K, V)
    out = ref.delta_rule(q, k, v, beta, initial_state=S0, output_final_state=True)
    return out, (q, beta[..., None] * k, v, eye_minus_beta_kkT(k, beta), S0, K ** -0.5)


def delta_rule_qk_l2norm_dense(B, T, H, K, V):
    q, k, v, beta = randn(B, T, H, K), randn(B, T, H, K), randn(B, T, H, V), sigmoid_randn(B, T, H)
    S0 = randn(B, H, K, V)
    out = ref.delta_rule(q, k, v, beta, initial_state=S0, output_final_state=True,
                         use_qk_l2norm_in_kernel=True)
    q = q / torch.sqrt((q ** 2).sum(-1, keepdim=True) + 1e-6)
    k = k / torch.sqrt((k ** 2).sum(-1, keepdim=True) + 1e-6)
    return out, (q, beta[..., None] * k, v, eye_minus_beta_kkT(k, beta), S0, K ** -0.5)


def gated_delta_rule_gva_dense(B, T, H, K, V):
    HV = 2 * H
    q, k, v = randn(B, T, H, K), unit(B, T, H, K), randn(B, T, HV, V)
    g, beta, S0 = log_gate(B, T, HV), sigmoid_randn(B, T, HV), randn(B, HV, K, V)
    out = ref.gated_delta_rule(q, k, v, g, beta, initial_state=S0, output_final_state=True)
    q, k = by_value_head(q, HV), by_value_head(k, HV)
    transition = g.exp()[..., None, None] * eye_minus_beta_kkT(k, beta)
    return out, (q, beta[..., None] * k, v, transition, S0, K ** -0.5)


def kda_gva_dense(B, T, H, K, V):
    HV = 2 * H
    q, k, v = randn(B, T, H, K), unit(B, T, H, K), randn(B, T, HV, V)
    g, beta, S0 = log_gate(B, T, HV, K), sigmoid_randn(B, T, HV), randn(B, HV, K, V)
    out = ref.kda(q, k, v, g, beta, initial_state=S0, output_final_state=True)
    q, k = by_value_head(q, HV), by_value_head(k, HV)
    transition = eye_minus_beta_kkT(k, beta) @ torch.diag_embed(g.exp())
    return out, (q, beta[..., None] * k, v, transition, S0, K ** -0.5)


def dplr_dense(B, T, H, K, V):
    q, k, v, a, b, gk = dplr_inputs(B, T, H, K, V).values()
    S0 = randn(B, H, K, V)
    out = ref.dplr_delta_rule(q, k, v, a, b, gk, initial_state=S0, output_final_state=True)
    transition = torch.diag_embed(gk.exp()) + b[..., :, None] * a[..., None, :]
    return out, (q, k, v, transition, S0, K ** -0.5)


def rwkv7_dense(B, T, H, K, V):
    inputs = rwkv7_inputs(B, T, H, K, V)
    S0 = randn(B, H, K, V)
    out = ref.rwkv7(**inputs, initial_state=S0, output_final_state=True)
    r, w, k, v, a, b = inputs.values()
    transition = torch.diag_embed(w.exp()) + b[..., :, None] * a[..., None, :]
    return out, (r, k, v, transition, S0, 1.0)


DENSE_FORMS = {
    "delta_rule": delta_rule_dense,
    "delta_rule_qk_l2norm": delta_rule_qk_l2norm_dense,
    "gated_delta_rule_gva": gated_delta_rule_gva_dense,
    "kda_gva": kda_gva_dense,
    "dplr_delta_rule": dplr_dense,
    "rwkv7": rwkv7_dense,
}


@pytest.mark.parametrize("op", DENSE_FORMS.values(), ids=DENSE_FORMS.keys())
def test_delta_family_matches_dense_transition(op):
    (o, final), dense_args = op(B=2, T=5, H=2, K=3, V=4)
    expected_o, expected_final = dense_transition_scan(*dense_args)
    torch.testing.assert_close(o, expected_o)
    torch.testing.assert_close(final, expected_final)


def test_delta_rule_with_beta_one_recalls_the_value_just_written():
    """With β = 1 and a unit key, S_t^T k_t = v_t whatever S_{t-1} was; with q = k and
    scale 1 the output is that recall."""
    B, T, H, K, V = 2, 6, 2, 4, 3
    k, v = unit(B, T, H, K), randn(B, T, H, V)
    o, _ = ref.delta_rule(k, k, v, torch.ones(B, T, H), scale=1.0, initial_state=randn(B, H, K, V))
    torch.testing.assert_close(o, v)


def orthonormal_keys(B, H, K):
    """[B, K, H, K]: at every (b, h) the K time steps carry K orthonormal keys."""
    Q, _ = torch.linalg.qr(randn(B, H, K, K))
    return Q.transpose(-1, -2).permute(0, 2, 1, 3)


def test_delta_rule_with_orthonormal_keys_accumulates_like_linear_attention():
    """Orthonormal keys, β = 1, S_0 = 0: each write lands on a fresh direction, so
    S_T = Σ_t k_t v_t^T."""
    B, H, K, V = 2, 2, 4, 3
    k, v = orthonormal_keys(B, H, K), randn(B, K, H, V)
    _, final = ref.delta_rule(randn(B, K, H, K), k, v, torch.ones(B, K, H), output_final_state=True)
    torch.testing.assert_close(final, torch.einsum("bthk,bthv->bhkv", k, v))


def test_gated_delta_rule_with_orthonormal_keys_decays_each_write():
    """Orthonormal keys, β = 1, S_0 = 0: the erase term never touches earlier writes, so
    S_T = Σ_t e^{G_T - G_t} k_t v_t^T with G = cumsum(g): the gate decays what was
    already stored, not the token's own write."""
    B, H, K, V = 2, 2, 4, 3
    k, v, g = orthonormal_keys(B, H, K), randn(B, K, H, V), log_gate(B, K, H)
    _, final = ref.gated_delta_rule(randn(B, K, H, K), k, v, g, torch.ones(B, K, H),
                                    output_final_state=True)
    G = g.cumsum(1)
    decay = (G[:, -1:] - G).exp()[..., None]
    torch.testing.assert_close(final, torch.einsum("bthk,bthv->bhkv", decay * k, v))


def test_kda_with_beta_zero_only_decays_the_initial_state():
    """β = 0 leaves S_t = diag(e^{g_t}) S_{t-1}: gla with keys zero (nothing written)."""
    B, T, H, K, V = 2, 5, 2, 3, 4
    q, k, v = randn(B, T, H, K), unit(B, T, H, K), randn(B, T, H, V)
    g, S0 = log_gate(B, T, H, K), randn(B, H, K, V)
    o, final = ref.kda(q, k, v, g, torch.zeros(B, T, H), initial_state=S0, output_final_state=True)
    expected_o, expected_final = ref.gla(q, torch.zeros_like(k), v, g, initial_state=S0,
                                         output_final_state=True)
    torch.testing.assert_close(o, expected_o)
    torch.testing.assert_close(final, expected_final)


GVA_OPS = {
    "gated_delta_rule": (ref.gated_delta_rule, lambda B, T, HV, K: log_gate(B, T, HV)),
    "kda": (ref.kda, lambda B, T, HV, K: log_gate(B, T, HV, K)),
}


@pytest.mark.parametrize("op, make_g", GVA_OPS.values(), ids=GVA_OPS.keys())
def test_grouped_value_heads_match_one_call_per_value_head(op, make_g):
    """Value head j of a GVA call equals an H = 1 call with query/key head j // (HV // H)."""
    B, T, H, HV, K, V = 2, 4, 2, 6, 3, 2
    q, k, v = randn(B, T, H, K), unit(B, T, H, K), randn(B, T, HV, V)
    g, beta, S0 = make_g(B, T, HV, K), sigmoid_randn(B, T, HV), randn(B, HV, K, V)
    o, final = op(q, k, v, g, beta, initial_state=S0, output_final_state=True)
    for j in range(HV):
        h = j // (HV // H)
        o_j, final_j = op(q[:, :, h:h + 1], k[:, :, h:h + 1], v[:, :, j:j + 1],
                          g[:, :, j:j + 1], beta[:, :, j:j + 1],
                          initial_state=S0[:, j:j + 1], output_final_state=True)
        torch.testing.assert_close(o[:, :, j:j + 1], o_j)
        torch.testing.assert_close(final[:, j:j + 1], final_j)


def test_rwkv7_is_dplr_with_r_as_q_and_w_as_gk_and_scale_one():
    B, T, H, K, V = 2, 5, 2, 3, 4
    inputs, S0 = rwkv7_inputs(B, T, H, K, V), randn(B, H, K, V)
    o, final = ref.rwkv7(**inputs, initial_state=S0, output_final_state=True)
    r, w, k, v, a, b = inputs.values()
    expected_o, expected_final = ref.dplr_delta_rule(r, k, v, a, b, w, scale=1.0, initial_state=S0,
                                                     output_final_state=True)
    torch.testing.assert_close(o, expected_o)
    torch.testing.assert_close(final, expected_final)


# ---------------------------------------------------------------- softmax attention

@pytest.mark.parametrize("heads, kv_heads", [(2, 2), (4, 2), (4, 1)], ids=["mha", "gqa2", "mqa"])
@pytest.mark.parametrize("window_size", [None, 1, 3], ids=lambda w: f"window{w}")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
def test_attention_matches_sdpa_with_explicit_mask(causal, window_size, heads, kv_heads):
    B, T, D, DV = 2, 6, 4, 3
    q, k, v = randn(B, T, heads, D), randn(B, T, kv_heads, D), randn(B, T, kv_heads, DV)
    o = ref.attention(q, k, v, scale=0.7, causal=causal, window_size=window_size)

    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = (j <= i) if causal else torch.ones(T, T, dtype=torch.bool)
    if window_size is not None:
        allowed = allowed & (i - j < window_size)
    kv_head = torch.arange(heads) // (heads // kv_heads)
    expected = F.scaled_dot_product_attention(
        q.transpose(1, 2), k[:, :, kv_head].transpose(1, 2), v[:, :, kv_head].transpose(1, 2),
        attn_mask=allowed, scale=0.7).transpose(1, 2)
    torch.testing.assert_close(o, expected)


def test_attention_of_a_single_token_is_its_value():
    q, k, v = randn(1, 1, 4, 3), randn(1, 1, 2, 3), randn(1, 1, 2, 5)
    torch.testing.assert_close(ref.attention(q, k, v), v.repeat_interleave(2, dim=2))


def test_attention_default_scale_is_inverse_sqrt_head_dim():
    q, k, v = randn(1, 5, 2, 4), randn(1, 5, 2, 4), randn(1, 5, 2, 4)
    torch.testing.assert_close(ref.attention(q, k, v), ref.attention(q, k, v, scale=0.5))


# ---------------------------------------------------------------- rotary

def rotary_as_complex(x, dim, positions, base=10000.0):
    """Interleaved rotary: pairs (x_{2i}, x_{2i+1}) as complex numbers times e^{i pos θ_i}."""
    pairs = torch.view_as_complex(x[..., :dim].reshape(*x.shape[:-1], dim // 2, 2).contiguous())
    theta = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angle = positions[:, None, None].double() * theta
    rotated = torch.view_as_real(pairs * torch.polar(torch.ones_like(angle), angle)).flatten(-2)
    return torch.cat((rotated, x[..., dim:]), dim=-1)


def half_split_to_interleaved(dim, D):
    """Channel order that turns half-split pairs (i, i + dim/2) into adjacent ones."""
    half = torch.arange(dim // 2)
    return torch.cat((torch.stack((half, half + dim // 2), dim=-1).flatten(), torch.arange(dim, D)))


@pytest.mark.parametrize("dim, D", [(8, 8), (4, 10)], ids=["full_width", "partial_width"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half_split"])
def test_rotary_matches_complex_multiplication(interleaved, dim, D):
    B, T, H, offset = 2, 5, 3, 7
    x = randn(B, T, H, D)
    out = ref.apply_rotary(x, dim, base=500.0, interleaved=interleaved, seqlen_offset=offset)
    order = torch.arange(D) if interleaved else half_split_to_interleaved(dim, D)
    expected = rotary_as_complex(x[..., order], dim, torch.arange(T) + offset, base=500.0)
    torch.testing.assert_close(out[..., order], expected)
    assert torch.equal(out[..., dim:], x[..., dim:])


def test_rotary_at_position_zero_is_identity():
    x = randn(2, 3, 2, 6)
    torch.testing.assert_close(ref.apply_rotary(x, 6)[:, 0], x[:, 0])
    assert not torch.allclose(ref.apply_rotary(x, 6)[:, 1], x[:, 1])


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half_split"])
def test_rotary_offset_tensor_shifts_each_batch_row(interleaved):
    x, offsets = randn(3, 4, 2, 6), torch.tensor([0, 5, 11])
    out = ref.apply_rotary(x, 4, interleaved=interleaved, seqlen_offset=offsets)
    for row, offset in enumerate(offsets.tolist()):
        expected = ref.apply_rotary(x[row:row + 1], 4, interleaved=interleaved,
                                    seqlen_offset=offset)
        torch.testing.assert_close(out[row:row + 1], expected)


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half_split"])
def test_rotary_positions_restart_per_packed_sequence(interleaved):
    lengths, offsets = [3, 0, 1, 4], torch.tensor([2, 9, 0, 4])
    x, cu_seqlens = randn(1, sum(lengths), 2, 6), cu_seqlens_for(lengths)
    out = ref.apply_rotary(x, 6, interleaved=interleaved, seqlen_offset=offsets,
                           cu_seqlens=cu_seqlens)
    bounds = cu_seqlens.tolist()
    for n, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        positions = torch.arange(end - start) + offsets[n]
        order = torch.arange(6) if interleaved else half_split_to_interleaved(6, 6)
        expected = rotary_as_complex(x[:, start:end][..., order], 6, positions)
        torch.testing.assert_close(out[:, start:end][..., order], expected)


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half_split"])
def test_rotary_tables_read_the_angles_of_each_position(interleaved):
    """rotary_embedding with the tables of apply_rotary's angles is apply_rotary, packed
    sequences and per-sequence offsets included; a position past the tables is refused."""
    lengths, offsets = [3, 4], torch.tensor([2, 9])
    x, cu_seqlens = randn(1, sum(lengths), 2, 10), cu_seqlens_for(lengths)
    angle = torch.arange(13, dtype=torch.float64)[:, None] * 500.0 ** (-2 * torch.arange(4, dtype=torch.float64) / 8)
    out = ref.rotary_embedding(x, angle.cos(), angle.sin(), interleaved, offsets, cu_seqlens)
    expected = ref.apply_rotary(x, 8, 500.0, interleaved, offsets, cu_seqlens)
    torch.testing.assert_close(out, expected)
    with pytest.raises(AssertionError):
        ref.rotary_embedding(x, angle.cos()[:12], angle.sin()[:12], interleaved, offsets, cu_seqlens)


# ---------------------------------------------------------------- norms and conv

def test_l2norm_without_eps_is_normalize():
    x = randn(2, 3, 5)
    torch.testing.assert_close(ref.l2norm(x, eps=0.0), F.normalize(x, dim=-1))


def test_l2norm_eps_adds_to_the_sum_of_squares():
    """l2norm(c x, eps = c² e) = l2norm(x, e): eps sits inside the root, added to Σ x²
    (not to the mean, not to the norm)."""
    x, c = randn(4, 6), 1e-3
    torch.testing.assert_close(ref.l2norm(c * x, eps=c * c * 0.5), ref.l2norm(x, eps=0.5))
    assert not torch.allclose(ref.l2norm(c * x), F.normalize(c * x, dim=-1), rtol=1e-3)


@pytest.mark.parametrize("affine", ["plain", "weight", "weight_bias"])
def test_rms_norm_matches_torch(affine):
    D = 6
    x, weight, bias = 1e-3 * randn(2, 3, D), randn(D), randn(D)
    weight = weight if affine != "plain" else None
    bias = bias if affine == "weight_bias" else None
    expected = F.rms_norm(x, (D,), weight, eps=1e-5) + (0 if bias is None else bias)
    torch.testing.assert_close(ref.rms_norm(x, weight, bias, eps=1e-5), expected)


@pytest.mark.parametrize("activation, act", [("swish", F.silu), ("silu", F.silu),
                                             ("sigmoid", torch.sigmoid)],
                         ids=["swish", "silu", "sigmoid"])
def test_rms_norm_gated_matches_torch(activation, act):
    D = 6
    x, g, weight = randn(2, 3, D), randn(2, 3, D), randn(D)
    expected = F.rms_norm(x, (D,), weight, eps=1e-6) * act(g)
    torch.testing.assert_close(ref.rms_norm_gated(x, g, weight, activation=activation), expected)


@pytest.mark.parametrize("with_history", [False, True], ids=["zero_history", "initial_state"])
@pytest.mark.parametrize("activation", [None, "silu", "swish"], ids=str)
@pytest.mark.parametrize("W", [1, 2, 4], ids=lambda w: f"W{w}")
def test_causal_conv1d_matches_grouped_conv1d(W, activation, with_history):
    B, T, D = 2, 6, 3
    x, weight, bias = randn(B, T, D), randn(D, W), randn(D)
    history = randn(B, D, W - 1) if with_history else torch.zeros(B, D, W - 1, dtype=torch.float64)
    y, final = ref.causal_conv1d(x, weight, bias, activation, output_final_state=True,
                                 initial_state=history if with_history else None)
    padded = torch.cat((history, x.transpose(1, 2)), dim=-1)  # [B, D, W-1+T]
    expected = F.conv1d(padded, weight[:, None], bias, groups=D).transpose(1, 2)
    if activation is not None:
        expected = F.silu(expected)
    torch.testing.assert_close(y, expected)
    torch.testing.assert_close(final, padded[..., T:])


def test_causal_conv1d_final_state_of_a_short_sequence_keeps_older_history():
    """T < W - 1: the final state is the last W-1-T history columns, then all of x."""
    B, T, D, W = 2, 2, 3, 5
    x, history = randn(B, T, D), randn(B, D, W - 1)
    _, final = ref.causal_conv1d(x, randn(D, W), initial_state=history, output_final_state=True)
    torch.testing.assert_close(final, torch.cat((history[..., T:], x.transpose(1, 2)), dim=-1))


# ---------------------------------------------------------------- every op: varlen, gradients

# The same op specs the conformance suite checks the kernels with (specs/):
# one per reference function, a spec describing the reference alone where its kernel is not
# written yet. Each variant is a case whose options differ (a gate or none, l2norm in the
# kernel, causal or not), drawn in float64 at tiny sizes.

SPECS = reference_specs()
# Options that only switch the initial and final state on: not a variant of their own.
STATE_OPTIONS = ("initial_state", "output_final_state")


def variants(spec):
    """The spec's cases whose options (other than the state switches) differ."""
    seen, out = set(), []
    for case in spec.cases:
        key = tuple(sorted((k, repr(v)) for k, v in case.options.items() if k not in STATE_OPTIONS))
        if key not in seen:
            seen.add(key)
            out.append(case)
    return out


def tiny(case, B, T, max_heads=2):
    """``case`` at batch ``B``, length ``T``, at most ``max_heads`` heads (grouped heads in
    the same ratio) and every other size at most 4; a rotary ``dim`` option is clipped to
    the size. Sizes a kernel reads as constants (a conv width ``W``, its state ``S``) stay."""
    dims = dict(case.dims)
    heads = min(dims.get("H", 1), max_heads)
    new = {"B": B, "T": T}
    for name, size in dims.items():
        if name in ("B", "T", "W", "S"):
            continue
        if name == "H":
            new[name] = heads
        elif name.startswith("H"):  # grouped heads (HV, HKV): the same ratio to H
            new[name] = max(heads * size // dims["H"], 1)
        else:
            new[name] = min(size, 4)
    options = dict(case.options)
    if isinstance(options.get("dim"), int) and "D" in new:
        options["dim"] = min(options["dim"], new["D"])
    return dataclasses.replace(case, dims=new, options=options, gpu_dims=None)


def has_state(spec):
    return "initial_state" in spec.args


def draw(spec, case, B=2, T=3, lengths=None, state=True, seed=0, max_heads=2):
    """Float64 keyword arguments for ``spec``'s reference at tiny sizes (``lengths``: packed)."""
    options = {k: v for k, v in case.options.items() if k not in STATE_OPTIONS}
    if has_state(spec):
        options.update(initial_state=state, output_final_state=True)
    case = tiny(dataclasses.replace(case, options=options), B, T if lengths is None else sum(lengths), max_heads)
    return spec.sample(case, "fp64", "cpu", seed=seed, lengths=lengths).kwargs


def call(spec, kwargs):
    """(o, final_state or None) of the reference."""
    out = spec.call_reference(Sample(kwargs))
    return out[0], (out[1] if len(out) > 1 else None)


def floating(kwargs):
    return [name for name, x in kwargs.items() if isinstance(x, torch.Tensor) and x.is_floating_point()]


def per_token(spec, name):
    return "T" in spec.args[name].layout if name in spec.args else False


def row(spec, kwargs, b):
    """The keyword arguments of batch row ``b`` alone (per-op constants stay)."""
    return {name: x[b:b + 1] if isinstance(x, torch.Tensor) and name in spec.args and spec.args[name].layout[0] in ("B", "N")
            else x for name, x in kwargs.items()}


def undeclared_tensors(spec, kwargs):
    """Tensors a factory added beyond the spec's declared inputs (rotary's per-sequence
    offsets): the tests cannot know how to slice them, or whether the reference reads
    their values."""
    return [n for n, x in kwargs.items() if isinstance(x, torch.Tensor) and n not in spec.args and n != "cu_seqlens"]


def skip_if_undeclared(spec, kwargs, why):
    names = undeclared_tensors(spec, kwargs)
    if names:
        pytest.skip(f"{spec.name}'s {', '.join(names)}: {why}; its own tests above check it")


def variant_params(where=lambda spec: True):
    return [pytest.param(spec, case, id=f"{spec.name}-{case.name}")
            for spec in SPECS if where(spec) for case in variants(spec)]


def test_every_reference_has_a_spec():
    """Every reference function is drawn for by some spec (a kernel's, or its own)."""
    covered = {spec.reference_fn for spec in SPECS}
    missing = [name for name in ref.__all__ if getattr(ref, name) not in covered]
    assert not missing, f"references without a spec (add one in specs/): {missing}"


def packed_params():
    for param in variant_params(lambda spec: spec.varlen):
        spec, case = param.values
        for start in ("initial_state", "zero_state") if has_state(spec) else ("stateless",):
            yield pytest.param(spec, case, start, id=f"{param.id}-{start}")


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("spec, case, start", list(packed_params()))
def test_packed_sequences_match_separate_calls(spec, case, start, index_dtype):
    """Sequences of lengths 3, 0, 1, 5 packed with cu_seqlens, each from its own initial
    state row (or from zeros), equal one B = 1 call per sequence."""
    lengths = (3, 0, 1, 5)
    kwargs = draw(spec, case, lengths=lengths, state=start == "initial_state")
    skip_if_undeclared(spec, kwargs, "a per-sequence value, not sliced here")
    kwargs["cu_seqlens"] = kwargs["cu_seqlens"].to(index_dtype)
    o, final = call(spec, kwargs)
    assert o.shape[:2] == (1, sum(lengths))
    bounds = kwargs["cu_seqlens"].tolist()
    for n, (begin, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        if begin == end:
            continue  # a zero-length sequence: its final state is checked below
        o_n, final_n = call(spec, sequence_slice(spec, kwargs, begin, end, n))
        torch.testing.assert_close(o[:, begin:end], o_n)
        if final is not None:
            torch.testing.assert_close(final[n:n + 1], final_n)
    if final is not None:
        S0 = kwargs.get("initial_state")
        empty_start = torch.zeros_like(final[1]) if S0 is None else S0[1]
        assert torch.equal(final[1], empty_start), "a zero-length sequence keeps its initial state"


@pytest.mark.parametrize("spec, case", variant_params(has_state))
def test_batch_rows_are_independent_sequences(spec, case):
    """Row b of a B = 3 call, from initial_state[b], equals a B = 1 call on that row alone."""
    kwargs = draw(spec, case, B=3, T=4)
    o, final = call(spec, kwargs)
    for b in range(3):
        o_b, final_b = call(spec, row(spec, kwargs, b))
        torch.testing.assert_close(o[b:b + 1], o_b)
        torch.testing.assert_close(final[b:b + 1], final_b)


@pytest.mark.parametrize("spec, case", variant_params(has_state))
def test_final_state_only_when_asked_and_zero_state_by_default(spec, case):
    kwargs = draw(spec, case, B=2, T=3)
    plain = {k: v for k, v in kwargs.items() if k not in STATE_OPTIONS}
    o, final = call(spec, plain)
    assert final is None
    o_from_zeros, _ = call(spec, {**kwargs, "initial_state": torch.zeros_like(kwargs["initial_state"])})
    torch.testing.assert_close(o, o_from_zeros)


GRADCHECK_LAYOUTS = {"batch2": (2, 3, None), "varlen": (1, 4, (2, 0, 2))}


def gradcheck_params():
    for spec, case in (param.values for param in variant_params()):
        for layout in GRADCHECK_LAYOUTS:
            if spec.varlen or layout != "varlen":
                yield pytest.param(spec, case, layout, id=f"{spec.name}-{case.name}-{layout}")


@pytest.mark.parametrize("spec, case, layout", list(gradcheck_params()))
def test_gradcheck(spec, case, layout):
    """Analytic float64 gradients equal finite differences for every floating input,
    initial_state included."""
    B, T, lengths = GRADCHECK_LAYOUTS[layout]
    kwargs = draw(spec, case, B=B, T=T, lengths=lengths, max_heads=1)
    names = floating(kwargs)

    def fn(*tensors):
        o, final = call(spec, {**kwargs, **dict(zip(names, tensors))})
        return o if final is None else (o, final)

    assert torch.autograd.gradcheck(fn, [kwargs[n].detach().requires_grad_() for n in names])


@pytest.mark.parametrize("spec, case", variant_params())
def test_float32_inputs_give_float64_outputs_and_float32_gradients(spec, case):
    kwargs = draw(spec, case, B=2, T=3)
    names = floating(kwargs)
    kwargs.update({n: kwargs[n].float().requires_grad_() for n in names})
    o, final = call(spec, kwargs)
    assert o.dtype == torch.float64
    assert final is None or final.dtype == torch.float64
    (o.sum() + (0 if final is None else final.sum())).backward()
    for name in names:
        grad = kwargs[name].grad
        assert grad is not None and grad.dtype == torch.float32, name
        assert torch.isfinite(grad).all(), name


@pytest.mark.parametrize("spec, case", variant_params())
def test_computes_on_the_inputs_device(spec, case):
    """On the meta device (shapes only, no data) every tensor the op creates must land beside
    its inputs, or mixing them raises."""
    def on_meta(kwargs):
        return {n: x.to("meta") if isinstance(x, torch.Tensor) and n != "cu_seqlens" else x for n, x in kwargs.items()}

    kwargs = draw(spec, case, B=2, T=3)
    skip_if_undeclared(spec, kwargs, "values the reference reads, which a meta tensor has not")
    o, final = call(spec, on_meta(kwargs))
    assert o.device.type == "meta"
    assert final is None or final.device.type == "meta"
    if spec.varlen:
        o, final = call(spec, on_meta(draw(spec, case, lengths=(3, 0, 3))))
        assert o.device.type == "meta"
        assert final is None or final.device.type == "meta"


def spec_for(reference_name, case_name=None):
    spec = next(s for s in SPECS if s.reference_fn is getattr(ref, reference_name))
    return spec, spec.case(case_name) if case_name else spec.cases[0]


def _outputs_and_grads(spec, case, layout, T):
    lengths = (T // 2, 0, T - T // 2) if layout == "varlen" else None
    kwargs = draw(spec, case, B=2, T=T, lengths=lengths, seed=1)
    names = floating(kwargs)
    leaves = [kwargs[n].requires_grad_() for n in names]
    o, final = call(spec, kwargs)
    grads = torch.autograd.grad((o * o.detach().cos()).sum() + final.sum(), leaves)
    return [o, final, *grads]


CHECKPOINTED = {
    "simple_gla": ("simple_gla", None),
    "gla": ("gla", None),
    "gated_delta_rule_gva": ("gated_delta_rule", "gva_state"),
    "dplr_delta_rule": ("dplr_delta_rule", None),
    "hgrn": ("hgrn", None),
}


@pytest.mark.parametrize("layout", ["batch2", "varlen"])
@pytest.mark.parametrize("name", CHECKPOINTED)
def test_checkpointed_scan_gives_the_same_outputs_and_gradients(name, layout, monkeypatch):
    """Long scans under autograd recompute their steps segment by segment in backward:
    the numbers must not change."""
    from reference import _recurrence

    spec, case = spec_for(*CHECKPOINTED[name])
    T = 23
    plain = _outputs_and_grads(spec, case, layout, T)
    monkeypatch.setattr(_recurrence, "CHECKPOINT_MIN_STEPS", 1)
    segmented = _outputs_and_grads(spec, case, layout, T)
    for a, b in zip(plain, segmented):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)


def test_checkpointed_scan_saves_about_sqrt_T_states(monkeypatch):
    """What autograd keeps from a 256-step scan: with segments, a few states per segment
    start instead of several per step."""
    from reference import _recurrence

    spec, case = spec_for("gla")
    case = dataclasses.replace(case, dims={"B": 1, "T": 256, "H": 2, "K": 16, "V": 16}, options={}, gpu_dims=None)

    def saved_bytes(min_steps):
        monkeypatch.setattr(_recurrence, "CHECKPOINT_MIN_STEPS", min_steps)
        total = 0

        def pack(t):
            nonlocal total
            total += t.numel() * t.element_size()
            return t

        kwargs = spec.sample(case, "fp64", "cpu").kwargs
        for name in floating(kwargs):
            kwargs[name].requires_grad_()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            call(spec, kwargs)
        return total

    state_bytes = 2 * 16 * 16 * 8
    every_step, segmented = saved_bytes(10**9), saved_bytes(1)
    assert every_step > 256 * state_bytes, "the unsegmented scan should keep a state per step"
    assert segmented < every_step / 4, (segmented, every_step)
