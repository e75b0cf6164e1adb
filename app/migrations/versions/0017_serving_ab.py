"""the serving A/B (issue 32): overlay versions, A/B runs, their passes and arms

Revision ID: 0017
Revises: 0016
"""
from alembic import op
import sqlalchemy as sa

from app.db.models import UTCDateTime

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'overlay_versions',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('image_digest', sa.String(length=80), nullable=False),
        sa.Column('form', sa.String(length=32), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('files', sa.JSON(), nullable=False),
        sa.Column('parent_id', sa.Integer(), nullable=True),
        sa.Column('note', sa.Text(), nullable=False),
        sa.Column('withdrawn', sa.JSON(), nullable=True),
        sa.Column('promoted_at', UTCDateTime(), nullable=True),
        sa.Column('promoted_run_id', sa.Integer(), nullable=True),
        sa.Column('created_at', UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(['image_digest'], ['images.digest'], name=op.f('fk_overlay_versions_image_digest')),
        sa.ForeignKeyConstraint(['parent_id'], ['overlay_versions.id'], name=op.f('fk_overlay_versions_parent_id')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_overlay_versions')))
    op.create_index(op.f('ix_overlay_versions_image_digest'), 'overlay_versions', ['image_digest'], unique=False)
    op.create_table(
        'ab_runs',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('image_digest', sa.String(length=80), nullable=False),
        sa.Column('version_id', sa.Integer(), nullable=False),
        sa.Column('baseline_version_id', sa.Integer(), nullable=True),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('points', sa.JSON(), nullable=False),
        sa.Column('points_source', sa.String(length=32), nullable=False),
        sa.Column('repeats', sa.Integer(), nullable=False),
        sa.Column('requests_per_pass', sa.Integer(), nullable=False),
        sa.Column('confidence', sa.Float(), nullable=False),
        sa.Column('power', sa.Float(), nullable=False),
        sa.Column('min_requests', sa.Integer(), nullable=False),
        sa.Column('seed', sa.Integer(), nullable=False),
        sa.Column('max_loss', sa.Float(), nullable=False),
        sa.Column('fault', sa.Text(), nullable=True),
        sa.Column('result', sa.JSON(), nullable=True),
        sa.Column('rollback_version_id', sa.Integer(), nullable=True),
        sa.Column('created_at', UTCDateTime(), nullable=False),
        sa.Column('updated_at', UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(['image_digest'], ['images.digest'], name=op.f('fk_ab_runs_image_digest')),
        sa.ForeignKeyConstraint(['version_id'], ['overlay_versions.id'], name=op.f('fk_ab_runs_version_id')),
        sa.ForeignKeyConstraint(['baseline_version_id'], ['overlay_versions.id'],
                                name=op.f('fk_ab_runs_baseline_version_id')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_ab_runs')))
    op.create_index(op.f('ix_ab_runs_image_digest'), 'ab_runs', ['image_digest'], unique=False)
    op.create_index(op.f('ix_ab_runs_version_id'), 'ab_runs', ['version_id'], unique=False)
    op.create_table(
        'ab_passes',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('run_id', sa.Integer(), nullable=False),
        sa.Column('band', sa.String(length=64), nullable=False),
        sa.Column('repeat', sa.Integer(), nullable=False),
        sa.Column('arm', sa.String(length=16), nullable=False),
        sa.Column('records', sa.JSON(), nullable=False),
        sa.Column('logs', sa.JSON(), nullable=False),
        sa.Column('created_at', UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(['run_id'], ['ab_runs.id'], name=op.f('fk_ab_passes_run_id')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_ab_passes')),
        sa.UniqueConstraint('run_id', 'band', 'repeat', 'arm', name=op.f('uq_ab_passes_run_id')))
    op.create_table(
        'ab_arms',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('run_id', sa.Integer(), nullable=False),
        sa.Column('arm', sa.String(length=16), nullable=False),
        sa.Column('logs', sa.JSON(), nullable=False),
        sa.Column('first_tokens', sa.JSON(), nullable=True),
        sa.Column('created_at', UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(['run_id'], ['ab_runs.id'], name=op.f('fk_ab_arms_run_id')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_ab_arms')),
        sa.UniqueConstraint('run_id', 'arm', name=op.f('uq_ab_arms_run_id')))


def downgrade() -> None:
    op.drop_table('ab_arms')
    op.drop_table('ab_passes')
    op.drop_index(op.f('ix_ab_runs_version_id'), table_name='ab_runs')
    op.drop_index(op.f('ix_ab_runs_image_digest'), table_name='ab_runs')
    op.drop_table('ab_runs')
    op.drop_index(op.f('ix_overlay_versions_image_digest'), table_name='overlay_versions')
    op.drop_table('overlay_versions')
