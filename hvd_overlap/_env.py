"""Horovod settings the plugin needs, applied before ``hvd.init()`` reads them.

Horovod reads its environment once, at ``hvd.init()``. Importing ``hvd_overlap`` before that
sets ``HOROVOD_DISABLE_GROUP_FUSION=1`` (unless the user set it), so each bucket -- one grouped
collective -- is fused only with itself and never re-fused with another bucket.
"""

from __future__ import annotations

import os

import horovod.tensorflow as hvd

GROUP_FUSION_VAR = "HOROVOD_DISABLE_GROUP_FUSION"

_value_at_import = os.environ.get(GROUP_FUSION_VAR)
_initialized_before_import = hvd.is_initialized()
if not _initialized_before_import:
    os.environ.setdefault(GROUP_FUSION_VAR, "1")


def bucket_fusion_disabled() -> bool:
    """True if Horovod was (or will be) initialised with group fusion disabled."""
    if _value_at_import is not None:
        return _value_at_import == "1"
    return not _initialized_before_import and os.environ.get(GROUP_FUSION_VAR) == "1"


def init(*args, **kwargs) -> None:
    """``hvd.init()`` with the plugin's environment applied first (same arguments)."""
    if not hvd.is_initialized():
        os.environ.setdefault(GROUP_FUSION_VAR, "1")
    hvd.init(*args, **kwargs)
