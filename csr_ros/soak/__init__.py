"""Soak: compressed robot-days through the real parts, with faults, each one recovered.

    summary = run_soak(SoakSettings(robot_hours=24, speedup=10, faults=("kill_host",)))
    summary.ok               # nothing lost, every fault recovered, the state equals its log
    json.dumps(summary.as_json())

The modules, bottom up: `settings` (SoakSettings, the fault kinds), `traffic` (the patrol's
sensor stream rendered by the aggregator's emitter, with seqs and a ring), `probes` (RSS, fds
and threads from /proc), `faults` (the seeded plan, the chunk log's small file system),
`state_host` (the process that holds the state: the reconciler, its chunk log, its
resources, the decisions), `audit` (the chunk log against every chunk sent), `summary`
(FaultRecord, SoakSummary, the report) and `supervisor` (run_soak: the robot side, the
faults, the recovery checks). `csr-ros soak` is the command (csr_ros.tools.soak).
"""

from csr_ros.lazy import lazy_names

_HOMES = {"FAULT_KINDS": "settings", "SoakSettings": "settings", "parse_faults": "settings",
          "FaultRecord": "summary", "SoakSummary": "summary", "format_report": "summary",
          "run_soak": "supervisor"}

__all__ = sorted(_HOMES)

__getattr__ = lazy_names(__name__, _HOMES)
