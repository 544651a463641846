//! `total-order`: Greenman's testbed (two switches joined by one link, every node sending
//! through the first and receiving through the second) in namespaces, with `tessera-order`
//! over `tessera-order-udp` multicast, measured side by side with a raw multicast UDP stream
//! through the same switches.
//!
//! For each message size: the raw stream (every node multicasting datagrams as fast as it
//! can; what the slowest receiver got), then the total order with a closed-loop load (each
//! node keeps a number of its messages proposed and not yet UTO-delivered, the thesis's
//! "as many as possible after each ACK") for each packing size (1500-byte or 9000-byte
//! packets, or aggregation off), then a paced load at a tenth of that throughput for the
//! latencies (PO and UTO, propose to delivery at every node, median and p99). Throughput is
//! what the slowest node UTO-delivered. Every node's order is compared at checkpoints.

pub mod app;
pub mod floor;
pub mod load;
pub mod net;
pub mod tables;

use super::{LabConfig, Testbed};
use crate::results::{
    self, BarPanel, BarSeries, Cell, Figure, LinePanel, LineSeries, Panel, Table, XScale,
};
use crate::LabError;
use load::{protocol_config, Load, OrderRun, RawStream};
use net::TwoSwitch;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;
use tables::{LossPoint, LossSide};
use tessera_order::Group;
use tessera_order_udp::Loss;

/// What to measure.
#[derive(Debug, Clone)]
pub struct TotalOrderConfig {
    /// Nodes.
    pub nodes: usize,
    /// `None`: every node sends and receives; `Some(s)`: nodes `0..s` only send and the
    /// others only receive (the thesis's tables 2 and 3).
    pub senders: Option<usize>,
    /// Message sizes, bytes.
    pub message_bytes: Vec<usize>,
    /// Packing sizes; `None`: aggregation off.
    pub mtus: Vec<Option<usize>>,
    /// Seconds of each throughput measurement.
    pub seconds: f64,
    /// Seconds of each latency measurement.
    pub latency_seconds: f64,
    /// Share of the measured throughput offered in the latency run.
    pub latency_load: f64,
    /// Own messages each node keeps outstanding in the throughput run.
    pub outstanding: u64,
    /// Shares of the measured throughput offered for the thesis's figure 5 (latency against
    /// load), with the largest packing size; empty: none.
    pub curve_loads: Vec<f64>,
    /// The thesis's table 4: artificial loss, with the largest message size and packing
    /// (`total-order-loss.*`); a point of probability 0 measures the no-loss row afresh
    /// (else the main table's line is the baseline); empty: none.
    pub losses: Vec<LossPoint>,
    /// The thesis's tables 2-3: every disjoint configuration of 1..=grid senders and
    /// receivers (`total-order-grid.*`); 0: none.
    pub grid: usize,
    /// Seconds of each grid point's throughput run (its latency run: half that).
    pub grid_seconds: f64,
}

impl TotalOrderConfig {
    /// The group the nodes form.
    pub fn group(&self) -> Result<Group, LabError> {
        match self.senders {
            None => Ok(Group::all_to_all(self.nodes)),
            Some(senders) if (1..self.nodes).contains(&senders) => {
                Ok(Group::disjoint(senders, self.nodes - senders))
            }
            Some(senders) => Err(LabError::BadValue {
                what: "number of senders",
                text: senders.to_string(),
                expected: "at least 1 and fewer than the nodes",
            }),
        }
    }

    /// Under a minute: 3 nodes, 64 B and 1 KiB, 9000-byte packing, 3 s per point, and one
    /// loss point (1% at the receivers) against the main table's 1 KiB line.
    pub fn quick() -> TotalOrderConfig {
        TotalOrderConfig {
            nodes: 3,
            senders: None,
            message_bytes: vec![64, 1024],
            mtus: vec![Some(9000)],
            seconds: 3.0,
            latency_seconds: 2.0,
            latency_load: 0.1,
            outstanding: 4096,
            curve_loads: Vec::new(),
            losses: vec![LossPoint {
                side: LossSide::Receivers,
                probability: 0.01,
            }],
            grid: 0,
            grid_seconds: 3.0,
        }
    }

