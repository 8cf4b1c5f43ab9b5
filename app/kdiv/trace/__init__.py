"""The pipeline audit (Netflix Inca's idea): sampled records carry a trace followed across hops.

A producer stamps a sampled share of its records with a trace header (`header`, `sampling`);
every processor between topics forwards it (`propagate`); the auditor observes the traced
records on each topic of a configured route (`routes`) and judges each trace DELIVERED,
LOST, DUPLICATED or UNRESOLVED (`judge`), telling loss from lag by the processors' committed
consumer offsets.

Pure like kdiv.div: no Kafka client, store, network, file or clock; time comes in as `now_ms`.
"""
