"""ab_runs.start_order: the order the driver starts the arms' servers in, drawn when the run is made (A between B and
the control; a run from before reads None: started A, A', B); ab_arms.answers: each arm's greedy answers to the
accuracy prompts with their logprobs and the runner-up's, checked against A's within a stated tolerance (a run from
before keeps its greedy tokens in first_tokens). Issue 49.

Revision ID: 0022
Revises: 0021
"""
from alembic import op
import sqlalchemy as sa


revision = '0022'
down_revision = '0021'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('ab_runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('start_order', sa.JSON(), nullable=True))
    with op.batch_alter_table('ab_arms', schema=None) as batch_op:
        batch_op.add_column(sa.Column('answers', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('ab_arms', schema=None) as batch_op:
        batch_op.drop_column('answers')
    with op.batch_alter_table('ab_runs', schema=None) as batch_op:
        batch_op.drop_column('start_order')
