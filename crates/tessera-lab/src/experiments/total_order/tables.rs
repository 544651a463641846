//! The thesis's table 4 (artificial loss at the senders or at the receivers) and tables 2-3
//! (disjoint senders and receivers, 1-4 x 1-4), each written to files of its own beside
//! `total-order.*`: `total-order-loss.*` and `total-order-grid.*`.
//!
//! Loss is dropped in user space by the drivers ([`tessera_order_udp::Loss`]), per datagram:
//! at the senders a dropped multicast datagram reaches no receiver (every preliminary order
//! stays the same; only the sender's retransmission is owed), at the receivers each one
//! misses datagrams of its own (orders differ and the leader's order takes over where they
//! do). With packing a datagram carries many messages, so a share of datagrams lost is not
//! the same share of messages lost.

use super::load::{self, Load, NodeLoss, OrderRun};
use super::net::TwoSwitch;
use super::{load_average, packing_name, testbed_markdown, Line, TotalOrderConfig};
use crate::experiments::{LabConfig, Testbed};
use crate::net::LinkSpec;
use crate::results::{self, BarPanel, BarSeries, Cell, Figure, Panel, Table};
use crate::LabError;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;
use tessera_order::Group;
use tessera_order_udp::Loss;

/// Seed of the drops (each node adds its number).
const LOSS_SEED: u64 = 0x7e55_e7a4;

/// Where datagrams are dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum LossSide {
    /// By each sender, before sending: no receiver gets the datagram.
    Senders,
    /// By each receiver, after receiving: only that receiver misses it.
    Receivers,
    /// By this node only, after receiving: node 0 is view 0's leader, whose own loss the
    /// members repair by following its order (the other nodes lose nothing).
    Node(u16),
}

/// One point of table 4.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LossPoint {
    /// Where.
    pub side: LossSide,
    /// Share of datagrams dropped; 0: the baseline, measured afresh.
    pub probability: f64,
}

impl LossPoint {
    /// The drivers' setting, for every node alike (a [`LossSide::Node`] point: none).
    pub fn loss(&self) -> Loss {
        let (send, receive) = match self.side {
            LossSide::Senders => (self.probability, 0.0),
            LossSide::Receivers => (0.0, self.probability),
            LossSide::Node(_) => (0.0, 0.0),
        };
        Loss {
            send,
            receive,
            seed: LOSS_SEED,
        }
    }

    /// The drivers' setting, for every node or, on [`LossSide::Node`], one only.
    pub fn node_loss(&self) -> NodeLoss {
        match self.side {
            LossSide::Node(node) => NodeLoss {
                loss: Loss {
                    receive: self.probability,
                    ..self.loss()
                },
                only: Some(usize::from(node)),
            },
            _ => self.loss().into(),
        }
    }

    fn name(&self) -> String {
        if self.probability == 0.0 {
            return "none".into();
        }
        let side = match self.side {
            LossSide::Senders => "senders".to_string(),
            LossSide::Receivers => "receivers".to_string(),
            LossSide::Node(node) => format!("node {node}'s receiver"),
        };
        format!("{side} {}%", self.probability * 100.0)
    }
}

impl std::str::FromStr for LossPoint {
    type Err = String;

    /// `senders:P`, `receivers:P` or `nodeN:P` (node N's receiver only), P the percent of
    /// datagrams dropped (0 to 100).
    fn from_str(text: &str) -> Result<LossPoint, String> {
        let bad =
            || format!("{text:?}: expected senders:PERCENT, receivers:PERCENT or nodeN:PERCENT");
        let (side, percent) = text.split_once(':').ok_or_else(bad)?;
        let side = match side {
            "senders" => LossSide::Senders,
            "receivers" => LossSide::Receivers,
            _ => match side.strip_prefix("node").map(str::parse) {
                Some(Ok(node)) => LossSide::Node(node),
                _ => return Err(bad()),
            },
        };
        let percent: f64 = percent.parse().map_err(|_| bad())?;
        if !(0.0..=100.0).contains(&percent) {
            return Err(bad());
        }
        Ok(LossPoint {
            side,
            probability: percent / 100.0,
        })
    }
}

