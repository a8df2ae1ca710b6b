"""The peer library's adapters (``specs/peer.py``): how a call is translated, that
every op of this repo has a counterpart or says why not, how a release's adapters are
picked and what a release lacks is reported, and, where fla-core is installed, that each
adapter matches the peer's signature. ``FLA_PEER_RELEASES=<folder>`` (one unpacked wheel a
release: ``<folder>/<release>/fla``, e.g. ``unzip fla_core-0.4.2-py3-none-any.whl -d
<folder>/0.4.2``) checks every release found there, each imported in a child process."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from specs import peer
from specs import all_specs

NO_COUNTERPART = {"gated_delta_net": "fla-core ships no GatedDeltaNet layer as a function of its parameters"}
HAS_PEER = importlib.util.find_spec("fla") is not None


def test_every_op_has_a_peer_adapter_or_a_reason():
    missing = [s.name for s in all_specs() if s.name not in peer.ADAPTERS and s.name not in NO_COUNTERPART]
    assert not missing, f"no fla-core adapter for {missing}: add one to specs/peer.py (or a reason here)"


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


def test_the_peers_specs_keep_the_compile_cases_with_float32_states():
    """The peer's kernels compile offline over this repo's compile cases, each state float32
    (what every release takes): a bf16 state one of its ops refuses must not stop the rest
    of that op's launches from compiling."""
    from pytest_fla.checks.compile_per_arch import _state_in

    spec = next(s for s in all_specs() if s.name == "chunk_gla")
    assert spec.compile_cases and "bf16" in spec.state_dtypes
    ours_first = _state_in(spec, spec.compile_cases[0], "bf16")
    assert ours_first.options["initial_state"] == "bf16"  # ours: the first case's state in the run's dtype
    theirs = peer.peer_spec(spec)
    assert theirs.compile_cases == spec.compile_cases and theirs.compile_state_dtypes == ()
    assert _state_in(theirs, theirs.compile_cases[0], "bf16") is theirs.compile_cases[0]


