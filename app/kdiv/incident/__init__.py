"""Incidents: one shape (`shape.Incident`, described by `schema.json`) for every report of a
fault: the incidents topic, the views, `kdiv check` and the logs. docs/incidents.md documents
its fields."""