/// A throughput run and a paced latency run at `share` of it, with `loss`; fails if two
/// receivers' orders differ.
#[allow(clippy::too_many_arguments)]
pub(super) fn measure(
    lab: &LabConfig,
    network: &TwoSwitch,
    group: &Group,
    config: &TotalOrderConfig,
    size: usize,
    mtu: Option<usize>,
    seconds: (f64, f64),
    loss: NodeLoss,
) -> Result<(OrderRun, OrderRun), LabError> {
    lab.cancel.check()?;
    let closed = Load::Closed {
        outstanding: config.outstanding,
    };
    let throughput = load::order_run(network, group, size, mtu, closed, seconds.0, loss)?;
    lab.cancel.check()?;
    let senders = group.roles.iter().filter(|r| r.sender).count() as f64;
    let paced = Load::Paced {
        per_node_per_s: (throughput.messages_per_s * config.latency_load / senders).max(100.0),
    };
    let latency = load::order_run(network, group, size, mtu, paced, seconds.1, loss)?;
    for run in [&throughput, &latency] {
        if !run.orders_agree {
            return Err(load::order_fault(run, size, mtu));
        }
    }
    Ok((throughput, latency))
}

/// One row of table 4.
#[derive(Debug, Clone, Serialize)]
pub struct LossRow {
    /// The loss (probability 0: none).
    pub point: LossPoint,
    /// Closed-loop throughput.
    pub throughput: OrderRun,
    /// Paced at the latency share of this row's throughput.
    pub latency: OrderRun,
    /// Throughput over the no-loss row's.
    pub throughput_ratio: f64,
}

/// Table 4.
#[derive(Debug, Clone, Serialize)]
pub struct LossReport {
    /// The machine and links.
    pub testbed: Testbed,
    /// Nodes, senders, receivers.
    pub nodes: usize,
    /// Nodes that send.
    pub senders: usize,
    /// Nodes that receive.
    pub receivers: usize,
    /// Message size.
    pub message_bytes: usize,
    /// Packing.
    pub mtu_bytes: Option<usize>,
    /// 1-minute load average before the first loss run.
    pub load_average_before: f64,
    /// Whether the no-loss row was measured afresh beside the others (else: the main
    /// table's line of the same size and packing, measured earlier in the run).
    pub baseline_fresh: bool,
    /// The rows, no loss first.
    pub rows: Vec<LossRow>,
    /// Seconds the loss runs took.
    pub duration_s: f64,
}