    /// The full run: packing off, 1500 and 9000, 8 s per point; table 4 (no loss, 0.1% and
    /// 1% at the senders and at the receivers) and the 4 x 4 grid of tables 2-3, 3 s a point.
    pub fn full(nodes: usize) -> TotalOrderConfig {
        let point = |side, probability| LossPoint { side, probability };
        TotalOrderConfig {
            nodes,
            mtus: vec![None, Some(1500), Some(9000)],
            seconds: 8.0,
            latency_seconds: 4.0,
            curve_loads: vec![0.1, 0.3, 0.5, 0.7, 0.9],
            losses: vec![
                point(LossSide::Receivers, 0.0),
                point(LossSide::Senders, 0.001),
                point(LossSide::Senders, 0.01),
                point(LossSide::Receivers, 0.001),
                point(LossSide::Receivers, 0.01),
            ],
            grid: 4,
            ..TotalOrderConfig::quick()
        }
    }
}

/// One line of the results: a message size, a packing size, the raw stream beside it.
#[derive(Debug, Clone, Serialize)]
pub struct Line {
    /// The total order at full load.
    pub throughput: OrderRun,
    /// The total order at `latency_load` of that.
    pub latency: OrderRun,
    /// The raw stream of the same message size.
    pub raw: RawStream,
    /// Total order messages/s over the raw stream's.
    pub messages_ratio: f64,
    /// The raw stream of datagrams as large as the total order's packets.
    pub raw_packets: RawStream,
    /// Total order payload bits/s over that stream's.
    pub bits_ratio: f64,
    /// Latency against offered load (figure 5), for the largest packing size only.
    pub curve: Vec<CurvePoint>,
}

