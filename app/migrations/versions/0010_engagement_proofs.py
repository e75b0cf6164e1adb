"""engagement proofs (AITER's lookup run in the image per deploy form); images.flydsl

Revision ID: 0010
Revises: 0009
"""
from alembic import op
import sqlalchemy as sa
import app.db.models


revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('images', schema=None) as batch_op:
        batch_op.add_column(sa.Column('flydsl', sa.Boolean(), nullable=True))
    op.create_table('engagement_proofs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('campaign_id', sa.Integer(), nullable=False),
    sa.Column('form', sa.String(length=32), nullable=False),
    sa.Column('worker_id', sa.String(length=128), nullable=False),
    sa.Column('aiter_commit', sa.String(length=80), nullable=True),
    sa.Column('aiter_version', sa.String(length=80), nullable=True),
    sa.Column('flydsl', sa.Boolean(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('results', sa.JSON(), nullable=False),
    sa.Column('created_at', app.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['campaign_id'], ['campaigns.id'], name=op.f('fk_engagement_proofs_campaign_id')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_engagement_proofs'))
    )
    with op.batch_alter_table('engagement_proofs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_engagement_proofs_campaign_id'), ['campaign_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('engagement_proofs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_engagement_proofs_campaign_id'))
    op.drop_table('engagement_proofs')
    with op.batch_alter_table('images', schema=None) as batch_op:
        batch_op.drop_column('flydsl')
