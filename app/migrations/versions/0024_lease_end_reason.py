"""leases.end_reason: why a worker handed its lease back early (a busy GPU: the race's busy verdict, issue 50);
null where it said nothing, and for every lease before

Revision ID: 0024
Revises: 0023
"""
from alembic import op
import sqlalchemy as sa


revision = '0024'
down_revision = '0023'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('leases', schema=None) as batch_op:
        batch_op.add_column(sa.Column('end_reason', sa.String(length=500), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('leases', schema=None) as batch_op:
        batch_op.drop_column('end_reason')
