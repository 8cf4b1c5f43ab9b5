"""The route groups' committed offsets, polled for the pipeline audit's judges: a trace whose
group committed past its record without an observation downstream is evidence of loss."""

from __future__ import annotations

import asyncio
import logging

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from kdiv.config.settings import Settings
from kdiv.kafka.committed import read_committed
from kdiv.kafka.discovery import ClusterView
from kdiv.trace.routes import validate_routes
from kdiv.worker.audit import PipelineAudit

log = logging.getLogger("kdiv.worker")


async def poll_committed_offsets(audit: PipelineAudit, settings: Settings, cluster: ClusterView) -> None:
    """Every `settings.audit.offsets_poll_s`, the route groups' committed offsets into `audit`;
    a route whose group is unknown is logged once (its traces wait: lag, not loss)."""
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.bootstrap,
        client_id=f"{settings.app_id}-audit-offsets",
        **settings.kafka_security.aiokafka_kwargs(),
    )
    await admin.start()
    reported: set[str] = set()
    try:
        while True:
            try:
                partitions = {t.name: t.partitions for t in cluster.topics}
                groups, offsets = await read_committed(admin, audit.routes, partitions)
                audit.known_groups = groups
                unknown = set(validate_routes(audit.routes, settings.audit.route_topics(), groups))
                for problem in sorted(unknown - reported):
                    log.warning("pipeline audit: %s; its traces wait (lag, not loss) until it commits", problem)
                reported = unknown
                audit.note_committed(offsets)
            except KafkaError as failed:
                log.warning("pipeline audit: committed offsets not read: %s", failed)
            await asyncio.sleep(settings.audit.offsets_poll_s)
    finally:
        await admin.close()
