"""ab_runs: sequential rounds (issue 32): the most rounds a band may get, the precision that stops it, and each
band's rounds planned so far; ab_passes: the driver's node probe of each pass; campaigns: the served request
lengths (the A/B's default input and output lengths)

Revision ID: 0019
Revises: 0018
"""
from alembic import op
import sqlalchemy as sa


revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('ab_runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('max_repeats', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('target_mde', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('band_rounds', sa.JSON(), nullable=True))
    with op.batch_alter_table('ab_passes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('probe', sa.JSON(), nullable=True))
    with op.batch_alter_table('campaigns', schema=None) as batch_op:
        batch_op.add_column(sa.Column('length_hist', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('campaigns', schema=None) as batch_op:
        batch_op.drop_column('length_hist')
    with op.batch_alter_table('ab_passes', schema=None) as batch_op:
        batch_op.drop_column('probe')
    with op.batch_alter_table('ab_runs', schema=None) as batch_op:
        batch_op.drop_column('band_rounds')
        batch_op.drop_column('target_mde')
        batch_op.drop_column('max_repeats')
