"""The tables of REPORT.md's measurements without Envoy, of the backend alone: Redis cost
per check of each script pattern, the bridge's throughput on one connection, and one
Valkey against a 3-primary Cluster. Apart from report.py, which lays out the sections and
owns the Envoy configurations' tables and the acceptance verdicts."""

from .cells import ms, statuses, table


def redis_table(rows):
    ours = rows[0]
    return table("| pattern | Redis µs per check | × ours | Redis CPU s per 100k checks | × ours | bytes per bucket |",
                 "|---|---:|---:|---:|---:|---:|", rows,
                 lambda r: f"| {r['label']} | {r['usec_per_check']:.2f} | "
                           f"{r['usec_per_check'] / ours['usec_per_check']:.2f} | {r['cpu_s_per_100k']:.2f} | "
                           f"{r['cpu_s_per_100k'] / max(ours['cpu_s_per_100k'], 1e-9):.2f} | "
                           f"{r['bytes_per_bucket']:.0f} |")


def bridge_table(rows):
    return table("| in-flight callouts | checks per callout | checks/s | callout p50 ms | callout p99 ms | responses |",
                 "|---:|---:|---:|---:|---:|---|", rows,
                 lambda r: f"| {r['in_flight']} | {r['checks_per_callout']} | {r['checks_per_s']:.0f} | "
                           f"{ms(r['p50'])} | {ms(r['p99'])} | {statuses(r['status'])} |")


def cluster_table(rows):
    return table("| Redis | checks/s | script calls per check | Redis µs per check (all nodes) | Redis CPU s per 100k checks | callout p99 ms | responses |",
                 "|---|---:|---:|---:|---:|---:|---|", rows,
                 lambda r: f"| {r['label']} | {r['checks_per_s']:.0f} | {r['script_calls_per_check']:.2f} | "
                           f"{r['usec_per_check']:.2f} | {r['cpu_s_per_100k']:.2f} | {ms(r['p99'])} | "
                           f"{statuses(r['status'])} |")
