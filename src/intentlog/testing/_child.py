"""The child process the crash harness runs, kills and restarts.

    python -m intentlog.testing._child WORKFLOW JOURNAL SERVICE_JSON

Exit codes: 0 the workflow returned; 3 it stopped on an UNRESOLVED operation (OutcomeUnknown,
its key printed as JSON on stdout); anything else is a failure of the workflow itself.
"""

from __future__ import annotations

import json
import sys

import intentlog
from intentlog.testing._harness import ServiceInfo, load_workflow

EXIT_UNRESOLVED = 3


def main(argv: list[str]) -> int:
    workflow_ref, journal_path, service_json = argv
    workflow = load_workflow(workflow_ref)
    service = ServiceInfo(**json.loads(service_json))
    with intentlog.open(journal_path, max_wait=30.0) as journal:
        try:
            workflow(journal, service)
        except intentlog.OutcomeUnknown as exc:
            print(json.dumps({"unresolved": exc.key}), flush=True)
            return EXIT_UNRESOLVED
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
