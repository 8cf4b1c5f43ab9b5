"""The Faust transport kdiv workers use: Faust's aiokafka driver with exact end offsets.

Faust takes a changelog's end from the consumer's "highwaters" to know when recovery is
done. Two things go wrong there, and both make a restored table silently incomplete:

- faust-streaming 0.15 under ``processing_guarantee="exactly_once"`` reads them from the
  consumer's cached last stable offset, which is -1 for a partition never fetched: a
  taken-over table comes back empty. On every broker we ask the consumer instead
  (ListOffsets under its isolation level: the last stable offset when read_committed).
- Tansu answers ListOffsets too low (see `app.kafka_compat`); there the end comes from a
  Fetch. Only for Tansu.

The broker URL scheme selects the transport: ``kdiv://`` (any Kafka) or ``kdiv-tansu://``.
"""

from __future__ import annotations

from collections.abc import Mapping

import faust.transport.drivers as drivers
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from .kafka_compat import end_offsets

KAFKA_SCHEME = "kdiv"
TANSU_SCHEME = "kdiv-tansu"


class KdivConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    tansu = False

    async def _highwaters(self, partitions: list[TP]) -> Mapping[TP, int]:
        return await end_offsets(self._ensure_consumer(), partitions, tansu=self.tansu)


class TansuConsumerThread(KdivConsumerThread):
    tansu = True


class KdivConsumer(faust_aiokafka.Consumer):
    thread_class: type[KdivConsumerThread] = KdivConsumerThread

    def _new_consumer_thread(self) -> KdivConsumerThread:
        return self.thread_class(self, loop=self.loop, beacon=self.beacon)


class TansuConsumer(KdivConsumer):
    thread_class = TansuConsumerThread


class KdivTransport(faust_aiokafka.Transport):
    Consumer = KdivConsumer


class TansuTransport(faust_aiokafka.Transport):
    Consumer = TansuConsumer


drivers.TRANSPORTS.aliases[KAFKA_SCHEME] = f"{__name__}:KdivTransport"
drivers.TRANSPORTS.aliases[TANSU_SCHEME] = f"{__name__}:TansuTransport"


def broker_url(bootstrap: str, *, tansu: bool) -> str:
    """Faust broker URL(s) for a bootstrap list "host:port[,host:port...]"."""
    scheme = TANSU_SCHEME if tansu else KAFKA_SCHEME
    hosts = [h.strip() for h in bootstrap.split(",") if h.strip()]
    if not hosts:
        raise ValueError("empty bootstrap address")
    return ";".join(f"{scheme}://{h.removeprefix('kafka://')}" for h in hosts)
