"""The child process the crash harness runs, kills and restarts.

    python -m intentlog.testing._child WORKFLOW JOURNAL SERVICE_JSON

The workflow is ``function(journal, service)``; an ``async def`` one gets an AsyncJournal.
Exit codes: 0 the workflow returned; 3 it stopped on an UNRESOLVED operation (OutcomeUnknown,
its key printed as JSON on stdout); anything else is a failure of the workflow itself.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import sys
from typing import Any

import intentlog
from intentlog.testing._harness import ServiceInfo, load_workflow

EXIT_UNRESOLVED = 3


def main(argv: list[str]) -> int:
    workflow_ref, journal_path, service_json = argv
    workflow = load_workflow(workflow_ref)
    service = ServiceInfo(**json.loads(service_json))
    try:
        if inspect.iscoroutinefunction(workflow):
            asyncio.run(_run_async(workflow, journal_path, service))
        else:
            with intentlog.open(journal_path, max_wait=30.0) as journal:
                workflow(journal, service)
    except intentlog.OutcomeUnknown as exc:
        print(json.dumps({"unresolved": exc.key}), flush=True)
        return EXIT_UNRESOLVED
    return 0


async def _run_async(workflow: Any, journal_path: str, service: ServiceInfo) -> None:
    async with intentlog.open_async(journal_path, max_wait=30.0) as journal:
        await workflow(journal, service)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
