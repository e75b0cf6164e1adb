"""builds: the compile lane's JIT build seconds per image and family

Revision ID: 0013
Revises: 0012
"""
from alembic import op
import sqlalchemy as sa
import app.db.models


revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('builds',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('image_digest', sa.String(length=80), nullable=False),
    sa.Column('family', sa.String(length=64), nullable=False),
    sa.Column('worker_id', sa.String(length=128), nullable=False),
    sa.Column('seconds', sa.Float(), nullable=False),
    sa.Column('ok', sa.Boolean(), nullable=False),
    sa.Column('aiter_commit', sa.String(length=80), nullable=True),
    sa.Column('output_tail', sa.Text(), nullable=False),
    sa.Column('created_at', app.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['image_digest'], ['images.digest'], name=op.f('fk_builds_image_digest')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_builds'))
    )
    with op.batch_alter_table('builds', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_builds_image_digest'), ['image_digest'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('builds', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_builds_image_digest'))
    op.drop_table('builds')
