//! `tessera lab calibrate`: at which link rates is this machine's testbed network-bound?
//!
//! For each rate: a raw TCP stream each way between the client and a server through the
//! `tbf` links, then Tessera itself (RAID-5 on three servers over TCP, a large file written
//! and read), each with the share of CPU time that was busy. Where the stream reaches the most
//! TCP can carry and Tessera's CPU use stays well below all of it, experiments at that rate
//! measure the network, not the machine.

use super::{calibrate, LabConfig, Limit, Testbed};
use crate::cluster::{Cluster, ClusterSpec, Transport};
use crate::job::{ClientJob, FileSpec, Op};
use crate::net::{LinkSpec, Network, Rate, RunPrefix, Topology, CLIENT_HOST};
use crate::results::{self, Cell, Figure, LinePanel, LineSeries, Panel, Table, XScale};
use crate::LabError;
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tessera_client::Scheme;

/// What to measure.
#[derive(Debug, Clone, Serialize)]
pub struct CalibrateConfig {
    /// Link rates to try.
    pub rates: Vec<Rate>,
    /// Seconds of the configured rate each raw stream carries.
    pub stream_seconds: f64,
    /// Bytes of the Tessera file (0: no Tessera measurement).
    pub tessera_bytes: u64,
    /// Servers of the Tessera cluster.
    pub servers: u32,
}

impl CalibrateConfig {
    /// The full sweep. It starts at 100 Mbit/s: below that, a large pipelined write queues
    /// longer than the client's request timeout (5 s, counted from when a request is queued)
    /// and the client gives its servers up as lost.
    pub fn full() -> CalibrateConfig {
        CalibrateConfig {
            rates: [100, 200, 500, 1000, 2000].map(Rate::mbit).to_vec(),
            stream_seconds: 2.0,
            tessera_bytes: 32 << 20,
            servers: 3,
        }
    }

    /// A shorter sweep.
    pub fn quick() -> CalibrateConfig {
        CalibrateConfig {
            rates: [100, 200, 1000].map(Rate::mbit).to_vec(),
            stream_seconds: 0.5,
            tessera_bytes: 8 << 20,
            servers: 3,
        }
    }
}

/// One measurement at one rate.
#[derive(Debug, Clone, Serialize)]
pub struct CalibrationRow {
    /// Configured link rate.
    pub rate_bits_per_s: u64,
    /// What was measured.
    pub measurement: String,
    /// Payload (user) bits per second achieved.
    pub bits_per_s: f64,
    /// As a share of the configured rate.
    pub fraction_of_link: f64,
    /// How busy the busier direction of the link was (frames' bytes over what the rate
    /// allows): measured for Tessera, from the payload for the raw stream.
    pub link_utilization: f64,
    /// Busy share of the CPUs meanwhile.
    pub cpu_busy: f64,
    /// CPU share busy just before this rate's measurements, with the network idle: load
    /// from outside the lab, which inflates `cpu_busy`.
    pub background_cpu_busy: f64,
    /// Frames the network's `tbf` queues dropped meanwhile.
    pub drops: u64,
    /// What limited it.
    pub limit: Limit,
}

/// The sweep's result.
#[derive(Debug, Clone, Serialize)]
pub struct CalibrateReport {
    /// "calibrate".
    pub experiment: &'static str,
    /// Version of this report's format.
    pub version: u32,
    /// When it started.
    pub started_unix_s: u64,
    /// How long it took.
    pub duration_s: f64,
    /// The testbed (its link rate is the first of the sweep's).
    pub testbed: Testbed,
    /// What was measured.
    pub config: CalibrateConfig,
    /// The measurements.
    pub rows: Vec<CalibrationRow>,
}

const STREAM_FROM: &str = "TCP stream from client";
const STREAM_TO: &str = "TCP stream to client";

