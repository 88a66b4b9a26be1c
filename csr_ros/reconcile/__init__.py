"""Asynchronous state reconciliation: a pure machine (`machine`) and a driver over resources."""

from csr_ros.reconcile.machine import (ChunkArrived, Extend, Load, OpFinished, Phase,
                                       QueryFinished, QueryStarted, ReconcileConfig,
                                       Reconciliation, Route, StartTimer, TimerFired,
                                       VersionChanged, Viability)

__all__ = ["ChunkArrived", "Extend", "Load", "OpFinished", "Phase", "QueryFinished",
           "QueryStarted", "ReconcileConfig", "Reconciliation", "Route", "StartTimer",
           "TimerFired", "VersionChanged", "Viability"]