/// Table 4 on the main run's network with the largest message size and packing: one row per
/// point of `config.losses`; the no-loss row is the point of probability 0 if there is one,
/// else the main table's line.
pub(super) fn loss_table(
    lab: &LabConfig,
    config: &TotalOrderConfig,
    network: &TwoSwitch,
    group: &Group,
    link: &LinkSpec,
    lines: &[Line],
) -> Result<Option<(LossReport, Vec<PathBuf>)>, LabError> {
    let (Some(&size), Some(&mtu)) = (config.message_bytes.iter().max(), config.mtus.iter().max())
    else {
        return Ok(None);
    };
    if config.losses.is_empty() {
        return Ok(None);
    }
    let began = Instant::now();
    let load_average_before = load_average();
    let mut rows: Vec<LossRow> = Vec::new();
    let main = lines
        .iter()
        .find(|l| l.throughput.message_bytes == size && l.throughput.mtu_bytes == mtu);
    let baseline_fresh = config.losses.iter().any(|p| p.probability == 0.0);
    if let (false, Some(line)) = (baseline_fresh, main) {
        rows.push(LossRow {
            point: LossPoint {
                side: LossSide::Receivers,
                probability: 0.0,
            },
            throughput: line.throughput.clone(),
            latency: line.latency.clone(),
            throughput_ratio: 1.0,
        });
    }
    for point in &config.losses {
        if let LossSide::Node(node) = point.side {
            if usize::from(node) >= config.nodes {
                return Err(LabError::BadValue {
                    what: "node of a loss point",
                    text: node.to_string(),
                    expected: "a node of the run",
                });
            }
        }
        let seconds = (config.seconds, config.latency_seconds);
        let (throughput, latency) = measure(
            lab,
            network,
            group,
            config,
            size,
            mtu,
            seconds,
            point.node_loss(),
        )?;
        lab.say(&format!(
            "loss {}: {:.0} messages/s, UTO {}/{} us (median/p99), {} datagrams dropped, \
             {} retransmitted, {} positions replaced",
            point.name(),
            throughput.messages_per_s,
            load::latency_text(latency.uto_latency_us_median),
            load::latency_text(latency.uto_latency_us_p99),
            throughput.dropped + latency.dropped,
            throughput.retransmitted,
            throughput.positions_replaced,
        ));
        lab.say(&format!(
            "  {}; nodes' CPU {:.1} core-s per million delivered",
            throughput
                .work
                .per_message(throughput.delivered_total, throughput.positions_replaced),
            load::process_core_seconds_per_million(&throughput),
        ));
        rows.push(LossRow {
            point: *point,
            throughput,
            latency,
            throughput_ratio: f64::NAN,
        });
    }
    rows.sort_by(|a, b| {
        (a.point.probability == 0.0)
            .cmp(&(b.point.probability == 0.0))
            .reverse()
    });
    let base = rows[0].throughput.messages_per_s.max(1.0);
    for row in &mut rows {
        row.throughput_ratio = row.throughput.messages_per_s / base;
    }
    let report = LossReport {
        testbed: Testbed::describe(&LabConfig {
            link: *link,
            ..lab.clone()
        }),
        nodes: group.roles.len(),
        senders: group.roles.iter().filter(|r| r.sender).count(),
        receivers: group.receivers().len(),
        message_bytes: size,
        mtu_bytes: mtu,
        load_average_before,
        baseline_fresh,
        rows,
        duration_s: began.elapsed().as_secs_f64(),
    };
    let paths = results::write_outputs(
        &lab.out_dir,
        "total-order-loss",
        &report,
        &loss_rows(&report),
        &loss_preamble(&report, config),
        &loss_figure(&report),
    )?;
    Ok(Some((report, paths)))
}

fn loss_rows(report: &LossReport) -> Table {
    let mut table = Table::new(&[
        "loss",
        "total order msg/s",
        "Mbit/s",
        "of no loss",
        "PO median us",
        "UTO median us",
        "UTO p99 us",
        "dropped",
        "retransmitted",
        "positions replaced",
        "view changes",
        "pauses",
        "datagrams received per msg",
        "nodes' core-s per million msgs",
    ]);
    for row in &report.rows {
        let (t, l) = (&row.throughput, &row.latency);
        let received = t.work.datagrams_received as f64 / t.delivered_total.max(1) as f64;
        table.push(vec![
            Cell::text(row.point.name()),
            Cell::float(t.messages_per_s, 0),
            Cell::float(t.bits_per_s / 1e6, 1),
            Cell::float(row.throughput_ratio, 2),
            load::latency_cell(l.po_latency_us_median),
            load::latency_cell(l.uto_latency_us_median),
            load::latency_cell(l.uto_latency_us_p99),
            Cell::Int((t.dropped + l.dropped) as i64),
            Cell::Int((t.retransmitted + l.retransmitted) as i64),
            Cell::Int((t.positions_replaced + l.positions_replaced) as i64),
            Cell::Int((t.view_changes + l.view_changes) as i64),
            Cell::Int(t.work.pauses as i64),
            Cell::float(received, 3),
            Cell::float(load::process_core_seconds_per_million(t), 1),
        ]);
    }
    table
}

