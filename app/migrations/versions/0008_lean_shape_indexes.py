"""lean shape indexes: the queue index in lease order (priority DESC) serves the top-campaign pick and
the next shapes; single-column campaign_id/priority/state indexes only slowed ingest

Revision ID: 0008
Revises: 0007
"""
from alembic import op
import sqlalchemy as sa


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    for name in ('ix_shapes_campaign_id', 'ix_shapes_priority', 'ix_shapes_state', 'ix_shapes_queue'):
        op.drop_index(name, table_name='shapes')
    op.create_index('ix_shapes_queue', 'shapes', ['campaign_id', 'state', sa.text('priority DESC'), 'id'])


def downgrade() -> None:
    op.drop_index('ix_shapes_queue', table_name='shapes')
    op.create_index('ix_shapes_queue', 'shapes', ['campaign_id', 'state', 'priority', 'id'])
    op.create_index('ix_shapes_state', 'shapes', ['state'])
    op.create_index('ix_shapes_priority', 'shapes', ['priority'])
    op.create_index('ix_shapes_campaign_id', 'shapes', ['campaign_id'])
