"""``intentlog console``: a small web console over a journal, for the person who settles what
automation cannot.

Install it with ``pip install -e '.[console]'`` from the clone (``'intentlog[console]'`` once
published) (Starlette, Jinja2, uvicorn). The overview shows counts by state, the operations that
need a person, the oldest request in flight, each effect's key-retention headroom and the
workers' leases; a task page shows its operations, each one's next action and why, and the audit
trail, with forms to resolve an operation as confirmed, failed or retry. See
:func:`intentlog.console._app.create_app` for the application and ``intentlog console --help``
for the command.

Importing this package imports none of the web stack: the command loads it when it runs.
"""
