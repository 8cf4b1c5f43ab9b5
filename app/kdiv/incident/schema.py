"""The JSON Schema of an incident (schema.json, shipped in the package), for readers outside
kdiv and the tests that hold every producer of incidents to it."""

from __future__ import annotations

import json
from importlib import resources

SCHEMA_FILE = "schema.json"


def incident_schema() -> dict:
    """schema.json, parsed."""
    return json.loads(resources.files("kdiv.incident").joinpath(SCHEMA_FILE).read_text(encoding="utf-8"))
