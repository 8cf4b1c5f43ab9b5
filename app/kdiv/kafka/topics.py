"""Creating topics so that clients can use them at once.

Apache Kafka answers CreateTopics as soon as the controller has accepted the topic, before
every partition has a leader and before the brokers' metadata lists it; a client that
starts reading or writing right away sees UnknownTopicOrPartition for a while. So each
creation here waits until the topic's every partition has a leader.
"""

from __future__ import annotations

import asyncio

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, for_code

_LEADERS_TIMEOUT_S = 30.0
_LEADERS_POLL_S = 0.05


class TopicCreationError(RuntimeError):
    """The broker refused to create a topic, or its partitions got no leaders in time."""


async def create_topic(admin: AIOKafkaAdminClient, topic: NewTopic) -> bool:
    """Create `topic` unless it exists, then wait until it has leaders. True if created here."""
    response = await admin.create_topics([topic])
    created = True
    for name, error_code, *details in response.topic_errors:
        if not error_code:
            continue
        error = for_code(error_code)
        if error is TopicAlreadyExistsError:
            created = False  # another process created it first: fine, but it may be as new
            continue
        message = details[0] if details and details[0] else ""
        raise TopicCreationError(
            f"cannot create topic {name} ({topic.num_partitions} partitions, replication factor "
            f"{topic.replication_factor}): {error.__name__} {message}".rstrip()
        )
    await wait_for_leaders(admin, topic.name)
    return created


async def wait_for_leaders(admin: AIOKafkaAdminClient, name: str, timeout: float = _LEADERS_TIMEOUT_S) -> None:
    """Wait until every partition of topic `name` has a leader."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        (description,) = await admin.describe_topics([name])
        leaders = [partition["leader"] for partition in description["partitions"]]
        if description["error_code"] == 0 and leaders and min(leaders) >= 0:
            return
        if loop.time() >= deadline:
            raise TopicCreationError(f"topic {name} still lacks partition leaders {timeout:.0f} s after creation")
        await asyncio.sleep(_LEADERS_POLL_S)
