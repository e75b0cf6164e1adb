"""ab_passes.load: the load generator that measured the pass (own, vllm, sglang or cmd: TEMPLATE); one run's passes
come from one load (issue 49); a pass from before reads own

Revision ID: 0023
Revises: 0022
"""
from alembic import op
import sqlalchemy as sa


revision = '0023'
down_revision = '0022'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('ab_passes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('load', sa.String(length=300), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('ab_passes', schema=None) as batch_op:
        batch_op.drop_column('load')
