"""served time: default path time per shape, served steps, step histograms, capture ids

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 20:30:00
"""
import math

from alembic import op
import sqlalchemy as sa


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('campaigns', schema=None) as batch_op:
        batch_op.add_column(sa.Column('step_hist', sa.JSON(), nullable=True))
    with op.batch_alter_table('captures', schema=None) as batch_op:
        batch_op.add_column(sa.Column('capture_uid', sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column('step_hist', sa.JSON(), nullable=True))
        batch_op.create_unique_constraint(batch_op.f('uq_captures_capture_uid'), ['capture_uid'])
    with op.batch_alter_table('shapes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('default_us', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('default_measured', sa.Boolean(), nullable=False, server_default=sa.false()))
        batch_op.add_column(sa.Column('steps', sa.Float(), nullable=True))
    _backfill()
    with op.batch_alter_table('shapes', schema=None) as batch_op:
        batch_op.alter_column('default_us', existing_type=sa.Float(), nullable=False)
        batch_op.alter_column('default_measured', server_default=None)


# The roofline estimate as app/domain/roofline.py and app/domain/families.py had it when this revision was written
# (commit cf07b2e), frozen here so that later changes to the live rules never change what this upgrade writes.
# Per gfx: (units of the full part, dense matrix TFLOP/s by precision, HBM TB/s, launch us).
_DEVICES: dict[str, tuple[int, dict[str, float], float, float]] = {
    "gfx942": (304, {"bf16": 1307.4, "fp8": 2614.9, "fp4": 2614.9}, 5.3, 4.0),
    "gfx950": (256, {"bf16": 2516.6, "fp8": 5033.2, "fp4": 10066.3}, 8.0, 4.0),
    "sm_90": (132, {"bf16": 989.4, "fp8": 1978.9, "fp4": 1978.9}, 4.8, 4.0),
    "cpu": (1, {"bf16": 2.0, "fp8": 2.0, "fp4": 2.0}, 0.5, 0.5),
}
_FASTEST = (1, {"bf16": 2516.6, "fp8": 5033.2, "fp4": 10066.3}, 8.0, 4.0)  # an unknown gfx
_BYTES = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5}
_DTYPE_MATH = {"torch.float8_e4m3fnuz": "fp8", "torch.float8_e4m3fn": "fp8", "torch.int8": "fp8",
               "torch.float4_e2m1fn_x2": "fp4", "torch.int4": "fp4", "torch.uint8": "fp4"}
# TableFamily.math of every family there was (an unknown one fails the upgrade, as get_family did)
_FAMILY_MATH = {
    "bf16_gemm": "bf16", "a8w8_gemm": "fp8", "a8w8_bpreshuffle_gemm": "fp8", "a8w8_blockscale_gemm": "fp8",
    "a8w8_blockscale_bpreshuffle_gemm": "fp8", "a4w4_blockscale_gemm": "fp4", "a8w8_batched_gemm": "fp8",
    "bf16_batched_gemm": "bf16", "a8w8_blockscale_mxscale_batched_gemm": "fp8", "fmoe": "bf16", "fhmoe": "bf16",
    "grouped_fmoe": "bf16", "gdn_k5_opt": "bf16"}


def _estimate_us(family: str, shape: dict[str, str], gfx: str, cu_num: int) -> float:
    """roofline.estimate_us as of cf07b2e: compute at peak or operands from HBM, whichever is slower, plus a
    launch."""
    units, tflops, hbm_tbs, launch_us = _DEVICES.get(gfx, _FASTEST)
    scale = 1.0 if gfx not in _DEVICES else (min(1.0, max(cu_num, 1) / units) if units > 1 else max(cu_num, 1))
    math_ = _DTYPE_MATH.get(shape.get("q_dtype_w", ""), _FAMILY_MATH[family])
    b = _BYTES[math_]
    g = {k: int(v) for k, v in shape.items() if isinstance(v, str) and v.isdigit()}
    if {"M", "N", "K"} <= g.keys() or {"m", "n", "k"} <= g.keys():
        batch = g.get("B", g.get("b", 1))
        m, n, k = (g["M"], g["N"], g["K"]) if "M" in g else (g["m"], g["n"], g["k"])
        flops, nbytes = 2.0 * batch * m * n * k, batch * ((m * k + n * k) * b + m * n * 2.0)
    elif "token" in g:
        mats = 3 if g.get("use_g1u1", 1) else 2
        t, d, i = g["token"] * g["topk"], g["model_dim"], g["inter_dim"]
        experts = min(g["expert"], t)
        flops, nbytes = 2.0 * t * d * i * mats, experts * d * i * mats * b + t * (d + i) * 2.0
    else:
        flops, nbytes = float(math.prod(v for v in g.values() if v > 0) or 1), 0.0
    return max(flops / (tflops[math_] * 1e12 * scale), nbytes / (hbm_tbs * 1e12)) * 1e6 + launch_us


def _backfill() -> None:
    """Existing shapes: priority was calls x flops; now calls x the roofline estimate of the default's time."""
    conn = op.get_bind()
    shapes = sa.table('shapes', sa.column('id'), sa.column('campaign_id'), sa.column('shape', sa.JSON()),
                      sa.column('calls'), sa.column('default_us'), sa.column('priority'))
    camps = sa.table('campaigns', sa.column('id'), sa.column('gfx'), sa.column('cu_num'), sa.column('family'))
    rows = conn.execute(sa.select(shapes.c.id, shapes.c.shape, shapes.c.calls, camps.c.gfx, camps.c.cu_num,
                                  camps.c.family).join(camps, camps.c.id == shapes.c.campaign_id)).all()
    for r in rows:
        est = _estimate_us(r.family, r.shape, r.gfx, r.cu_num)
        conn.execute(shapes.update().where(shapes.c.id == r.id).values(default_us=est, priority=r.calls * est))


def downgrade() -> None:
    with op.batch_alter_table('shapes', schema=None) as batch_op:
        batch_op.drop_column('steps')
        batch_op.drop_column('default_measured')
        batch_op.drop_column('default_us')
    with op.batch_alter_table('captures', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('uq_captures_capture_uid'), type_='unique')
        batch_op.drop_column('step_hist')
        batch_op.drop_column('capture_uid')
    with op.batch_alter_table('campaigns', schema=None) as batch_op:
        batch_op.drop_column('step_hist')
    op.execute("UPDATE shapes SET priority = calls * flops")
