"""Schema Registry: Confluent's wire format, the client kdiv uses, and a development registry."""
