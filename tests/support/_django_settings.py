"""Django, configured for the tests: one cache, ``distlock.contrib.django.RedisCache`` on the
test server (each process configures it once; its URL does not change within a run)."""

from __future__ import annotations

from typing import Any, Dict


def caches_setting(url: str) -> Dict[str, Any]:
    """The ``CACHES`` setting: the adapter's backend on ``url``."""
    return {"default": {"BACKEND": "distlock.contrib.django.RedisCache", "LOCATION": url}}


def cache_for(url: str) -> Any:
    """A new cache object of the ``default`` cache, Django configured on first use."""
    from django.conf import settings

    if not settings.configured:
        settings.configure(CACHES=caches_setting(url))
    from django.core.cache import caches

    assert caches.settings["default"]["LOCATION"] == url, "one test server per run"
    return caches.create_connection("default")
