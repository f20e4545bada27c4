"""Where the plugin creates its own variables: :func:`plugin_state`, which lives in ``comm``
(``hvd_overlap.comm.state_scope``) so that ``comm`` and ``growth`` use it too."""

from __future__ import annotations

from hvd_overlap.comm.state_scope import plugin_state

__all__ = ["plugin_state"]
