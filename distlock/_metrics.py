"""Where the metrics lived before the layered layout (now ``distlock._session.metrics``).

Earlier docs told users to call ``distlock._metrics.reset()``: it keeps working here. The public
names are ``distlock.metrics()`` and ``distlock.reset_metrics()``."""

from ._session.metrics import reset, snapshot  # noqa: F401 - the names earlier docs gave
