"""served time: default path time per shape, served steps, step histograms, capture ids

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 20:30:00
"""
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


def _backfill() -> None:
    """Existing shapes: priority was calls x flops; now calls x the roofline estimate of the default's time."""
    from app.domain.families import get_family
    from app.domain.roofline import estimate_us
    conn = op.get_bind()
    shapes = sa.table('shapes', sa.column('id'), sa.column('campaign_id'), sa.column('shape', sa.JSON()),
                      sa.column('calls'), sa.column('default_us'), sa.column('priority'))
    camps = sa.table('campaigns', sa.column('id'), sa.column('gfx'), sa.column('cu_num'), sa.column('family'))
    rows = conn.execute(sa.select(shapes.c.id, shapes.c.shape, shapes.c.calls, camps.c.gfx, camps.c.cu_num,
                                  camps.c.family).join(camps, camps.c.id == shapes.c.campaign_id)).all()
    for r in rows:
        est = estimate_us(get_family(r.family), r.shape, r.gfx, r.cu_num)
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
