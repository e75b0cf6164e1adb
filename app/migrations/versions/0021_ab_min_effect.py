"""ab_runs.min_effect: the smallest effect of interest, below which a significant difference reads neutral
(within margin) in the verdict, promotion and rollback (issue 49); a run from before reads 0

Revision ID: 0021
Revises: 0020
"""
from alembic import op
import sqlalchemy as sa


revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('ab_runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('min_effect', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('ab_runs', schema=None) as batch_op:
        batch_op.drop_column('min_effect')
