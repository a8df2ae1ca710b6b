"""The degenerate tokens every sample carries (``inputs.degenerate_tokens``): zero padding
rows, a zero key, a zero log gate and a zero ``beta``; and the packing of one-token
sequences at chunk offsets."""

from __future__ import annotations

import itertools

import torch

from pytest_fla.ops.inputs import Arg, make_factory
from pytest_fla.ops.packings import length_one_at_chunk_offsets, packings
from pytest_fla.ops.spec import Case

ARGS = {
    "q": Arg(("B", "T", "H", "K")),
    "k": Arg(("B", "T", "H", "K"), "unit"),
    "v": Arg(("B", "T", "H", "V")),
    "g": Arg(("B", "T", "H"), "log_gate"),
    "beta": Arg(("B", "T", "H"), "beta"),
    "a": Arg(("B", "T", "H", "K"), "unit", scale=-1.0),
    "b": Arg(("B", "T", "H", "K"), "beta", times="a", scale=-1.0),
    "w": Arg(("B", "T", "H", "K"), "normal", degenerate=False),
    "weight": Arg(("K",), "positive"),
}
CASE = Case("c", {"B": 2, "T": 9, "H": 2, "K": 4, "V": 3})


def _zero_tokens(t: torch.Tensor) -> set[tuple[int, int]]:
    rows = t.flatten(2).abs().sum(-1) == 0
    return {tuple(i) for i in torch.nonzero(rows).tolist()}


def _sample(lengths=None, **hooks):
    return make_factory(ARGS, **hooks)(CASE, torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0), lengths).kwargs


def test_every_sample_has_padding_rows_a_zero_key_and_zero_gates():
    s = _sample()
    B, T = 2, 9
    padding = {(0, 1), (B - 1, T - 1)}
    assert _zero_tokens(s["q"]) == padding and _zero_tokens(s["v"]) == padding
    assert _zero_tokens(s["k"]) == padding | {(b, T // 2) for b in range(B)}
    assert _zero_tokens(s["g"]) == {(b, T // 3) for b in range(B)}  # log gate 0: no decay
    assert _zero_tokens(s["beta"]) == {(b, 2 * T // 3) for b in range(B)}  # no write
    assert _zero_tokens(s["a"]) == padding
    assert _zero_tokens(s["b"]) == padding  # coupled to a: zero where a is
    assert not _zero_tokens(s["w"])  # left out with Arg(degenerate=False)
    assert (s["weight"] != 0).all()  # not a [B, T, ...] input
    assert not _zero_tokens(_sample(degenerate=False)["q"])


def test_packed_padding_is_the_second_and_last_token_of_the_batch():
    s = _sample(lengths=(3, 1, 5))
    assert s["q"].shape[:2] == (1, 9)
    assert _zero_tokens(s["q"]) == {(0, 1), (0, 8)}


def test_one_token_sequences_sit_at_a_chunks_first_middle_and_last_token():
    for c in (16, 64):
        lengths = length_one_at_chunk_offsets(c)
        starts = [0, *itertools.accumulate(lengths)][:-1]
        offsets = {s % c for s, n in zip(starts, lengths) if n == 1}
        assert offsets == {0, c // 2, c - 1}
        assert any(s == sum(lengths) - 1 and s % c == 0 for s, n in zip(starts, lengths) if n == 1)  # alone in the last chunk
        assert min(lengths) >= 1
        assert "length_one_at_chunk_offsets" in {p.name for p in packings(c)}
