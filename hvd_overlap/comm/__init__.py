"""TensorFlow + Horovod: how a bucket travels (``methods``, over ``collectives``), when it is
issued (``schedule``), and the plan of a variable list (``planner``).

Importing it checks the stack first (``hvd_overlap.stack``): TensorFlow 2.15-2.18 and a Horovod
with TensorFlow ops, or a ``StackError`` naming the fix."""

from hvd_overlap.stack import require_stack

require_stack()
