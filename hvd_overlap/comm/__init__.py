"""TensorFlow + Horovod: how a bucket travels (``methods``, over ``collectives``), when it is
issued (``schedule``), and the plan of a variable list (``planner``)."""
