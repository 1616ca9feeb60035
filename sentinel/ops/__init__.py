"""Operations artifacts that ship inside the package: the Grafana dashboard sources.

The alert rules (``rules/``), systemd units (``systemd/``) and runbooks (``docs/runbooks/``) are plain files
in the repository; the dashboards are Python (grafanalib) so they can be built by ``sentinel dashboards``
from an installed package.
"""
