"""The applications this checkout ships: the one place that names them.

Each module listed registers its :class:`tasks.registries.applications.Application` when imported;
:mod:`tasks.registries.applications` imports them by name on its first lookup. Adding an
application is writing its package with an ``application`` module and adding that module here.
Nothing else outside an application names it (``tests/test_application_names.py``).
"""

APPLICATION_MODULES: tuple[str, ...] = (
    "tasks.bipa.application",
    "tasks.talkmesh.application",
)
