"""results: the timing's confidence over capture windows, the winner's spread, and the decision (issue 34)

Revision ID: 0018
Revises: 0017
"""
from alembic import op
import sqlalchemy as sa


revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('results', schema=None) as batch_op:
        batch_op.add_column(sa.Column('confidence', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('spread', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('timing', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('results', schema=None) as batch_op:
        batch_op.drop_column('timing')
        batch_op.drop_column('spread')
        batch_op.drop_column('confidence')
