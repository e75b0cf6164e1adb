"""image table sha256

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03 10:05:00
"""
import hashlib

from alembic import op
import sqlalchemy as sa


revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('image_tables', schema=None) as batch_op:
        batch_op.add_column(sa.Column('sha256', sa.String(length=64), nullable=True))
    conn = op.get_bind()
    t = sa.table('image_tables', sa.column('id', sa.Integer), sa.column('content', sa.Text),
                 sa.column('sha256', sa.String))
    for id_, content in conn.execute(sa.select(t.c.id, t.c.content)).all():
        conn.execute(t.update().where(t.c.id == id_).values(sha256=hashlib.sha256(content.encode()).hexdigest()))
    with op.batch_alter_table('image_tables', schema=None) as batch_op:
        batch_op.alter_column('sha256', existing_type=sa.String(length=64), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table('image_tables', schema=None) as batch_op:
        batch_op.drop_column('sha256')
