"""deploy_checks: a server log taken after deploy, per rank (hits, misses, shapes the overlay serves that a rank
missed, JIT builds while serving) and its alerts, which the campaign page shows (issue 49)

Revision ID: 0020
Revises: 0019
"""
from alembic import op
import sqlalchemy as sa

from app.db.models import UTCDateTime


revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'deploy_checks',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('campaign_id', sa.Integer(), nullable=False),
        sa.Column('form', sa.String(length=32), nullable=True),
        sa.Column('hit_lines', sa.Integer(), nullable=False),
        sa.Column('miss_lines', sa.Integer(), nullable=False),
        sa.Column('ranks', sa.JSON(), nullable=False),
        sa.Column('alerts', sa.JSON(), nullable=False),
        sa.Column('created_at', UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(['campaign_id'], ['campaigns.id'], name=op.f('fk_deploy_checks_campaign_id')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_deploy_checks')))
    op.create_index(op.f('ix_deploy_checks_campaign_id'), 'deploy_checks', ['campaign_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_deploy_checks_campaign_id'), table_name='deploy_checks')
    op.drop_table('deploy_checks')
