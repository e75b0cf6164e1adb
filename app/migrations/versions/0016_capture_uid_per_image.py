"""capture_uid unique per image, not across all images: a token scoped to one image reusing another's uid was
answered with the other image's capture (its shapes dropped)

Revision ID: 0016
Revises: 0015
"""
from alembic import op
import sqlalchemy as sa


revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('captures', schema=None) as batch_op:
        batch_op.add_column(sa.Column('image_digest', sa.String(length=80), nullable=True))
    op.execute("UPDATE captures SET image_digest = "
               "(SELECT campaigns.image_digest FROM campaigns WHERE campaigns.id = captures.campaign_id)")
    with op.batch_alter_table('captures', schema=None) as batch_op:
        batch_op.alter_column('image_digest', existing_type=sa.String(length=80), nullable=False)
        batch_op.drop_constraint(batch_op.f('uq_captures_capture_uid'), type_='unique')
        batch_op.create_unique_constraint(batch_op.f('uq_captures_image_digest'), ['image_digest', 'capture_uid'])
        batch_op.create_foreign_key(batch_op.f('fk_captures_image_digest'), 'images', ['image_digest'], ['digest'])


def downgrade() -> None:
    # fails where two images' captures share a uid (allowed since this revision): nothing is silently dropped
    with op.batch_alter_table('captures', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('fk_captures_image_digest'), type_='foreignkey')
        batch_op.drop_constraint(batch_op.f('uq_captures_image_digest'), type_='unique')
        batch_op.create_unique_constraint(batch_op.f('uq_captures_capture_uid'), ['capture_uid'])
        batch_op.drop_column('image_digest')
