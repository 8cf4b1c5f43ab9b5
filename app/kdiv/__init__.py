"""kdiv: data integrity validation for Kafka pipelines."""

__version__ = "0.1.0"