fn loss_preamble(report: &LossReport, config: &TotalOrderConfig) -> String {
    let unmeasured = report.rows.iter().any(|row| row.latency.uto_samples == 0);
    let note = if unmeasured {
        format!(
            " A latency of n/a: that row's latency run UTO-delivered no message in its \
             measured {} s (a stall as long as the run), so there was none to measure.",
            config.latency_seconds
        )
    } else {
        String::new()
    };
    format!(
        "# Total order with artificial loss (the thesis's table 4)\n\n{} {} nodes ({} send, {} \
         receive), {}-byte messages, packing {}. Load average before: {:.2}. Each driver \
         drops a seeded share of the datagrams it sends (\"senders\": no receiver gets them) or \
         of those it receives (\"receivers\": each misses its own), every kind of datagram \
         alike; with packing a datagram holds many messages. Throughput closed-loop over {} \
         s, latency at {:.0}% of each row's throughput over {} s. The no-loss row was {}. \
         Pauses: times a receiver stopped appending after it learnt of a loss; datagrams \
         received and the nodes' CPU (this process's core-seconds: drivers, applications and \
         the kernel work charged to them) per message UTO-delivered, of the throughput run. \
         Every receiver's order agreed. Took {:.0} s.{}",
        testbed_markdown(&report.testbed),
        report.nodes,
        report.senders,
        report.receivers,
        report.message_bytes,
        packing_name(report.mtu_bytes),
        report.load_average_before,
        config.seconds,
        config.latency_load * 100.0,
        config.latency_seconds,
        if report.baseline_fresh {
            "measured beside the others"
        } else {
            "the main table's line (measured earlier in the run)"
        },
        report.duration_s,
        note,
    )
}

fn loss_figure(report: &LossReport) -> Figure {
    let top = report
        .rows
        .iter()
        .map(|r| r.throughput.messages_per_s / 1e3)
        .fold(1.0, f64::max);
    Figure {
        title: format!(
            "Total order with loss, {} B messages, packing {}",
            report.message_bytes,
            packing_name(report.mtu_bytes)
        ),
        rows: vec![vec![Panel::Bars(BarPanel {
            title: "messages/s UTO-delivered at the slowest receiver".into(),
            y_label: "thousand messages/s".into(),
            y_range: (0.0, top * 1.1),
            groups: report.rows.iter().map(|r| r.point.name()).collect(),
            series: vec![BarSeries {
                label: "UTO-delivered".into(),
                color: 1,
                values: report
                    .rows
                    .iter()
                    .map(|r| Some(r.throughput.messages_per_s / 1e3))
                    .collect(),
            }],
        })]],
        width_px: 900,
        row_height_px: 420,
    }
}

/// One point of tables 2-3.
#[derive(Debug, Clone, Serialize)]
pub struct GridPoint {
    /// Nodes that only send.
    pub senders: usize,
    /// Nodes that only receive.
    pub receivers: usize,
    /// Closed-loop throughput.
    pub throughput: OrderRun,
    /// Paced latency run.
    pub latency: OrderRun,
}

/// Tables 2-3.
#[derive(Debug, Clone, Serialize)]
pub struct GridReport {
    /// The machine and links.
    pub testbed: Testbed,
    /// Message size.
    pub message_bytes: usize,
    /// Packing.
    pub mtu_bytes: Option<usize>,
    /// 1-minute load average before and after.
    pub load_average_before: f64,
    /// The same, after.
    pub load_average_after: f64,
    /// The points.
    pub points: Vec<GridPoint>,
    /// Seconds it took.
    pub duration_s: f64,
}

