"""shapes.attempts_base: an admin requeue moves the base instead of lowering attempts

Revision ID: 0007
Revises: 0006
"""
from alembic import op
import sqlalchemy as sa


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('shapes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('attempts_base', sa.Integer(), server_default='0', nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('shapes', schema=None) as batch_op:
        batch_op.drop_column('attempts_base')
