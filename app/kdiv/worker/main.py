"""The worker entry point: ``faust -A kdiv.worker.main worker`` (settings: ``KDIV_*``, see docs/settings.md).

Importing this module reads the settings and the cluster (watched topics and their
partition counts decide the state tables), then builds the Faust app, which registers the
state schema under each table's changelog subject once it runs (`ValidationWorker`).
"""

from __future__ import annotations

import gc
import os

from aiokafka.errors import KafkaConnectionError

from kdiv.config.settings import Settings, SettingsError
from kdiv.kafka.discovery import discover, run_in_own_loop
from kdiv.kafka.failures import failure_text, refusals_explained
from kdiv.worker.faustcompat import check_versions
from kdiv.worker.logfold import demote_retriable, fold_repeats
from kdiv.worker.service import build_app

# CPython collects its youngest generation every 700 new container objects. The worker makes
# millions a second (fetched records, their header lists and tuples), none in a cycle, and
# each young collection walks the fetched batch still being validated and promotes it, so
# older generations fill and are walked again: at the default the collector took about half
# the worker's time (bench/worker.py: 0.45 of a bare consumer, 0.87 with these thresholds).
# Cycles are still collected, at 50 000 new objects and rarely the whole heap.
COLLECTOR_THRESHOLDS = (50_000, 20, 100)


# Before anything else: kdiv corrects Faust internals only of the releases it was tested with.
check_versions()
gc.set_threshold(*COLLECTOR_THRESHOLDS)
# One line, not a traceback: a bad setting or a broker that refuses the worker's credentials
# is for the operator to fix.
try:
    settings = Settings.from_env(os.environ)
except SettingsError as bad:
    raise SystemExit(f"kdiv worker: {bad}") from None
try:
    with refusals_explained():
        cluster = run_in_own_loop(discover(settings))
except KafkaConnectionError as failed:
    raise SystemExit(f"kdiv worker: Kafka at {settings.bootstrap}: {failure_text(failed)}") from None
app, worker = build_app(settings, cluster)
# The worker process's own log: the Kafka client's and Faust's repeated lines folded.
fold_repeats()
demote_retriable()
