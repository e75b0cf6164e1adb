"""64-bit call counts: a hot decode shape overflows int32 on PostgreSQL

Revision ID: 0011
Revises: 0010
"""
from alembic import op
import sqlalchemy as sa


revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ('shapes', 'captures'):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.alter_column('calls', existing_type=sa.Integer(), type_=sa.BigInteger())


def downgrade() -> None:
    for table in ('shapes', 'captures'):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.alter_column('calls', existing_type=sa.BigInteger(), type_=sa.Integer())
