"""The peer library's adapters (``pytest_fla/specs/peer.py``): how a call is translated, that
every op of this repo has a counterpart or says why not, and, where fla-core is
installed, that each adapter matches the peer's signature."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
import torch

from pytest_fla.specs import peer
from pytest_fla.specs import all_specs

NO_COUNTERPART = {"gated_delta_net": "fla-core 0.6.0 ships no layers package"}
HAS_PEER = importlib.util.find_spec("fla") is not None


def test_every_op_has_a_peer_adapter_or_a_reason():
    missing = [s.name for s in all_specs() if s.name not in peer.ADAPTERS and s.name not in NO_COUNTERPART]
    assert not missing, f"no fla-core adapter for {missing}: add one to pytest_fla/specs/peer.py (or a reason here)"


@pytest.fixture
def fake_peer(monkeypatch):
    module = types.ModuleType("fake_peer")
    module.op = lambda **kwargs: kwargs
    monkeypatch.setitem(sys.modules, "fake_peer", module)
    return module


def test_an_adapter_renames_fills_defaults_and_passes_everything_by_name(fake_peer):
    adapter = peer.Adapter("fake_peer", "op", rename=(("g", "gk"),), defaults=(("normalize", False), ("eps", 1e-6)))
    assert adapter(q=1, g=2, eps=0.5) == {"q": 1, "gk": 2, "normalize": False, "eps": 0.5}
    assert repr(adapter) == "fake_peer.op"


def test_attention_adapter_refuses_a_non_causal_call(fake_peer):
    adapter = peer.Adapter("fake_peer", "op", prepare=peer._attention)
    assert adapter(q=1, causal=True) == {"q": 1}
    with pytest.raises(NotImplementedError, match="causal only"):
        adapter(q=1, causal=False)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_tables_turn_pairs_as_the_contract_says(fake_peer, interleaved):
    """The cos/sin tables the adapter builds, applied the usual way (pair i of the rotated
    width: the two halves, or neighbours), give the float64 reference's rotation."""
    import reference

    x = torch.randn(2, 6, 3, 16, dtype=torch.float64)
    offsets = torch.tensor([0, 5])
    call = peer._rotary_tables({"x": x, "dim": 12, "base": 500.0, "seqlen_offset": offsets, "interleaved": interleaved})
    cos, sin = call["cos"].double(), call["sin"].double()
    out = x.clone()
    for b in range(2):
        positions = torch.arange(6) + offsets[b]
        c, s = cos[positions][:, None], sin[positions][:, None]
        rot = x[b, :, :, :12]
        a, d = (rot[..., 0::2], rot[..., 1::2]) if interleaved else (rot[..., :6], rot[..., 6:])
        turned = (a * c - d * s, a * s + d * c)
        if interleaved:
            out[b, :, :, 0:12:2], out[b, :, :, 1:12:2] = turned
        else:
            out[b, :, :, :6], out[b, :, :, 6:12] = turned
    expected = reference.apply_rotary(x, 12, base=500.0, interleaved=interleaved, seqlen_offset=offsets)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)


def test_rotary_tables_take_the_input_dtype(fake_peer):
    """The peer refuses cos/sin tables of another dtype than ``x`` (its first GPU report)."""
    x = torch.randn(1, 4, 2, 8, dtype=torch.bfloat16)
    call = peer._rotary_tables({"x": x, "dim": 8, "seqlen_offset": 0})
    assert call["cos"].dtype == call["sin"].dtype == torch.bfloat16


def test_conv_adapter_hands_the_peer_a_window_of_w_and_takes_back_w_minus_1(fake_peer):
    """The peer keeps the last ``W`` inputs as a convolution's state (``[N, D, W]``, its
    oldest column never read), the contract the last ``W - 1``. A stand-in written to that
    layout, called through the adapter, gives the reference's output and final state."""
    import reference

    def peer_conv(x, weight, initial_state, output_final_state, **_):
        B, T, D = x.shape
        W = weight.shape[1]
        assert initial_state.shape == (B, D, W) and not initial_state[..., 0].any()
        history = torch.cat([initial_state, x.transpose(1, 2)], dim=2)  # [B, D, W + T]
        y = sum(weight[None, :, i, None] * history[:, :, 1 + i:1 + i + T] for i in range(W)).transpose(1, 2)
        return y, history[:, :, -W:] if output_final_state else None

    fake_peer.op = peer_conv
    adapter = peer.Adapter("fake_peer", "op", prepare=peer._conv_window_in, finish=peer._conv_window_out)
    x, weight, state = torch.randn(2, 5, 3, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64), torch.randn(2, 3, 3, dtype=torch.float64)
    y, final_state = adapter(x=x, weight=weight, initial_state=state, output_final_state=True)
    y_ref, final_ref = reference.causal_conv1d(x, weight, initial_state=state, output_final_state=True)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(final_state, final_ref)


def test_peer_specs_need_the_peer(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(pytest.UsageError, match="fla-core 0.6.0, which is not importable"):
        peer.peer_specs()


@pytest.mark.skipif(not HAS_PEER, reason="fla-core is not installed here (benchmarks/gpu_run.sh installs it on the GPU)")
def test_each_adapter_matches_the_peers_signature():
    specs = peer.peer_specs()
    assert {s.name for s in specs} == {s.name for s in all_specs()} - set(NO_COUNTERPART)
    for spec in specs:
        assert peer.unexpected_arguments(spec, spec.op) == [], spec.name
