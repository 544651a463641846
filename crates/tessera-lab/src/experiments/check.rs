//! `tessera lab check`: the smoke test. Build a network, echo from the client to every host
//! across the bridge and its `tbf` ports, calibrate briefly, start a cluster, store a file and
//! read it back (compared byte for byte), stop everything and check that nothing is left.

use super::{calibrate, Calibration, LabConfig, Testbed};
use crate::cluster::{Cluster, ClusterSpec, Transport};
use crate::job::{ClientJob, ClientReport, FileSpec};
use crate::net::{Network, RunPrefix, Topology, CLIENT_HOST};
use crate::probe::{self, EchoStats};
use crate::results::{self, BarPanel, BarSeries, Cell, Figure, Panel, Table};
use crate::LabError;
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tessera_client::Scheme;

/// What the check does.
#[derive(Debug, Clone)]
pub struct CheckConfig {
    /// Servers in the cluster.
    pub servers: u32,
    /// Scheme of the file.
    pub scheme: Scheme,
    /// Size of the file.
    pub bytes: u64,
    /// Stripe unit.
    pub stripe_unit_bytes: u32,
    /// How clients and servers talk.
    pub transport: Transport,
    /// Extra flags for every server.
    pub server_args: Vec<String>,
}

impl Default for CheckConfig {
    fn default() -> Self {
        CheckConfig {
            servers: 3,
            scheme: Scheme::Raid5,
            bytes: 4 << 20,
            stripe_unit_bytes: 64 << 10,
            transport: Transport::Tcp,
            server_args: Vec::new(),
        }
    }
}

/// One echo, from the client to a host.
#[derive(Debug, Clone, Serialize)]
pub struct Echo {
    /// The host.
    pub host: String,
    /// Its round trips.
    pub stats: EchoStats,
}

/// What the check found.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    /// "check".
    pub experiment: &'static str,
    /// Version of this report's format.
    pub version: u32,
    /// When it started.
    pub started_unix_s: u64,
    /// How long it took, teardown included.
    pub duration_s: f64,
    /// The testbed.
    pub testbed: Testbed,
    /// Echoes from the client.
    pub echoes: Vec<Echo>,
    /// The raw stream.
    pub calibration: Calibration,
    /// Scheme of the file.
    pub scheme: String,
    /// Servers.
    pub servers: u32,
    /// Transport.
    pub transport: String,
    /// Bytes stored.
    pub bytes: u64,
    /// Write throughput, bytes per second.
    pub write_bytes_per_s: f64,
    /// Read throughput, bytes per second.
    pub read_bytes_per_s: f64,
    /// The files written.
    pub outputs: Vec<PathBuf>,
}

/// Run the check; writes `DIR/check.{json,csv,md,png}`.
pub fn run(lab: &LabConfig, config: &CheckConfig) -> Result<CheckReport, LabError> {
    let start = Instant::now();
    let started_unix_s = super::unix_time_s();
    let topology = Topology::cluster(RunPrefix::new(), config.servers, lab.link)?;
    lab.say(&format!(
        "building {} hosts ({})",
        topology.hosts.len(),
        topology.prefix.as_str()
    ));
    let network = Network::build(topology)?;
    let mut echoes = Vec::new();
    for host in &network.topology().hosts {
        if host.name != CLIENT_HOST {
            let stats = probe::udp_echo(&network, CLIENT_HOST, &host.name, 5)?;
            if stats.received == 0 {
                return Err(LabError::Timeout {
                    what: format!("an echo from {} across the bridge", host.name),
                    seconds: 0.5 * 5.0,
                });
            }
            echoes.push(Echo {
                host: host.name.clone(),
                stats,
            });
        }
    }
    let calibration = calibrate(&network, &lab.link, CLIENT_HOST, "s1", 0.5, &lab.cancel)?;
    lab.say(&calibration.markdown());
    let mut spec = ClusterSpec::new(lab.exe.clone(), config.servers, config.transport);
    spec.server_args = config.server_args.clone();
    let mut cluster = Cluster::start(&network, spec, &lab.cancel)?;
    let file = FileSpec {
        path: "lab/check".into(),
        scheme: config.scheme,
        stripe_unit_bytes: config.stripe_unit_bytes,
        bytes: config.bytes,
        seed: 1,
        width: None,
    };
    let report = cluster.run_job(&ClientJob::Check { file }, Duration::from_secs(120))?;
    let ClientReport::Checked { write, read } = report else {
        return Err(LabError::WrongReport {
            job: "check".into(),
        });
    };
    drop(cluster);
    network.teardown()?;
    lab.say("stored and read back over the bridge; torn down, nothing left");

    let rate = lab.link.rate.bytes_per_s();
    let mut table = Table::new(&["measurement", "value", "unit", "fraction of link"]);
    for echo in &echoes {
        table.push(vec![
            format!("echo client to {}, median", echo.host).into(),
            Cell::float(echo.stats.rtt_us_median, 0),
            "us".into(),
            Cell::Empty,
        ]);
    }
    let stream = &calibration.stream_from_client;
    let rows = [
        ("raw TCP stream from the client", stream.bits_per_s / 8.0),
        (
            "raw TCP stream to the client",
            calibration.stream_to_client.bits_per_s / 8.0,
        ),
        ("write", write.bytes_per_s()),
        ("read", read.bytes_per_s()),
    ];
    for (what, bytes_per_s) in rows {
        table.push(vec![
            what.into(),
            Cell::float(bytes_per_s / 1e6, 2),
            "MB/s".into(),
            Cell::float(bytes_per_s / rate, 3),
        ]);
    }
    let figure = Figure {
        title: format!(
            "lab check: {} servers, {}, {}",
            config.servers, config.scheme, lab.link.rate
        ),
        rows: vec![vec![Panel::Bars(BarPanel {
            title: "throughput over the bridge".into(),
            y_label: "fraction of link rate".into(),
            y_range: (0.0, 1.35),
            groups: vec![
                "TCP from client".into(),
                "TCP to client".into(),
                "write".into(),
                "read".into(),
            ],
            series: vec![BarSeries {
                label: config.transport.label(),
                color: 0,
                values: rows.iter().map(|(_, b)| Some(b / rate)).collect(),
            }],
        })]],
        width_px: 800,
        row_height_px: 450,
    };
    let testbed = Testbed::describe(lab);
    let preamble = format!(
        "# Lab check\n\n{}\n\n{}\n\nStored {} bytes ({}, {} servers, {}) and read them back intact.",
        testbed.markdown(),
        calibration.markdown(),
        config.bytes,
        config.scheme,
        config.servers,
        config.transport.label()
    );
    let mut report = CheckReport {
        experiment: "check",
        version: 1,
        started_unix_s,
        duration_s: 0.0,
        testbed,
        echoes,
        calibration,
        scheme: config.scheme.to_string(),
        servers: config.servers,
        transport: config.transport.label(),
        bytes: config.bytes,
        write_bytes_per_s: write.bytes_per_s(),
        read_bytes_per_s: read.bytes_per_s(),
        outputs: Vec::new(),
    };
    report.duration_s = start.elapsed().as_secs_f64();
    let paths = [".json", ".csv", ".md", ".png"].map(|e| lab.out_dir.join(format!("check{e}")));
    report.outputs = paths.to_vec();
    results::write_outputs(&lab.out_dir, "check", &report, &table, &preamble, &figure)?;
    Ok(report)
}