def test_peer_specs_need_the_peer(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(pytest.UsageError, match="fla-core, which is not importable"):
        peer.peer_specs()


@pytest.mark.skipif(not HAS_PEER, reason="fla-core is not installed here (benchmarks/gpu_run.sh installs it on the GPU)")
def test_each_adapter_matches_the_peers_signature():
    specs = peer.peer_specs()
    assert {s.name for s in specs} == {s.name for s in all_specs()} - set(NO_COUNTERPART)
    assert peer.signature_problems() == []


def test_release_numbers_order_as_releases():
    assert [peer.release_key(r) for r in peer.RELEASES] == sorted(peer.release_key(r) for r in peer.RELEASES)
    assert peer.release_key("0.4.2") < peer.release_key("0.4.10") < peer.release_key("0.5")
    assert peer.release_key("0.6.0.post1") == (0, 6, 0)
    with pytest.raises(ValueError):
        peer.release_key("main")


def test_the_release_is_read_from_the_installed_package(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", lambda name: {"fla-core": "0.4.1"}[name])
    assert peer.installed_release() == "0.4.1"

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    monkeypatch.setitem(sys.modules, "fla", types.SimpleNamespace(__version__="0.5.0"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert peer.installed_release() == "0.5.0"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert peer.installed_release() is None


def test_peer_names_the_release_its_adapters_are_for():
    assert peer.PEER == f"fla-core {peer.RELEASE}"
    assert {a.release for a in peer.ADAPTERS.values()} == {peer.RELEASE}
    if HAS_PEER:
        assert peer.RELEASE == peer.installed_release()


def test_a_change_holds_in_the_releases_before_it(fake_peer):
    per = peer.PerRelease(peer.Adapter("fake_peer", "op", defaults=(("scale", 1.0),)), (
        peer.before("0.4.2", defaults=(("scale", 1.0), ("output_final_state", False))),
        peer.before("0.4.0", absent="not yet"),
    ))
    assert per.at("0.6.0") == peer.Adapter("fake_peer", "op", defaults=(("scale", 1.0),), release="0.6.0")
    assert per.at("0.7.1").release == "0.7.1"  # a newer release: the newest's adapter
    assert dict(per.at("0.4.1").defaults) == {"scale": 1.0, "output_final_state": False}
    assert per.at("0.4.1").absent is None and per.at("0.4.0").absent is None
    assert per.at("0.3.2").absent == "not yet"
    assert per.at("0.4.1")(q=1) == {"q": 1, "scale": 1.0, "output_final_state": False}


def test_every_release_has_an_adapter_for_every_op():
    for release in peer.RELEASES:
        adapters = peer.adapters(release)
        assert set(adapters) == set(peer.PER_RELEASE), release
        assert all(a.release == release for a in adapters.values())
    assert peer.adapters(peer.NEWEST)["chunk_kda"].absent is None
    assert peer.adapters("0.3.2")["chunk_kda"].absent and peer.adapters("0.3.2")["fused_recurrent_kda"].absent


def test_an_op_a_release_lacks_skips_as_absent(fake_peer):
    adapter = peer.Adapter("fake_peer", "op", release="0.3.2", absent="fla.ops.kda first ships in fla-core 0.4.0")
    with pytest.raises(pytest.skip.Exception, match=r"^op absent in fla-core 0\.3\.2: fla.ops.kda first ships"):
        adapter(q=1)
    with pytest.raises(LookupError, match="absent in fla-core 0.3.2"):
        adapter.target


def test_a_keyword_a_release_lacks_is_dropped_when_none_and_absent_when_given(fake_peer):
    adapter = peer.Adapter("fake_peer", "op", release="0.4.2", absent_keywords=("window_size",))
    assert adapter(q=1, window_size=None) == {"q": 1}
    assert adapter(q=1) == {"q": 1}
    with pytest.raises(pytest.skip.Exception, match=r"^`window_size` absent in fla-core 0\.4\.2's op$"):
        adapter(q=1, window_size=40)


def test_grouped_value_heads_are_absent_before_0_5_0_in_the_chunked_gated_rules(fake_peer):
    q, v = torch.zeros(1, 4, 1, 8), torch.zeros(1, 4, 2, 8)
    for name in ("chunk_gated_delta_rule", "chunk_kda"):
        old = dataclasses.replace(peer.adapters("0.4.2")[name], module="fake_peer", function="op")
        new = dataclasses.replace(peer.adapters("0.5.0")[name], module="fake_peer", function="op")
        with pytest.raises(pytest.skip.Exception, match="grouped value heads"):
            old(q=q, v=v)
        assert old(q=q, v=q)["v"] is q
        assert new(q=q, v=v)["v"] is v


def test_fused_recurrent_rwkv7_is_called_at_the_contracts_scale_in_every_release():
    """Every release's docstring: ``scale`` "If not provided, it will default to
    `1 / sqrt(K)`" (chunk_rwkv7's and the contract's: 1.0). Left out, the peer's output is
    off by ``1 - K^-1/2``: 0.91 at K = 128, 0.88 at K = 64, what the GPU runs saw."""
    for release in peer.RELEASES:
        defaults = dict(peer.adapters(release)["fused_recurrent_rwkv7"].defaults)
        assert defaults == {"scale": 1.0, "output_final_state": False}, release
        chunk = dict(peer.adapters(release)["chunk_rwkv7"].defaults)
        assert chunk == ({"output_final_state": False} if peer.release_key(release) < (0, 4, 2) else {}), release


def test_the_keywords_passed_leave_out_those_dropped_and_consumed():
    spec = next(s for s in all_specs() if s.name == "parallel_attn")
    assert "causal" not in peer.passed_arguments(spec, peer.adapters("0.6.0")["parallel_attn"])
    assert "window_size" in peer.passed_arguments(spec, peer.adapters("0.6.0")["parallel_attn"])
    assert "window_size" not in peer.passed_arguments(spec, peer.adapters("0.4.2")["parallel_attn"])


RELEASES_ENV = "FLA_PEER_RELEASES"
RELEASES_DIR = os.environ.get(RELEASES_ENV)
CHILD = """
import json, warnings
warnings.simplefilter("ignore")
from specs import peer
print("FLA_PEER_RESULT " + json.dumps({"peer": peer.PEER, "problems": peer.signature_problems(),
      "absent": sorted(n for n, a in peer.ADAPTERS.items() if a.absent)}))
"""


@pytest.mark.parametrize("release", peer.RELEASES)
def test_a_release_matches_its_adapters(release):
    """fla-core ``release``, unpacked under ``$FLA_PEER_RELEASES/<release>``, imported in a
    child process: ``PEER`` names it, every adapter's target resolves (or is declared
    absent, and is), and every keyword the spec's samples pass is one its function takes
    (or is declared absent, and is)."""
    if not RELEASES_DIR:
        pytest.skip(f"{RELEASES_ENV} is not set (a folder with one unpacked fla-core wheel a release)")
    folder = Path(RELEASES_DIR) / release
    if not (folder / "fla").is_dir():
        pytest.skip(f"no fla-core {release} under {RELEASES_DIR} (unzip its wheel into {folder})")
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(repo)]), "TRITON_INTERPRET": "1"}
    child = subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=repo, capture_output=True, text=True, timeout=300)
    lines = [line for line in child.stdout.splitlines() if line.startswith("FLA_PEER_RESULT ")]
    assert child.returncode == 0 and lines, child.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("FLA_PEER_RESULT "))
    assert result["peer"] == f"fla-core {release}"
    assert result["problems"] == []
    assert result["absent"] == sorted(n for n, a in peer.adapters(release).items() if a.absent)