/// Tables 2-3: every disjoint configuration of 1..=`config.grid` senders and as many
/// receivers, the largest message size and packing, `config.grid_seconds` per point, one
/// network per number of nodes.
pub(super) fn grid_table(
    lab: &LabConfig,
    config: &TotalOrderConfig,
    link: &LinkSpec,
) -> Result<Option<(GridReport, Vec<PathBuf>)>, LabError> {
    let (Some(&size), Some(&mtu)) = (config.message_bytes.iter().max(), config.mtus.iter().max())
    else {
        return Ok(None);
    };
    if config.grid == 0 {
        return Ok(None);
    }
    let began = Instant::now();
    let load_average_before = load_average();
    let mut points = Vec::new();
    for nodes in 2..=2 * config.grid {
        let network = TwoSwitch::build(nodes, link)?;
        for senders in (1..nodes).filter(|s| *s <= config.grid && nodes - s <= config.grid) {
            let group = Group::disjoint(senders, nodes - senders);
            let seconds = (config.grid_seconds, config.grid_seconds / 2.0);
            let (throughput, latency) = measure(
                lab,
                &network,
                &group,
                config,
                size,
                mtu,
                seconds,
                Loss::NONE.into(),
            )?;
            lab.say(&format!(
                "{senders} senders x {} receivers: {:.0} messages/s, {:.1} Mbit/s, UTO {} us \
                 median",
                nodes - senders,
                throughput.messages_per_s,
                throughput.bits_per_s / 1e6,
                load::latency_text(latency.uto_latency_us_median)
            ));
            points.push(GridPoint {
                senders,
                receivers: nodes - senders,
                throughput,
                latency,
            });
        }
        network.teardown()?;
    }
    points.sort_by_key(|p| (p.senders, p.receivers));
    let report = GridReport {
        testbed: Testbed::describe(&LabConfig {
            link: *link,
            ..lab.clone()
        }),
        message_bytes: size,
        mtu_bytes: mtu,
        load_average_before,
        load_average_after: load_average(),
        points,
        duration_s: began.elapsed().as_secs_f64(),
    };
    let paths = results::write_outputs(
        &lab.out_dir,
        "total-order-grid",
        &report,
        &grid_rows(&report),
        &grid_preamble(&report, config),
        &grid_figure(&report, config.grid),
    )?;
    Ok(Some((report, paths)))
}

fn grid_rows(report: &GridReport) -> Table {
    let mut table = Table::new(&[
        "senders",
        "receivers",
        "total order msg/s",
        "Mbit/s",
        "PO median us",
        "UTO median us",
        "UTO p99 us",
        "retransmitted",
        "view changes",
    ]);
    for p in &report.points {
        let (t, l) = (&p.throughput, &p.latency);
        table.push(vec![
            Cell::Int(p.senders as i64),
            Cell::Int(p.receivers as i64),
            Cell::float(t.messages_per_s, 0),
            Cell::float(t.bits_per_s / 1e6, 1),
            load::latency_cell(l.po_latency_us_median),
            load::latency_cell(l.uto_latency_us_median),
            load::latency_cell(l.uto_latency_us_p99),
            Cell::Int((t.retransmitted + l.retransmitted) as i64),
            Cell::Int((t.view_changes + l.view_changes) as i64),
        ]);
    }
    table
}

/// A senders x receivers matrix of `value` in Markdown, as the thesis prints tables 2-3.
fn matrix(report: &GridReport, grid: usize, value: fn(&GridPoint) -> String) -> String {
    let mut out = String::from("| senders \\ receivers |");
    out += &(1..=grid).map(|r| format!(" {r} |")).collect::<String>();
    out += "\n|---|";
    out += &"---:|".repeat(grid);
    for senders in 1..=grid {
        out += &format!("\n| {senders} |");
        for receivers in 1..=grid {
            let cell = report
                .points
                .iter()
                .find(|p| p.senders == senders && p.receivers == receivers)
                .map_or(String::new(), value);
            out += &format!(" {cell} |");
        }
    }
    out
}

