"""Exports of a Diagnosis to other systems (`diag export`).

    traces --load_job--> Job --diagnose--> Diagnosis --prometheus.to_text--> text exposition
                                                      \\-> textfile (node_exporter) / Pushgateway

Only `prometheus` so far: the same findings as `diag analyze`, as metrics a cluster's
Prometheus already collects. Nothing heavy is imported here.
"""
