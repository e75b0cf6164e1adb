"""leases: one (state, expires_at) index for the sweeper instead of two single-column ones

Revision ID: 0009
Revises: 0008
"""
from alembic import op


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index('ix_leases_state', table_name='leases')
    op.drop_index('ix_leases_expires_at', table_name='leases')
    op.create_index('ix_leases_live', 'leases', ['state', 'expires_at'])


def downgrade() -> None:
    op.drop_index('ix_leases_live', table_name='leases')
    op.create_index('ix_leases_expires_at', 'leases', ['expires_at'])
    op.create_index('ix_leases_state', 'leases', ['state'])
