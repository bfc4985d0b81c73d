"""Alerts when nobody watches: a run turning red, or an agents alarm, sent by the engine to the user's webhook
or command (`[alerts]` in `$CARL_HOME/engine.toml`), once per cause per run, retried with backoff."""

from .alert_job import Alerts
from .alert_settings import AlertSettings, load_settings

__all__ = ["AlertSettings", "Alerts", "load_settings"]
