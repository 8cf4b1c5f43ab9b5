"""`GET /reconcile/{run}/report.html`: a reconciliation run's report, from KDIV_RECONCILE_REPORTS.

Only a run directory's report is served: the run's name is matched before it reaches the file
system; below the reports directory no link is followed (each step is opened with O_NOFOLLOW)
and a file with more than one hard link is refused (a hard link made inside the directory to
a file outside it is that file). What is served is read from the very file checked.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from aiohttp import web
from faust.web import Request

from kdiv.worker.web.handlers import Answer, Site
from kdiv.worker.web.params import shown

REPORT = "/reconcile/{run}/report.html"
REPORT_FILE = "report.html"
# The largest report served: its plots are inline SVG, a few MiB at most.
MAX_REPORT_BYTES = 64 << 20
# A run directory's name as `kdiv reconcile` makes it (a snapshot time); nothing else is looked
# up, so no "..", no separator, no hidden name reaches the file system.
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# report.html is self-contained: inline CSS and SVG, no script; so it gets no script at all.
REPORT_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)


def open_report(reports: Path | None, run: str) -> int | None:
    """A file descriptor of run `run`'s report.html under `reports`, opened without
    following a link below `reports`; None when there is none: a name that is not a run's,
    a link, a file that is not a regular one or that has other hard links."""
    if reports is None or RUN_NAME.fullmatch(run) is None or ".." in run:
        return None
    directory = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    try:
        # The configured directory itself may be a link: the operator chose it.
        root = os.open(reports, directory)
        try:
            run_dir = os.open(run, directory | os.O_NOFOLLOW, dir_fd=root)
        finally:
            os.close(root)
        try:
            # O_NONBLOCK: opening a FIFO put there does not wait for a writer.
            fd = os.open(REPORT_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=run_dir)
        finally:
            os.close(run_dir)
    except OSError:  # missing, unreadable, a link (ELOOP), not a directory
        return None
    found = os.fstat(fd)
    if not stat.S_ISREG(found.st_mode) or found.st_nlink != 1:
        os.close(fd)
        return None
    return fd


def report_identity(reports: Path | None, run: str) -> tuple[int, int] | None:
    """(device, inode) of the run's report as `open_report` finds it, or None."""
    fd = open_report(reports, run)
    if fd is None:
        return None
    try:
        found = os.fstat(fd)
        return found.st_dev, found.st_ino
    finally:
        os.close(fd)


def read_report(reports: Path | None, run: str) -> bytes | None:
    """The bytes of the run's report, read from the file `open_report` checked; None
    when there is none. OSError when it cannot be read, ValueError when it is larger than
    MAX_REPORT_BYTES."""
    fd = open_report(reports, run)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as file:
        data = file.read(MAX_REPORT_BYTES + 1)
    if len(data) > MAX_REPORT_BYTES:
        raise ValueError(f"it is larger than {MAX_REPORT_BYTES:,} bytes")
    return data


def report_url(reports: Path | None, run: str | None) -> str | None:
    """The path the worker serves a run's report at, when it has one."""
    if run is None or report_identity(reports, run) is None:
        return None
    return REPORT.replace("{run}", run)


async def report_view(site: Site, request: Request, run: str) -> Answer:
    """A reconciliation run's report.html."""
    try:
        page = read_report(site.worker.reconcile_reports, run)
    except OSError as failed:
        return Answer.error(404, f"the reconciliation report of run {shown(run)} cannot be read: {failed.strerror}")
    except ValueError as bad:
        return Answer.error(502, f"the reconciliation report of run {shown(run)} is not served: {bad}")
    if page is None:
        return Answer.error(404, f"no reconciliation report of run {shown(run)}")
    return Answer(page.decode("utf-8", errors="replace"), html=True)


async def report_policy(request: web.Request, response: web.StreamResponse) -> None:
    """An on_response_prepare handler, after `guard.security_headers`: a report's own
    inline CSS is allowed, and nothing else."""
    route = request.match_info.route
    if response.status == 200 and route.resource is not None and route.resource.canonical == REPORT:
        response.headers["Content-Security-Policy"] = REPORT_POLICY
