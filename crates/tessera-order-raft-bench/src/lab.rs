//! `--lab`: openraft and tessera-order side by side on the lab's two-switch network (the
//! testbed of `tessera lab total-order`, built by `tessera-lab`; needs root).
//!
//! tessera-order runs as in the lab (multicast out of TX, in on RX, 9000-byte packing,
//! measured by the lab's own closed loop: messages UTO-delivered per second at the slowest
//! node, latency from hand-off to delivery at every node). openraft cannot use the
//! multicast: its leader sends each follower its own TCP stream, unicast from the leader's
//! RX address out of its TX interface, through switch A, the trunk and switch B to the
//! follower's RX interface, and the answers back the same way, so every byte crosses the
//! same shaped links. The load is the same in all: `outstanding` messages in flight
//! (openraft: that many concurrent writes at the leader; tessera-order: a share at each
//! node).

use crate::raft::{Cluster, Place};
use crate::Latencies;
use anyhow::Result;
use serde::Serialize;
use tessera_lab::experiments::total_order::load::{order_run, Load};
use tessera_lab::experiments::total_order::net::{rx_addr, TwoSwitch};
use tessera_lab::net::{LinkSpec, Rate};
use tessera_order::Group;
use tessera_order_udp::Loss;

/// One pair of runs.
#[derive(Debug, Clone, Serialize)]
pub struct LabPoint {
    /// Nodes.
    pub nodes: usize,
    /// Message size.
    pub message_bytes: usize,
    /// Messages in flight in all.
    pub outstanding: usize,
    /// openraft: entries committed per second at the leader.
    pub openraft_per_s: f64,
    /// openraft: write latency at the leader.
    pub openraft_latency: Latencies,
    /// openraft: entries applied by the slowest node's state machine over the run, and by
    /// the fastest.
    pub openraft_applied: (u64, u64),
    /// tessera-order: messages UTO-delivered per second by the slowest node.
    pub order_per_s: f64,
    /// tessera-order: UTO latency at every node, median, microseconds.
    pub order_uto_us_median: f64,
    /// The same, 99th percentile.
    pub order_uto_us_p99: f64,
    /// tessera-order over openraft.
    pub ratio: f64,
}

/// Runs every node count and size, `seconds` a run, on a fresh network per node count.
pub fn run(
    nodes: &[usize],
    sizes: &[usize],
    outstanding: usize,
    seconds: f64,
) -> Result<Vec<LabPoint>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut link = LinkSpec::new(Rate::mbit(1000));
    // As the lab's total-order run: a jumbo frame fits the token bucket twice over.
    link.burst_bytes = Some(link.burst_bytes().max(2 * 9018));
    let mut points = Vec::new();
    for &n in nodes {
        let network = TwoSwitch::build(n, &link)?;
        let places = (0..n)
            .map(|i| {
                Some(Place {
                    namespace: network.namespace(i),
                    addr: rx_addr(i),
                })
            })
            .collect::<Vec<_>>();
        for &size in sizes {
            let cluster = runtime.block_on(Cluster::start_at(places.clone(), 4096))?;
            let (raft_rate, raft_latency) =
                runtime.block_on(cluster.closed_loop(size, outstanding, seconds))?;
            let applied = cluster.applied();
            runtime.block_on(cluster.shutdown());
            let load = Load::Closed {
                outstanding: outstanding.div_ceil(n) as u64,
            };
            let group = Group::all_to_all(n);
            let order = order_run(
                &network,
                &group,
                size,
                Some(9000),
                load,
                seconds,
                Loss::NONE,
            )?;
            anyhow::ensure!(
                order.orders_agree,
                "tessera-order: two nodes' orders differ"
            );
            let point = LabPoint {
                nodes: n,
                message_bytes: size,
                outstanding,
                openraft_per_s: raft_rate,
                openraft_latency: raft_latency,
                openraft_applied: (applied[0], applied[applied.len() - 1]),
                order_per_s: order.messages_per_s,
                order_uto_us_median: order.uto_latency_us_median,
                order_uto_us_p99: order.uto_latency_us_p99,
                ratio: order.messages_per_s / raft_rate.max(1.0),
            };
            eprintln!(
                "{n} nodes, {size} B: openraft {:.0}/s (median {:.0} us), tessera-order {:.0}/s \
                 (UTO median {:.0} us): {:.2}x",
                point.openraft_per_s,
                point.openraft_latency.median_us,
                point.order_per_s,
                point.order_uto_us_median,
                point.ratio
            );
            points.push(point);
        }
        network.teardown()?;
    }
    Ok(points)
}

/// The points as a Markdown table.
pub fn markdown(points: &[LabPoint]) -> String {
    let mut out = String::from(
        "| nodes | message B | outstanding | openraft msg/s | openraft median/p99 us | \
         tessera-order msg/s | tessera-order UTO median/p99 us | ratio |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for p in points {
        out += &format!(
            "| {} | {} | {} | {:.0} | {:.0} / {:.0} | {:.0} | {:.0} / {:.0} | {:.2} |\n",
            p.nodes,
            p.message_bytes,
            p.outstanding,
            p.openraft_per_s,
            p.openraft_latency.median_us,
            p.openraft_latency.p99_us,
            p.order_per_s,
            p.order_uto_us_median,
            p.order_uto_us_p99,
            p.ratio
        );
    }
    out
}
