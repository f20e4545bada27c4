"""Run-time batch-size growth: the policy (pure Python), the Keras callback, and the data side."""