/// Run the sweep; writes `DIR/calibrate.{json,csv,md,png}`.
pub fn run(
    lab: &LabConfig,
    config: &CalibrateConfig,
) -> Result<(CalibrateReport, Vec<PathBuf>), LabError> {
    let start = Instant::now();
    let started_unix_s = super::unix_time_s();
    let mut rows = Vec::new();
    for &rate in &config.rates {
        lab.cancel.check()?;
        let link = LinkSpec { rate, ..lab.link };
        let topology = Topology::cluster(RunPrefix::new(), config.servers, link)?;
        let network = Network::build(topology)?;
        let c = calibrate(
            &network,
            &link,
            CLIENT_HOST,
            "s1",
            config.stream_seconds,
            &lab.cancel,
        )?;
        let configured = rate.bits_per_s as f64;
        for (what, stream) in [
            (STREAM_FROM, &c.stream_from_client),
            (STREAM_TO, &c.stream_to_client),
        ] {
            let fraction = stream.bits_per_s / configured;
            let utilization = super::stream_utilization(fraction);
            rows.push(CalibrationRow {
                rate_bits_per_s: rate.bits_per_s,
                measurement: what.into(),
                bits_per_s: stream.bits_per_s,
                fraction_of_link: fraction,
                link_utilization: utilization,
                cpu_busy: stream.cpu_busy,
                background_cpu_busy: c.background_cpu_busy,
                drops: stream.drops,
                limit: Limit::classify(utilization, stream.cpu_busy),
            });
        }
        if config.tessera_bytes > 0 {
            let measured = measure_tessera(lab, config, &network, rate)?;
            rows.extend(measured.into_iter().map(|row| CalibrationRow {
                background_cpu_busy: c.background_cpu_busy,
                ..row
            }));
        }
        network.teardown()?;
        let mine: Vec<String> = rows
            .iter()
            .filter(|r| r.rate_bits_per_s == rate.bits_per_s)
            .map(|r| {
                format!(
                    "{} {:.2} of link, CPU {:.0}%",
                    r.measurement,
                    r.fraction_of_link,
                    r.cpu_busy * 100.0
                )
            })
            .collect();
        lab.say(&format!("{rate}: {}", mine.join("; ")));
    }
    let mut testbed_lab = lab.clone();
    if let Some(first) = config.rates.first() {
        testbed_lab.link.rate = *first;
    }
    let report = CalibrateReport {
        experiment: "calibrate",
        version: 1,
        started_unix_s,
        duration_s: start.elapsed().as_secs_f64(),
        testbed: Testbed::describe(&testbed_lab),
        config: config.clone(),
        rows,
    };
    let mut table = Table::new(&[
        "link rate",
        "measurement",
        "Mbit/s",
        "of link",
        "link busy",
        "CPU busy",
        "background CPU",
        "drops",
        "limit",
    ]);
    for r in &report.rows {
        table.push(vec![
            Rate {
                bits_per_s: r.rate_bits_per_s,
            }
            .to_string()
            .into(),
            r.measurement.clone().into(),
            Cell::float(r.bits_per_s / 1e6, 1),
            Cell::float(r.fraction_of_link, 3),
            Cell::float(r.link_utilization, 3),
            Cell::float(r.cpu_busy, 2),
            Cell::float(r.background_cpu_busy, 2),
            Cell::Int(r.drops as i64),
            r.limit.name().into(),
        ]);
    }
    let preamble = format!(
        "# Link-rate calibration\n\n{}\n\nAt each rate: one raw TCP stream each way between \
         the client and server 1, then Tessera ({} servers, RAID-5, TCP) writing and reading a \
         file of {} bytes. Rates are payload (user) bits per second; a TCP stream can carry at \
         most {:.3} of the link (1448 payload bytes per 1514-byte frame). \"link busy\" is the \
         busier direction of the client's link, its frames' bytes over what the rate allows \
         (measured from the interface's counters for Tessera); \"limit\" is network when that \
         reaches {}, cpu when the CPUs were {:.0}% busy. \"background CPU\" is the busy share \
         just before each rate's measurements, with the lab idle: other load on the machine, \
         included in \"CPU busy\". Took {:.0} s.",
        report.testbed.markdown(),
        config.servers,
        config.tessera_bytes,
        super::TCP_PAYLOAD_BYTES_MAX as f64 / crate::net::FRAME_BYTES_MAX as f64,
        super::NETWORK_BOUND_SHARE,
        super::CPU_BOUND_SHARE * 100.0,
        report.duration_s
    );
    let paths = results::write_outputs(
        &lab.out_dir,
        "calibrate",
        &report,
        &table,
        &preamble,
        &figure(&report),
    )?;
    Ok((report, paths))
}

