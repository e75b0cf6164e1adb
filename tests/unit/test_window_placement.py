"""Issue 50: a capture window's fresh copies of the inputs. A clone may land where the last window's was (the
caching allocator hands a freed block of the same size back); placement "shift" puts each copy at a random offset
of its own, so the windows sample placements instead of repeating one. On the CPU with real kernels."""

from __future__ import annotations

import random

import pytest
import torch

from workers.backends import torch_race
from workers.backends.torch_candidates import MM_BT, SHIFT_BYTES, SHIFT_STEP, shifted
from workers.backends.torch_memory import GIB, RaceMemory
from workers.backends.torch_race import DEFAULT, TorchBackend

from tests.unit.test_torch_backend import lease_for, run

SHAPE = (16, 128, 256, True)


def test_a_shifted_copy_holds_the_values_contiguous_at_an_aligned_offset_that_moves():
    t = torch.randn(64, 96, dtype=torch.bfloat16)
    rng = random.Random(0)
    copies = [shifted(t, rng) for _ in range(6)]
    for c in copies:
        assert torch.equal(c, t) and c.is_contiguous()
        assert (c.storage_offset() * c.element_size()) % SHIFT_STEP == 0
        assert c.storage_offset() * c.element_size() < SHIFT_BYTES
    assert len({c.storage_offset() for c in copies}) > 1
    bt = shifted(t.t(), rng)  # the pre-transposed weight: a transposed view copied contiguous
    assert torch.equal(bt, t.t()) and bt.is_contiguous()


def _inputs(backend: TorchBackend):
    m, n, k, _ = SHAPE
    a, b, bias = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
    ref = a.double() @ b.double().t() + bias.double()
    backend._inputs = (a, b, bias, torch.float32, ref)
    return ref


@pytest.mark.parametrize("placement, copies", [("shift", 4), ("clone", 0)])
def test_each_window_after_the_first_copies_the_inputs_as_its_placement_says(monkeypatch, placement, copies):
    """Shift: a, b, the bias and the pre-transposed weight each shifted once a window, each window elsewhere, and
    the fresh candidates still compute the product. Clone: nothing shifted. Without the placement in _fresh the
    shift case sees no shifted copy."""
    made: list[torch.Tensor] = []

    def spy(t, rng):
        made.append(shifted(t, rng))
        return made[-1]
    monkeypatch.setattr(torch_race, "shifted", spy)
    backend = TorchBackend(placement=placement)
    ref = _inputs(backend)
    assert backend._fresh(0, {DEFAULT, MM_BT}) == {}  # window 0 times the race's own candidates
    offsets = []
    for w in (1, 2, 3):
        got = backend._fresh(w, {DEFAULT, MM_BT})
        assert set(got) == {DEFAULT, MM_BT}
        for c in got.values():
            assert torch.allclose(c.fn().double(), ref, atol=1e-3, rtol=1e-3), c.name
        offsets.append(tuple(t.storage_offset() for t in made[-copies:]) if copies else ())
    assert len(made) == 3 * copies
    if copies:
        assert len(set(offsets)) == 3, offsets


def test_a_shifted_race_states_the_padding_in_its_plan_and_runs_to_a_result():
    """The memory plan states the shifted copies' padding in the shape's fixed part; the race runs to a result."""
    m, n, k, bias = SHAPE
    (res,) = run(TorchBackend(repeats=6, placement="shift"), lease_for(SHAPE))
    assert res.status in ("ok", "default_best"), res.error
    assert res.race["memory"]["fixed_gib"] * GIB == RaceMemory.fixed(m, n, k, 2, bias, pad=4 * SHIFT_BYTES)
    (res,) = run(TorchBackend(repeats=6), lease_for(SHAPE))
    assert res.race["memory"]["fixed_gib"] * GIB == RaceMemory.fixed(m, n, k, 2, bias)


def test_an_unknown_placement_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="placement must be one of"):
        TorchBackend(placement="scatter")
