"""Is a candidate's output right? AITER's error ratio (a16w16: rtol=atol=5e-2 for 16-bit outputs), a gross-element
test the ratio alone misses, an SNR figure for fp8 families, and two negative controls that must fail the check."""

from __future__ import annotations

import math

import torch

from app.domain.families import get_family

ERR_MAX = get_family("bf16_gemm").err_max  # the only family the torch race checks with this limit


def _tol(out_dtype: torch.dtype) -> float:
    return 5e-2 if out_dtype in (torch.bfloat16, torch.float16) else 1e-2


def err_ratio(out: torch.Tensor, ref: torch.Tensor, out_dtype: torch.dtype) -> float:
    tol = _tol(out_dtype)
    bad = ~torch.isclose(out.double(), ref, rtol=tol, atol=tol)
    return float(bad.sum().item()) / max(1, bad.numel())


GROSS = 10.0  # an element off by more than 10x the tolerance is no rounding: one such element fails the output


def check_output(out: torch.Tensor, ref: torch.Tensor, out_dtype: torch.dtype) -> tuple[float, str | None]:
    """(AITER's error ratio, why the output is wrong or None). AITER's ratio lets up to err_max of the elements
    miss (a16w16: 5%), so one wrong element (an index bug, a NaN) passes it; a non-finite element or one off
    by GROSS x the tolerance fails the output whatever the ratio."""
    tol = _tol(out_dtype)
    o = out.double()
    err = err_ratio(out, ref, out_dtype)
    if o.shape != ref.shape:
        return 1.0, f"output shape {tuple(o.shape)} is not {tuple(ref.shape)}"
    if not bool(torch.isfinite(o).all()):
        return err, f"{int((~torch.isfinite(o)).sum())} non-finite elements"
    gross = (o - ref).abs() > GROSS * (tol + tol * ref.abs())
    if bool(gross.any()):
        return err, f"{int(gross.sum())} elements off by more than {GROSS:g}x the tolerance"
    if err > ERR_MAX:
        return err, f"error ratio {err:.4f} over {ERR_MAX}"
    return err, None


def snr_db(out: torch.Tensor, ref: torch.Tensor) -> float:
    """20 * log10(||ref|| / ||out - ref||): the output's signal-to-noise ratio against the reference, in dB."""
    noise = float((out.double() - ref.double()).norm())
    return math.inf if noise == 0 else 20 * math.log10(max(1e-300, float(ref.double().norm())) / noise)


def negative_controls(out: torch.Tensor, ref: torch.Tensor, out_dtype: torch.dtype) -> str | None:
    """Two corrupted copies of a passing output that the check must fail: shifted by one element (an index
    bug) and pushed 1.5x past the tolerance everywhere (a scale bug). A control that passes means the check
    cannot see that error: the check is void (the reason), else None."""
    tol = _tol(out_dtype)
    o = out.double()
    shifted = o.flatten().roll(1).reshape(o.shape)
    pushed = o + 1.5 * (tol + tol * ref.abs()) * torch.where(o >= ref, 1.0, -1.0).to(o.dtype)
    for name, bad in (("shifted by one element", shifted), ("pushed past the tolerance", pushed)):
        if check_output(bad, ref, out_dtype)[1] is None:
            return f"negative control ({name}) passed the check: the check is void"
    return None