fn measure_tessera(
    lab: &LabConfig,
    config: &CalibrateConfig,
    network: &Network,
    rate: Rate,
) -> Result<Vec<CalibrationRow>, LabError> {
    let spec = ClusterSpec::new(lab.exe.clone(), config.servers, Transport::Tcp);
    let mut cluster = Cluster::start(network, spec, &lab.cancel)?;
    let file = FileSpec {
        path: "lab/calibrate".into(),
        scheme: Scheme::Raid5,
        stripe_unit_bytes: 64 << 10,
        bytes: config.tessera_bytes,
        seed: 9,
        width: None,
    };
    // At a fiftieth of the rate something is broken; stop well before then.
    let timeout = Duration::from_secs_f64(
        config.tessera_bytes as f64 * 6.0 / (rate.bytes_per_s() / 50.0) + 60.0,
    );
    cluster.run_job(
        &ClientJob::Prepare {
            files: vec![file.clone()],
        },
        timeout,
    )?;
    let mut rows = Vec::new();
    for op in [Op::Write, Op::Read] {
        let measured = cluster.measure(std::slice::from_ref(&file), op, 2, timeout)?;
        rows.push({
            let mine: Vec<_> = measured.samples.iter().collect();
            let n = mine.len().max(1) as f64;
            let bits_per_s = mine.iter().map(|s| s.bytes_per_s() * 8.0).sum::<f64>() / n;
            let cpu_busy = mine.iter().map(|s| s.cpu_busy).sum::<f64>() / n;
            let fraction = bits_per_s / rate.bits_per_s as f64;
            let utilization = super::link_utilization(&mine, rate).unwrap_or(fraction);
            CalibrationRow {
                rate_bits_per_s: rate.bits_per_s,
                measurement: format!("tessera raid5 {}", op.name()),
                bits_per_s,
                fraction_of_link: fraction,
                link_utilization: utilization,
                cpu_busy,
                background_cpu_busy: 0.0,
                drops: measured.drops,
                limit: Limit::classify(utilization, cpu_busy),
            }
        });
    }
    Ok(rows)
}

fn figure(report: &CalibrateReport) -> Figure {
    let mut names: Vec<&str> = Vec::new();
    for r in &report.rows {
        if !names.contains(&r.measurement.as_str()) {
            names.push(&r.measurement);
        }
    }
    let x_max = report
        .config
        .rates
        .iter()
        .map(|r| r.bits_per_s as f64 / 1e6)
        .fold(1.0, f64::max);
    let lines = |value: fn(&CalibrationRow) -> f64| -> Vec<LineSeries> {
        names
            .iter()
            .enumerate()
            .map(|(color, name)| LineSeries {
                label: name.to_string(),
                color,
                dashed: false,
                points: report
                    .rows
                    .iter()
                    .filter(|r| r.measurement == *name)
                    .map(|r| (r.rate_bits_per_s as f64 / 1e6, value(r)))
                    .collect(),
            })
            .collect()
    };
    let panel = |title: &str, y_label: &str, series| {
        Panel::Lines(LinePanel {
            title: title.into(),
            x_label: "configured link rate (Mbit/s)".into(),
            y_label: y_label.into(),
            x_range: (0.0, x_max * 1.05),
            x_scale: XScale::Linear,
            y_range: (0.0, 1.1),
            series,
        })
    };
    Figure {
        title: "Link-rate calibration: network-bound or CPU-bound?".into(),
        rows: vec![vec![
            panel(
                "achieved / configured rate",
                "fraction of link",
                lines(|r| r.fraction_of_link),
            ),
            panel("CPU busy (all cores)", "busy share", lines(|r| r.cpu_busy)),
        ]],
        width_px: 1600,
        row_height_px: 500,
    }
}
