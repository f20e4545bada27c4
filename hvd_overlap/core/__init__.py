"""Pure Python (no TensorFlow, no Horovod): the communication plan (``plan``), the strategies
that build it (``strategies``) and the sharded partition (``sharding``)."""
