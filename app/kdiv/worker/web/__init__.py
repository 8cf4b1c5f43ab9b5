"""Read-only web views of a worker (JSON shapes in docs/web-views.md).

Any worker answers for all: a partition's state is served by the worker that owns it
(the request is forwarded there, as Faust's table routing does), and the list views ask
every worker of the group for its partitions and merge the answers (`peers`). Incidents are
read by every worker from the incidents topic (`incidents_reader`), so each serves them itself.

`server` puts the views on the worker's web server: one handler per route, in a module per
group of routes (`producers`, `partitions`, `incidents`, `audit`, `status`, `pages`), each
route naming the query parameters it takes, which `params` checks for all and parses.
"""