/// One point of the latency curve.
#[derive(Debug, Clone, Serialize)]
pub struct CurvePoint {
    /// Share of the closed-loop throughput offered.
    pub offered_share: f64,
    /// What the paced run delivered, and its latencies.
    pub run: OrderRun,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct TotalOrderReport {
    /// The machine and links.
    pub testbed: Testbed,
    /// Nodes.
    pub nodes: usize,
    /// Nodes that send (all of them, or the first ones only).
    pub senders: usize,
    /// Nodes that receive.
    pub receivers: usize,
    /// The 1-minute load average before the run (other work on the machine).
    pub load_average_before: f64,
    /// Round trip of a small datagram node 0 to node 1 and back through the switches,
    /// median, microseconds.
    pub rtt_us_median: f64,
    /// The same, 99th percentile.
    pub rtt_us_p99: f64,
    /// The same round trip with a millisecond between an answer and the next datagram (the
    /// CPUs idle between them, as in a paced latency run), median, microseconds.
    pub paced_rtt_us_median: f64,
    /// That, 99th percentile.
    pub paced_rtt_us_p99: f64,
    /// The machine's floor under the latencies: the protocol's patterns with raw datagrams
    /// (one multicast to every node, every node's answer to every node), one a millisecond;
    /// `None` with one node.
    pub floor: Option<floor::Floor>,
    /// The lines.
    pub lines: Vec<Line>,
    /// Seconds the run took.
    pub duration_s: f64,
}

/// Runs the experiment and writes `total-order.{json,csv,md,png}`.
pub fn run(
    lab: &LabConfig,
    config: &TotalOrderConfig,
) -> Result<(TotalOrderReport, Vec<PathBuf>), LabError> {
    let began = Instant::now();
    let group = config.group()?;
    let load_average_before = load_average();
    let mut link = lab.link;
    // A jumbo frame must fit the token bucket twice over.
    link.burst_bytes = Some(link.burst_bytes().max(2 * 9018));
    lab.say(&format!(
        "total-order: {} nodes through two bridges joined by one link ({}); load average {:.2}",
        config.nodes, link.rate, load_average_before
    ));
    let network = TwoSwitch::build(config.nodes, &link)?;
    let [rtt_us_median, rtt_us_p99, paced_rtt_us_median, paced_rtt_us_p99] = round_trips(&network)?;
    lab.say(&format!(
        "round trip through the switches: {rtt_us_median:.0} us median, {rtt_us_p99:.0} us \
         p99; one every millisecond: {paced_rtt_us_median:.0} us median, \
         {paced_rtt_us_p99:.0} us p99"
    ));
    let floor = (config.nodes > 1)
        .then(|| floor::measure(&network, 300))
        .transpose()?;
    if let Some(floor) = &floor {
        lab.say(&format!(
            "raw multicast from node 0 to every node, one a millisecond: received {:.0} us \
             median; every node's answer held {:.0} us median (the PO and UTO patterns without \
             the protocol)",
            floor.fan_out_us_median, floor.all_answered_us_median
        ));
    }
    let mut lines = Vec::new();
    for size in message_sizes(config) {
        lab.cancel.check()?;
        let raw = load::raw_stream(&network, &group, size, config.seconds)?;
        lab.say(&format!(
            "raw multicast, {size} B: {:.0} messages/s, {:.1} Mbit/s",
            raw.messages_per_s,
            raw.bits_per_s / 1e6
        ));
        for &mtu in &config.mtus {
            lab.cancel.check()?;
            let line = measure_line(lab, config, &network, &group, size, mtu, &raw, &lines)?;
            lines.push(line);
        }
    }
    let loss = tables::loss_table(lab, config, &network, &group, &link, &lines)?;
    network.teardown()?;
    let grid = tables::grid_table(lab, config, &link)?;
    let report = TotalOrderReport {
        testbed: Testbed::describe(&LabConfig {
            link,
            ..lab.clone()
        }),
        nodes: config.nodes,
        senders: group.roles.iter().filter(|r| r.sender).count(),
        receivers: group.receivers().len(),
        load_average_before,
        rtt_us_median,
        rtt_us_p99,
        paced_rtt_us_median,
        paced_rtt_us_p99,
        floor,
        lines,
        duration_s: began.elapsed().as_secs_f64(),
    };
    let paths = results::write_outputs(
        &lab.out_dir,
        "total-order",
        &report,
        &table(&report),
        &format!(
            "{}{}{}\n\nThroughput, and latency at {:.0}% load:",
            preamble(&report, config),
            targets_markdown(&report, config.latency_load),
            curve_markdown(&report),
            config.latency_load * 100.0
        ),
        &figure(&report),
    )?;
    let more = loss.into_iter().flat_map(|l| l.1);
    let paths = paths
        .into_iter()
        .chain(more)
        .chain(grid.into_iter().flat_map(|g| g.1))
        .collect();
    Ok((report, paths))
}

/// The environment variable that narrows a run to some message sizes (comma-separated
/// bytes, e.g. `1024`: a profile of one size's runs); unset: the config's sizes.
pub const SIZES_VARIABLE: &str = "TESSERA_LAB_ORDER_SIZES";

/// The message sizes to measure: [`SIZES_VARIABLE`]'s, if it parses, else the config's.
fn message_sizes(config: &TotalOrderConfig) -> Vec<usize> {
    let chosen: Option<Vec<usize>> = std::env::var(SIZES_VARIABLE).ok().and_then(|text| {
        text.split(',')
            .map(|size| size.trim().parse().ok())
            .collect()
    });
    chosen
        .filter(|sizes| !sizes.is_empty())
        .unwrap_or_else(|| config.message_bytes.clone())
}

/// The round trip's median and p99, back to back and one every millisecond (NaN with one
/// node).
fn round_trips(network: &TwoSwitch) -> Result<[f64; 4], LabError> {
    if network.nodes() < 2 {
        return Ok([f64::NAN; 4]);
    }
    let (median, p99) = load::echo(network, 200)?;
    let paced = load::echo_paced(network, 200, std::time::Duration::from_millis(1))?;
    Ok([median, p99, paced.0, paced.1])
}

/// One line: the closed-loop throughput, the paced latency run, and (for the largest
/// packing size) the latency curve; fails if two nodes' orders differ.
#[allow(clippy::too_many_arguments)]
fn measure_line(
    lab: &LabConfig,
    config: &TotalOrderConfig,
    network: &TwoSwitch,
    group: &Group,
    size: usize,
    mtu: Option<usize>,
    raw: &RawStream,
    lines: &[Line],
) -> Result<Line, LabError> {
    let packet_bytes = protocol_config(mtu).packet_bytes_max();
    let raw_packets = match lines
        .iter()
        .find(|l| l.raw_packets.message_bytes == packet_bytes)
    {
        Some(line) => line.raw_packets.clone(),
        None => load::raw_stream(network, group, packet_bytes, config.seconds)?,
    };
    let closed = Load::Closed {
        outstanding: config.outstanding,
    };
    let throughput = load::order_run(
        network,
        group,
        size,
        mtu,
        closed,
        config.seconds,
        Loss::NONE,
    )?;
    let senders = group.roles.iter().filter(|r| r.sender).count() as f64;
    let paced = |share: f64| -> Result<OrderRun, LabError> {
        lab.cancel.check()?;
        let rate = throughput.messages_per_s * share / senders;
        let load = Load::Paced {
            per_node_per_s: rate.max(100.0),
        };
        let seconds = config.latency_seconds;
        let run = load::order_run(network, group, size, mtu, load, seconds, Loss::NONE)?;
        if !run.orders_agree {
            return Err(load::order_fault(&run, size, mtu));
        }
        Ok(run)
    };
    let latency = paced(config.latency_load)?;
    lab.say(&format!(
        "total order, {size} B, packing {}: {:.0} messages/s ({:.2} of raw), {:.1} Mbit/s; at \
         {:.0}%: PO {}/{} us, UTO {}/{} us (median/p99); CPU busy {:.0}% and {:.0}% (the nodes \
         {:.0}% and {:.0}%), {:.2} core-s per million (the nodes {:.2})",
        packing_name(mtu),
        throughput.messages_per_s,
        throughput.messages_per_s / raw.messages_per_s.max(1.0),
        throughput.bits_per_s / 1e6,
        config.latency_load * 100.0,
        load::latency_text(latency.po_latency_us_median),
        load::latency_text(latency.po_latency_us_p99),
        load::latency_text(latency.uto_latency_us_median),
        load::latency_text(latency.uto_latency_us_p99),
        throughput.cpu_busy_share * 100.0,
        latency.cpu_busy_share * 100.0,
        throughput.process_cpu_share * 100.0,
        latency.process_cpu_share * 100.0,
        load::core_seconds_per_million(&throughput),
        load::process_core_seconds_per_million(&throughput),
    ));
    lab.say(&format!(
        "  {}",
        throughput
            .work
            .per_message(throughput.delivered_total, throughput.positions_replaced)
    ));
    if !throughput.orders_agree {
        return Err(load::order_fault(&throughput, size, mtu));
    }
    let mut curve = Vec::new();
    if mtu == config.mtus.iter().copied().max().flatten() {
        for &offered_share in &config.curve_loads {
            let run = paced(offered_share)?;
            lab.say(&format!(
                "  offered {:.0}%: delivered {:.0} messages/s, PO {} us, UTO {} us median",
                offered_share * 100.0,
                run.messages_per_s,
                load::latency_text(run.po_latency_us_median),
                load::latency_text(run.uto_latency_us_median)
            ));
            curve.push(CurvePoint { offered_share, run });
        }
    }
    Ok(Line {
        messages_ratio: throughput.messages_per_s / raw.messages_per_s.max(1.0),
        bits_ratio: throughput.bits_per_s / raw_packets.bits_per_s.max(1.0),
        raw_packets,
        throughput,
        latency,
        raw: raw.clone(),
        curve,
    })
}

pub(super) fn packing_name(mtu: Option<usize>) -> String {
    mtu.map_or("off".to_string(), |bytes| format!("{bytes} B"))
}

/// The 1-minute load average, or NaN where `/proc/loadavg` cannot be read.
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

fn table(report: &TotalOrderReport) -> Table {
    let mut table = Table::new(&[
        "message B",
        "packing",
        "raw UDP msg/s",
        "total order msg/s",
        "ratio",
        "total order Mbit/s",
        "raw UDP Mbit/s, packet-size datagrams",
        "ratio",
        "datagrams/msg",
        "PO median us",
        "PO p99 us",
        "UTO median us",
        "UTO p99 us",
        "retransmitted",
        "view changes",
        "CPU busy %, throughput / latency run",
        "nodes' CPU %, throughput / latency run",
        "core-s per million msgs",
        "PO / RTT",
        "UTO / (2 RTT + 100 us)",
    ]);
    for line in &report.lines {
        let (t, l) = (&line.throughput, &line.latency);
        let (po, uto) = latency_against_targets(l, report.rtt_us_median);
        table.push(vec![
            Cell::Int(t.message_bytes as i64),
            Cell::text(packing_name(t.mtu_bytes)),
            Cell::float(line.raw.messages_per_s, 0),
            Cell::float(t.messages_per_s, 0),
            Cell::float(line.messages_ratio, 2),
            Cell::float(t.bits_per_s / 1e6, 1),
            Cell::float(line.raw_packets.bits_per_s / 1e6, 1),
            Cell::float(line.bits_ratio, 2),
            Cell::float(t.datagrams_per_message, 3),
            load::latency_cell(l.po_latency_us_median),
            load::latency_cell(l.po_latency_us_p99),
            load::latency_cell(l.uto_latency_us_median),
            load::latency_cell(l.uto_latency_us_p99),
            Cell::Int((t.retransmitted + l.retransmitted) as i64),
            Cell::Int((t.view_changes + l.view_changes) as i64),
            Cell::text(format!(
                "{:.0} / {:.0}",
                t.cpu_busy_share * 100.0,
                l.cpu_busy_share * 100.0
            )),
            Cell::text(format!(
                "{:.0} / {:.0}",
                t.process_cpu_share * 100.0,
                l.process_cpu_share * 100.0
            )),
            Cell::float(load::core_seconds_per_million(t), 2),
            Cell::float(po, 2),
            Cell::float(uto, 2),
        ]);
    }
    table
}

/// The latency run's medians against issue 16's targets at 10% load, as ratios (<= 1: met):
/// PO within one round trip, UTO within two round trips and 100 us; `rtt_us` the measured
/// round trip through the switches. NaN where either is unknown.
pub fn latency_against_targets(latency: &OrderRun, rtt_us: f64) -> (f64, f64) {
    (
        latency.po_latency_us_median / rtt_us,
        latency.uto_latency_us_median / (2.0 * rtt_us + 100.0),
    )
}

/// One sentence per line on the latency targets, against the back-to-back and the paced
/// round trip.
fn targets_markdown(report: &TotalOrderReport, latency_load: f64) -> String {
    let verdict = |ratio: f64| match ratio {
        r if r.is_nan() => "not measured",
        r if r <= 1.0 => "met",
        _ => "not met",
    };
    let mut text = format!(
        "\n\nLatency targets at {:.0}% load (issue 16: PO median <= 1 round trip, UTO median \
         <= 2 round trips + 100 us), against the round trip back to back ({:.0} us; the \
         verdict) and paced ({:.0} us, one a millisecond, as the CPUs are in a paced run):",
        latency_load * 100.0,
        report.rtt_us_median,
        report.paced_rtt_us_median
    );
    if let Some(floor) = &report.floor {
        text.push_str(&format!(
            " the machine's floor, the same patterns with raw multicast datagrams one a \
             millisecond and no protocol: node 0's datagram at every node {:.0} us median (PO's \
             pattern), every node's answer to it at every node {:.0} us (UTO's).",
            floor.fan_out_us_median, floor.all_answered_us_median
        ));
    }
    for line in &report.lines {
        let l = &line.latency;
        let (po, uto) = latency_against_targets(l, report.rtt_us_median);
        let (po_paced, uto_paced) = latency_against_targets(l, report.paced_rtt_us_median);
        text.push_str(&format!(
            "\n- {} B, packing {}: PO {} us = {po:.1} round trips ({:.1} paced), {}; UTO {} \
             us = {uto:.2} of the bound ({uto_paced:.2} paced), {}.",
            l.message_bytes,
            packing_name(l.mtu_bytes),
            load::latency_text(l.po_latency_us_median),
            po_paced,
            verdict(po),
            load::latency_text(l.uto_latency_us_median),
            verdict(uto),
        ));
    }
    text
}

fn preamble(report: &TotalOrderReport, config: &TotalOrderConfig) -> String {
    format!(
        "# Total order through two switches\n\n{} Two bridges joined by one veth pair (the \
         sequencer link, `tbf` on its A-to-B end); each node sends on a TX veth into bridge A \
         and receives on an RX veth out of bridge B, ports isolated, multicast. {} nodes: {}. \
         Load average before the run: {:.2}. A small datagram's \
         round trip node 0 to node 1 and back through the switches: {:.0} us median, {:.0} us \
         p99 (back to back), {:.0} us median, {:.0} us p99 (one every millisecond).\n\n\"raw UDP\": every \
         sender multicasts datagrams of the message size as fast as it can for {} s, no order \
         and no recovery; messages/s at the slowest receiver. \"total order\": tessera-order \
         over tessera-order-udp, each sender keeping {} own messages outstanding (one that \
         only sends, as many as its driver's backlog holds), messages/s UTO-delivered by the \
         slowest receiver over {} s; \"ratio\" is the one over the other. The \
         second raw stream sends datagrams as large as the total order's packets (packing \
         off: 1472 bytes), the most payload the machine moves through the switches; its ratio \
         compares payload bits/s. \
         Latencies from a second run offered {:.0}% of that throughput (paced, every \
         millisecond a batch), from the proposer's hand-off to the driver to the delivery at \
         every receiver. Every receiver's order was compared block by block (1,024 positions; a \
         block cut by a receiver's state transfer, `Event::Gap`, is left out) and agreed. Took \
         {:.0} s.",
        testbed_markdown(&report.testbed),
        report.nodes,
        if report.senders == report.nodes && report.receivers == report.nodes {
            "each a sender and a receiver".to_string()
        } else {
            format!(
                "{} only send, {} only receive",
                report.senders, report.receivers
            )
        },
        report.load_average_before,
        report.rtt_us_median,
        report.rtt_us_p99,
        report.paced_rtt_us_median,
        report.paced_rtt_us_p99,
        config.seconds,
        config.outstanding,
        config.seconds,
        config.latency_load * 100.0,
        report.duration_s
    )
}

/// The testbed's paragraph, for two bridges with jumbo frames.
pub(super) fn testbed_markdown(testbed: &Testbed) -> String {
    testbed
        .markdown()
        .replace("on one bridge", "on two bridges")
        .replace(
            &format!("frames are at most {} bytes", testbed.frame_bytes),
            &format!("frames are at most {} bytes", net::LINK_MTU + 14),
        )
}

fn figure(report: &TotalOrderReport) -> Figure {
    let groups: Vec<String> = report
        .lines
        .iter()
        .map(|l| {
            format!(
                "{} B, {}",
                l.throughput.message_bytes,
                packing_name(l.throughput.mtu_bytes)
            )
        })
        .collect();
    // Thousands, so that the axis labels stay short.
    let top = report
        .lines
        .iter()
        .map(|l| l.raw.messages_per_s.max(l.throughput.messages_per_s) / 1e3)
        .fold(1.0, f64::max);
    let series = |label: &str, color: usize, value: fn(&Line) -> f64| BarSeries {
        label: label.to_string(),
        color,
        values: report.lines.iter().map(|l| Some(value(l) / 1e3)).collect(),
    };
    let mut rows = vec![vec![Panel::Bars(BarPanel {
        title: "messages/s at the slowest receiver".into(),
        y_label: "thousand messages/s".into(),
        y_range: (0.0, top * 1.1),
        groups,
        series: vec![
            series("raw UDP multicast", 0, |l| l.raw.messages_per_s),
            series("UTO-delivered", 1, |l| l.throughput.messages_per_s),
        ],
    })]];
    if let Some(curve) = curve_panel(report) {
        rows.push(vec![Panel::Lines(curve)]);
    }
    Figure {
        title: format!(
            "Total order, {} senders, {} receivers, two switches",
            report.senders, report.receivers
        ),
        rows,
        width_px: 900,
        row_height_px: 420,
    }
}

/// The thesis's figure 5: median PO and UTO latency against the delivered throughput.
fn curve_panel(report: &TotalOrderReport) -> Option<LinePanel> {
    let curves: Vec<&Line> = report
        .lines
        .iter()
        .filter(|l| !l.curve.is_empty())
        .collect();
    if curves.is_empty() {
        return None;
    }
    let mut series = Vec::new();
    for (i, line) in curves.iter().enumerate() {
        for (kind, dashed, pick) in [
            (
                "PO",
                true,
                (|r: &OrderRun| r.po_latency_us_median) as fn(&OrderRun) -> f64,
            ),
            ("UTO", false, |r: &OrderRun| r.uto_latency_us_median),
        ] {
            series.push(LineSeries {
                label: format!("{kind}, {} B", line.throughput.message_bytes),
                color: i,
                dashed,
                points: line
                    .curve
                    .iter()
                    .map(|p| (p.run.bits_per_s / 1e6, pick(&p.run)))
                    .collect(),
            });
        }
    }
    let x_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold(1.0, f64::max);
    let y_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(1.0, f64::max);
    Some(LinePanel {
        title: "latency against load (figure 5), largest packing".into(),
        x_label: "delivered Mbit/s".into(),
        y_label: "median latency, us".into(),
        x_range: (0.0, x_max * 1.05),
        x_scale: XScale::Linear,
        y_range: (0.0, y_max * 1.1),
        series,
    })
}

/// The curve as a Markdown table, or nothing.
fn curve_markdown(report: &TotalOrderReport) -> String {
    let mut out = String::new();
    for line in report.lines.iter().filter(|l| !l.curve.is_empty()) {
        out += &format!(
            "\n\nLatency against load (the thesis's figure 5), {} B messages, packing {}:\n\n\
             | offered | delivered msg/s | Mbit/s | PO median us | PO p99 us | UTO median us | UTO p99 us |\n\
             |---:|---:|---:|---:|---:|---:|---:|\n",
            line.throughput.message_bytes,
            packing_name(line.throughput.mtu_bytes)
        );
        for point in &line.curve {
            let r = &point.run;
            out += &format!(
                "| {:.0}% | {:.0} | {:.1} | {} | {} | {} | {} |\n",
                point.offered_share * 100.0,
                r.messages_per_s,
                r.bits_per_s / 1e6,
                load::latency_text(r.po_latency_us_median),
                load::latency_text(r.po_latency_us_p99),
                load::latency_text(r.uto_latency_us_median),
                load::latency_text(r.uto_latency_us_p99)
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_all_to_all_or_disjoint() {
        let mut config = TotalOrderConfig::quick();
        assert_eq!(config.group().unwrap(), Group::all_to_all(3));
        config.nodes = 5;
        config.senders = Some(2);
        let group = config.group().unwrap();
        assert_eq!(group, Group::disjoint(2, 3));
        assert_eq!(group.receivers().len(), 3);
        for senders in [0, 5, 6] {
            config.senders = Some(senders);
            assert!(config.group().is_err(), "{senders} senders of 5 nodes");
        }
    }

    #[test]
    fn quick_stays_small() {
        let quick = TotalOrderConfig::quick();
        let points = quick.message_bytes.len() * quick.mtus.len();
        // Per size a raw stream and per line two runs with warm-ups: well under a minute.
        assert!(points <= 2 && quick.seconds <= 3.0 && quick.latency_seconds <= 2.0);
        // Table 4 adds one point against the main table's line; no grid.
        assert_eq!(quick.losses.len(), 1);
        assert!(quick.losses[0].probability > 0.0);
        assert_eq!(quick.grid, 0);
    }
}
