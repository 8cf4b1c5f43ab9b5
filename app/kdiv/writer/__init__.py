"""Writers that stamp every record with DIV metadata (docs/writer.md).

`DivWriter` (aiokafka, asyncio) needs nothing beyond kdiv's base install;
`kdiv.writer.confluent.ConfluentDivWriter` (confluent_kafka's Producer) is imported from its
module only, so the base install never needs confluent-kafka. Both stamp through
`kdiv.writer.stamping`.
"""

from kdiv.writer.aio import DivWriter

__all__ = ["DivWriter"]