fn grid_preamble(report: &GridReport, config: &TotalOrderConfig) -> String {
    format!(
        "# Total order, disjoint senders and receivers (the thesis's tables 2 and 3)\n\n{} \
         {}-byte messages, packing {}; each point closed-loop for {} s (throughput at the \
         slowest receiver), then paced at {:.0}% of that for {} s (latency). Load average \
         {:.2} before, {:.2} after. Every receiver's order agreed. Took {:.0} s.\n\n\
         Throughput, Mbit/s (table 2):\n\n{}\n\nUTO latency at {:.0}% load, median us (table 3):\
         \n\n{}\n\nEvery point:",
        testbed_markdown(&report.testbed),
        report.message_bytes,
        packing_name(report.mtu_bytes),
        config.grid_seconds,
        config.latency_load * 100.0,
        config.grid_seconds / 2.0,
        report.load_average_before,
        report.load_average_after,
        report.duration_s,
        matrix(report, config.grid, |p| format!(
            "{:.1}",
            p.throughput.bits_per_s / 1e6
        )),
        config.latency_load * 100.0,
        matrix(report, config.grid, |p| format!(
            "{:.0}",
            p.latency.uto_latency_us_median
        )),
    )
}

fn grid_figure(report: &GridReport, grid: usize) -> Figure {
    let top = report
        .points
        .iter()
        .map(|p| p.throughput.bits_per_s / 1e6)
        .fold(1.0, f64::max);
    let series = (1..=grid)
        .map(|receivers| BarSeries {
            label: format!("{receivers} receivers"),
            color: receivers - 1,
            values: (1..=grid)
                .map(|senders| {
                    report
                        .points
                        .iter()
                        .find(|p| p.senders == senders && p.receivers == receivers)
                        .map(|p| p.throughput.bits_per_s / 1e6)
                })
                .collect(),
        })
        .collect();
    Figure {
        title: format!(
            "Total order, disjoint senders and receivers, {} B messages, packing {}",
            report.message_bytes,
            packing_name(report.mtu_bytes)
        ),
        rows: vec![vec![Panel::Bars(BarPanel {
            title: "Mbit/s UTO-delivered at the slowest receiver".into(),
            y_label: "Mbit/s".into(),
            y_range: (0.0, top * 1.1),
            groups: (1..=grid).map(|s| format!("{s} senders")).collect(),
            series,
        })]],
        width_px: 900,
        row_height_px: 420,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_drops_on_its_side_only() {
        let senders = LossPoint {
            side: LossSide::Senders,
            probability: 0.01,
        };
        assert_eq!((senders.loss().send, senders.loss().receive), (0.01, 0.0));
        let receivers = LossPoint {
            side: LossSide::Receivers,
            ..senders
        };
        assert_eq!(
            (receivers.loss().send, receivers.loss().receive),
            (0.0, 0.01)
        );
        assert_eq!(receivers.name(), "receivers 1%");
        let leader: LossPoint = "node0:1".parse().unwrap();
        assert_eq!(leader.side, LossSide::Node(0));
        let at = |node| leader.node_loss().at(node);
        assert_eq!((at(0).receive, at(0).send), (0.01, 0.0));
        assert_eq!((at(1).receive, at(1).send), (0.0, 0.0));
        assert_ne!(at(0).seed, at(2).seed);
        assert_eq!(receivers.node_loss().at(3).receive, 0.01);
        assert_eq!(leader.name(), "node 0's receiver 1%");
        assert!("nodex:1".parse::<LossPoint>().is_err());
        assert_eq!(
            LossPoint {
                probability: 0.0,
                ..senders
            }
            .name(),
            "none"
        );
        assert_eq!("senders:1".parse::<LossPoint>(), Ok(senders));
        assert_eq!(
            "receivers:0.1".parse::<LossPoint>().unwrap().probability,
            0.001
        );
        for bad in [
            "senders",
            "both:1",
            "receivers:x",
            "senders:-1",
            "senders:101",
        ] {
            assert!(bad.parse::<LossPoint>().is_err(), "{bad}");
        }
    }
}
