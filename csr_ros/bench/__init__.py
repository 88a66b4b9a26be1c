"""Code that measures the library, not the library: the benchmark commands' harnesses, installed
with the package so that `csr-ros bench`, `eval`, `fleet`, `actions`, `robot-cost`,
`chunklog bench` and `gateway --bench` run after `pip install .`. Nothing outside csr_ros.bench
and csr_ros.tools imports it (test/test_package_layers.py). What each measures: docs/benchmarks.md.

    ttft_bench, bench_report   TTFT of CSR queries against the unordered baseline, capsules
    actions_latency            decision latency of typed actions, mode by mode
    robot_cpu                  the robot side's CPU seconds per decision and per chunk
    fleet_runs, fleet_plan     K robots' episodes on P servers behind a router
    restart_bench              a restart's read of the chunk log against the robot's age
    client_bench, overhead_bench  the gateway against the same queries sent straight
    replay_graph               a recorded bag through the aggregator and all_in_one (ROS)
    watchdog_faults            each fault the policy's watchdog answers, on a real server (ROS)
    eval/                      recall of the robot's history, method by method (`csr-ros eval`)
"""
