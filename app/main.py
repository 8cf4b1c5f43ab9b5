"""The worker entry point: ``faust -A app.main worker`` (settings: ``KDIV_*``, see README).

Importing this module reads the settings and the cluster (watched topics and their
partition counts decide the state tables), then builds the Faust app.
"""

from __future__ import annotations

import os

from .discovery import discover, run_in_own_loop
from .settings import Settings
from .worker import build_app

settings = Settings.from_env(os.environ)
cluster = run_in_own_loop(discover(settings))
app, worker = build_app(settings, cluster)
