"""The optimizer's self-metrics (served on ``/metrics``): ingest, planning, the store and the alert hooks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.metrics import Family, counter, gauge, labelled
from optimizer.serve import outcomes, promfeed, statedb
from optimizer.serve.findingmetrics import finding_metrics

if TYPE_CHECKING:
    from optimizer.serve.service import Optimizer


def optimizer_metrics(optimizer: Optimizer) -> list[Family]:
    fleet, plans = optimizer.fleet, sorted(optimizer.plans.items())
    families = [
        labelled("fleetfit_messages_accepted_total", "counter", "Messages accepted by kind.", "kind", fleet.accepted),
        labelled(
            "fleetfit_messages_rejected_total", "counter", "Messages rejected by reason.", "reason", fleet.rejected
        ),
        gauge("fleetfit_nodes", "Nodes known.", len(fleet.nodes)),
        labelled(
            "fleetfit_ingest_lag_seconds",
            "gauge",
            "Window end to ingest, latest 4096 windows.",
            "quantile",
            optimizer.lag.quantiles(),
        ),
        gauge("fleetfit_broker_connected", "1 while subscribed to the broker.", optimizer.connected.is_set()),
        counter("fleetfit_plans_total", "Plans made.", optimizer.plans_made),
        counter("fleetfit_plan_cpu_seconds_total", "CPU seconds spent planning.", optimizer.plan_cpu_seconds),
        gauge(
            "fleetfit_plan_wait_seconds",
            "Rest before the next round of plans: solve_interval, or more to keep within plan_cpu_share.",
            optimizer.plan_wait,
        ),
        labelled(
            "fleetfit_solve_seconds",
            "gauge",
            "Solve time of the last plan per site.",
            "site",
            {s: p.solver.solve_seconds for s, p in plans},
        ),
        labelled(
            "fleetfit_recommendations",
            "gauge",
            "Recommended moves in the last plan per site.",
            "site",
            {s: len(p.recommendations) for s, p in plans},
        ),
        labelled(
            "fleetfit_plan_failures_total",
            "counter",
            "Planning rounds that failed, per site (the site keeps its previous plan).",
            "site",
            optimizer.plan_failures,
        ),
        labelled(
            "fleetfit_site_planning_failed",
            "gauge",
            "1 while the last planning round of the site failed.",
            "site",
            {s: float(s in optimizer.failing_sites) for s in optimizer.plan_failures},
        ),
        Family(
            "fleetfit_nodes_excluded",
            "gauge",
            "Nodes the last plan of their site left out, and why.",
            [
                ({"site": s, "node": n, "reason": why.split(":", 1)[0]}, 1)
                for s, nodes in sorted(optimizer.excluded_nodes.items())
                for n, why in sorted(nodes.items())
            ],
        ),
        Family(
            "fleetfit_gpu_shares_estimated",
            "gauge",
            "GPU devices of each node whose share of a GPU the last plan estimated (mig_profile, partition_unknown).",
            [
                ({"site": s, "node": n, "reason": r}, v)
                for s, counts in sorted(optimizer.share_estimates.items())
                for (n, r), v in sorted(counts.items())
            ],
        ),
        Family(
            "fleetfit_node_rejections_total",
            "counter",
            "Messages and workload references rejected per node, by reason.",
            [({"site": s, "node": n, "reason": r}, v) for (s, n, r), v in sorted(fleet.node_rejections.items())],
        ),
        labelled(
            "fleetfit_workload_refs_dropped_total",
            "counter",
            "Workload references dropped from accepted windows, by reason.",
            "reason",
            fleet.dropped_refs,
        ),
        Family(
            "fleetfit_fields_dropped_total",
            "counter",
            "Text fields left out of accepted windows (a control character, not what the schema allows), by field.",
            [({"field": f, "reason": r}, v) for (f, r), v in sorted(fleet.dropped_fields.items())],
        ),
        gauge(
            "fleetfit_windows_awaited",
            "Windows missing from nodes' sequences, asked for again.",
            sum(len(m) for r in list(fleet.nodes.values()) for m in r.missing.values()),
        ),
        counter(
            "fleetfit_windows_refilled_total",
            "Missing windows that arrived after all (sent again on request).",
            sum(r.refilled for r in list(fleet.nodes.values())),
        ),
        Family(
            "fleetfit_windows_lost_total",
            "counter",
            "Windows missing from a node's sequence that it could not send again within an hour (given up).",
            [({"site": s, "node": n}, r.lost) for (s, n), r in sorted(fleet.nodes.items()) if r.lost],
        ),
        counter("fleetfit_resend_requests_total", "Requests to nodes for missing windows.", optimizer.resend_requests),
        Family(
            "fleetfit_inventory_mismatch",
            "gauge",
            "Nodes whose birth differs from their site's inventory of record (planned from the inventory).",
            [({"site": s, "node": n}, 1) for (s, n) in sorted(fleet.inventory_flags)],
        ),
        Family(
            "fleetfit_state_problems_total",
            "counter",
            "State file problems: damaged, foreign or read_only at start (moved aside or replaced), write_failed.",
            [
                ({"reason": r}, v)
                for r, v in sorted({**statedb.problems, "write_failed": optimizer.state_write_failures}.items())
                if v
            ],
        ),
        gauge(
            "fleetfit_state_degraded",
            "1 while states and the alert log are not kept as they should be.",
            optimizer.state_problem() is not None,
        ),
        counter(
            "fleetfit_internal_errors_total", "Messages whose handling failed unexpectedly.", optimizer.internal_errors
        ),
        labelled(
            "fleetfit_monthly_savings_usd",
            "gauge",
            "US$ a month the last plan per site would save.",
            "site",
            {s: p.monthly_savings_usd for s, p in plans},
        ),
    ]
    families += [
        labelled(
            "fleetfit_outcome_rows_skipped_total",
            "counter",
            "Rows of the outcomes table this version cannot read, skipped, each counted once (bad_json, schema, "
            "bad_type).",
            "reason",
            outcomes.skipped,
        ),
        labelled(
            "fleetfit_presence_claims_refused_total",
            "counter",
            "Sites other optimizers' presences claimed that [optimizer] peers does not list for them, not counted "
            "(unknown_optimizer, not_peer_site); per site and message.",
            "reason",
            optimizer.ownership.refused,
        ),
    ]
    families += finding_metrics(optimizer.plans, fleet)
    if optimizer.feed is not None:
        feed = optimizer.feed
        families += [
            labelled(
                "fleetfit_prometheus_reads_total",
                "counter",
                "Reads of [sources.prometheus], by result.",
                "result",
                {"ok": feed.reads["ok"], "failed": feed.reads["failed"]},
            ),
            counter("fleetfit_prometheus_windows_total", "Windows read from Prometheus into the fleet.", feed.windows),
            gauge("fleetfit_prometheus_nodes", "Nodes the Prometheus source reads.", feed.nodes()),
        ]
        if feed.jobs is not None:
            families.append(
                labelled(
                    "fleetfit_prometheus_slurm_job_reads_total",
                    "counter",
                    "Reads of the Prometheus site's running Slurm jobs (squeue), by result; a failed one leaves its "
                    "jobs named by their ids.",
                    "result",
                    {"ok": promfeed.jobs_read["ok"], "failed": promfeed.jobs_read["failed"]},
                )
            )
    if optimizer.store is not None:
        store = optimizer.store
        families += [
            counter("fleetfit_store_points_written_total", "Points the time-series store accepted.", store.written),
            counter("fleetfit_store_values_written_total", "Field values in those points.", store.values_written),
            counter("fleetfit_store_points_dropped_total", "Points dropped from a full buffer.", store.dropped),
            counter("fleetfit_store_write_failures_total", "Failed write attempts.", store.failures),
            counter(
                "fleetfit_store_points_rejected_total",
                "Points the store refused as bad (HTTP 4xx), dropped.",
                store.rejected,
            ),
            gauge("fleetfit_store_buffered_points", "Points waiting for the store.", len(store)),
        ]
    if optimizer.ownership.scoped:
        handovers = optimizer.handovers
        families += [
            labelled(
                "fleetfit_presences_rejected_total",
                "counter",
                "Optimizer presence messages rejected, by reason.",
                "reason",
                optimizer.ownership.rejected,
            ),
            counter(
                "fleetfit_handover_records_total", "Handover records accepted from the broker.", handovers.accepted
            ),
            labelled(
                "fleetfit_handover_rejected_total",
                "counter",
                "Handover records rejected, by reason (schema, oversize, site_mismatch, not_site_optimizer, future).",
                "reason",
                handovers.rejected,
            ),
            labelled(
                "fleetfit_handover_adopted_total",
                "counter",
                "Entries of handover records that changed this optimizer's state, by kind (decision, post, settling).",
                "kind",
                handovers.adopted,
            ),
            counter(
                "fleetfit_handover_mismatched_total",
                "Handed-over posts left out, counted per plan: this optimizer plans the move under that id but names "
                "it otherwise.",
                handovers.mismatched,
            ),
            counter(
                "fleetfit_handover_published_total", "Handover records this optimizer published.", handovers.published
            ),
        ]
    if optimizer.alerter is not None:
        hooks = sorted(optimizer.alerter.webhooks.values(), key=lambda w: w.name)
        families += [
            labelled(
                "fleetfit_alerts_sent_total",
                "counter",
                "Alert messages a receiver accepted.",
                "receiver",
                {w.name: w.sent for w in hooks},
            ),
            Family(
                "fleetfit_alerts_failed_total",
                "counter",
                "Alert messages given up, by receiver and reason.",
                [({"receiver": w.name, "reason": r}, n) for w in hooks for r, n in sorted(w.failed.items())],
            ),
            labelled(
                "fleetfit_alert_retries_total",
                "counter",
                "Alert delivery retries.",
                "receiver",
                {w.name: w.retries for w in hooks},
            ),
            gauge("fleetfit_alerts_pending", "Moves gathering for the next alert message.", optimizer.alerter.pending),
        ]
    return families
