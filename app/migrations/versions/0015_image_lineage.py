"""image lineage: an image inherits its tuning from the image it upgrades, and the per-shape triage of what it carried

Revision ID: 0015
Revises: 0014
"""
from alembic import op
import sqlalchemy as sa


revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('images', schema=None) as batch_op:
        batch_op.add_column(sa.Column('parent_digest', sa.String(length=80), nullable=True))
        batch_op.add_column(sa.Column('kernel_catalog', sa.JSON(), nullable=True))
        batch_op.create_foreign_key(op.f('fk_images_parent_digest'), 'images', ['parent_digest'], ['digest'])
    with op.batch_alter_table('shapes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('triage', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('carried_result_id', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('finalists', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('outcome', sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('shapes', schema=None) as batch_op:
        batch_op.drop_column('outcome')
        batch_op.drop_column('finalists')
        batch_op.drop_column('carried_result_id')
        batch_op.drop_column('triage')
    with op.batch_alter_table('images', schema=None) as batch_op:
        batch_op.drop_constraint(op.f('fk_images_parent_digest'), type_='foreignkey')
        batch_op.drop_column('kernel_catalog')
        batch_op.drop_column('parent_digest')
