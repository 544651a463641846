//! `tessera lab swift-window`: Swift/RAID's figures 2–5 (Fullmer, Long and Cabrera, "Adding
//! adaptive flow control to Swift/RAID", 1995) on Tessera.
//!
//! Figures 2–4: read and write throughput of a 40-block file (and here also of a large file)
//! for RAID-0, RAID-4 and RAID-5 on 3, 4 and 5 servers, against the window of the datagram
//! transport (at most N datagrams in flight per session; window 1 is stop-and-wait), with TCP
//! as a line of its own. Figure 5: the same in degraded mode, one server stopped, for RAID-4
//! (a data server or the parity server lost) and RAID-5, at window 2 as in the paper, each
//! beside the same cluster's throughput before the server was stopped.
//!
//! As in section 5.1, files are preallocated: each is created and written once, then the timed
//! writes overwrite it and the timed reads read it whole; every measurement is repeated and
//! averaged, with a 90% confidence interval. Throughput is user bytes per second, reported as
//! a fraction of the configured link rate and of what a raw TCP stream achieved.

use super::{calibrate, Calibration, LabConfig, Limit, Summary, Testbed};
use crate::cluster::{Cluster, ClusterSpec, Transport};
use crate::job::{ClientJob, ClientReport, FileSpec, Op, PreparedFile, Sample};
use crate::net::{Network, RunPrefix, Topology, CLIENT_HOST};
use crate::results::{
    self, BarPanel, BarSeries, Cell, Figure, LinePanel, LineSeries, Panel, Table, XScale,
};
use crate::LabError;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tessera_client::Scheme;

/// Which server a degraded-mode case stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Lost {
    /// A server holding data (for RAID-5, every server holds data and parity).
    Data,
    /// RAID-4's parity server.
    Parity,
}

impl Lost {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Lost::Data => "data",
            Lost::Parity => "parity",
        }
    }
}

/// One degraded-mode case: a scheme and which server is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DegradedCase {
    /// The scheme.
    pub scheme: Scheme,
    /// Which server is stopped.
    pub lost: Lost,
}

/// What to measure.
#[derive(Debug, Clone, Serialize)]
pub struct SwiftWindowConfig {
    /// The reduced run.
    pub quick: bool,
    /// Schemes of figures 2–4.
    pub schemes: Vec<Scheme>,
    /// Numbers of servers.
    pub servers: Vec<u32>,
    /// Windows of the datagram transport (empty: TCP only).
    pub windows: Vec<u32>,
    /// Also measure TCP.
    pub tcp: bool,
    /// Stripe unit: one block.
    pub stripe_unit_bytes: u32,
    /// Blocks of the small file (the paper's 40).
    pub small_blocks: u32,
    /// Bytes of the large file.
    pub large_bytes: u64,
    /// Repetitions of each small-file measurement.
    pub repetitions_small: u32,
    /// Repetitions of each large-file measurement.
    pub repetitions_large: u32,
    /// Degraded-mode cases (figure 5).
    pub degraded: Vec<DegradedCase>,
    /// Numbers of servers for degraded mode.
    pub degraded_servers: Vec<u32>,
    /// Window of the datagram transport in degraded mode (the paper used 2).
    pub degraded_window: u32,
    /// Extra flags for every server.
    pub server_args: Vec<String>,
    /// Extra flags for the measurement client.
    pub client_args: Vec<String>,
}

impl SwiftWindowConfig {
    /// Everything of figures 2–5.
    pub fn full() -> SwiftWindowConfig {
        SwiftWindowConfig {
            quick: false,
            schemes: vec![Scheme::Raid0, Scheme::Raid4, Scheme::Raid5],
            servers: vec![3, 4, 5],
            windows: (1..=8).collect(),
            tcp: true,
            stripe_unit_bytes: 64 << 10,
            small_blocks: 40,
            large_bytes: 32 << 20,
            repetitions_small: 5,
            repetitions_large: 2,
            degraded: vec![
                DegradedCase {
                    scheme: Scheme::Raid4,
                    lost: Lost::Data,
                },
                DegradedCase {
                    scheme: Scheme::Raid4,
                    lost: Lost::Parity,
                },
                DegradedCase {
                    scheme: Scheme::Raid5,
                    lost: Lost::Data,
                },
            ],
            degraded_servers: vec![3, 4, 5],
            degraded_window: 2,
            server_args: Vec::new(),
            client_args: Vec::new(),
        }
    }

    /// A subset that runs in under two minutes: RAID-5 on 3 servers, windows 1, 2, 3 and 8,
    /// TCP, smaller files, degraded RAID-5.
    pub fn quick() -> SwiftWindowConfig {
        SwiftWindowConfig {
            quick: true,
            schemes: vec![Scheme::Raid5],
            servers: vec![3],
            windows: vec![1, 2, 3, 8],
            large_bytes: 8 << 20,
            repetitions_small: 3,
            repetitions_large: 1,
            degraded: vec![DegradedCase {
                scheme: Scheme::Raid5,
                lost: Lost::Data,
            }],
            degraded_servers: vec![3],
            ..SwiftWindowConfig::full()
        }
    }

    /// The transports of figures 2–4: each window, then TCP.
    pub fn transports(&self) -> Vec<Transport> {
        let mut out: Vec<Transport> = self
            .windows
            .iter()
            .map(|&window| Transport::Datagram { window })
            .collect();
        if self.tcp {
            out.push(Transport::Tcp);
        }
        out
    }

    /// The transports of degraded mode: the degraded window (if windows are measured at
    /// all), then TCP.
    pub fn degraded_transports(&self) -> Vec<Transport> {
        let mut out = Vec::new();
        if !self.windows.is_empty() {
            out.push(Transport::Datagram {
                window: self.degraded_window,
            });
        }
        if self.tcp {
            out.push(Transport::Tcp);
        }
        out
    }

    fn small_bytes(&self) -> u64 {
        u64::from(self.small_blocks) * u64::from(self.stripe_unit_bytes)
    }

    /// The two files of a scheme: the small one, then the large one.
    pub fn files(&self, scheme: Scheme) -> [FileSpec; 2] {
        let seed = Scheme::ALL.iter().position(|s| *s == scheme).unwrap_or(0) as u64 * 2;
        let spec = |size: FileSize, bytes, seed| FileSpec {
            path: format!("lab/{scheme}-{}", size.name()),
            scheme,
            stripe_unit_bytes: self.stripe_unit_bytes,
            bytes,
            seed,
            width: None,
        };
        [
            spec(FileSize::Small, self.small_bytes(), seed),
            spec(FileSize::Large, self.large_bytes, seed + 1),
        ]
    }

    fn file_size_of(&self, path: &str) -> FileSize {
        if path.ends_with(FileSize::Small.name()) {
            FileSize::Small
        } else {
            FileSize::Large
        }
    }

    fn file_label(&self, size: FileSize) -> String {
        match size {
            FileSize::Small => format!("{}-block", self.small_blocks),
            FileSize::Large => "large".into(),
        }
    }

    /// A generous bound on a measurement job: its bytes at 2% of the link rate, plus slack.
    fn job_timeout(&self, bytes: u64, lab: &LabConfig) -> Duration {
        Duration::from_secs_f64(bytes as f64 / (lab.link.rate.bytes_per_s() * 0.02) + 60.0)
    }
}

/// The two file sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileSize {
    /// The paper's 40-block file.
    Small,
    /// A large file: steady state.
    Large,
}

impl FileSize {
    fn name(self) -> &'static str {
        match self {
            FileSize::Small => "small",
            FileSize::Large => "large",
        }
    }
}

/// One averaged measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `window` (figures 2–4) or `degraded` (figure 5).
    pub part: &'static str,
    /// Scheme.
    pub scheme: String,
    /// Servers in the cluster.
    pub servers: u32,
    /// `tcp` or `udp`.
    pub transport: &'static str,
    /// Window of the datagram transport.
    pub window: Option<u32>,
    /// `40-block` or `large`.
    pub file: String,
    /// Bytes of the file.
    pub file_bytes: u64,
    /// The op.
    pub op: Op,
    /// `normal` or `degraded`.
    pub mode: &'static str,
    /// In the degraded part, the case its cluster ran (its normal rows too).
    pub case: Option<Lost>,
    /// In degraded mode, what the stopped server held for this file.
    pub lost: Option<Lost>,
    /// In degraded mode, the stopped server.
    pub lost_server: Option<u32>,
    /// Mean, spread and 90% interval of the throughput, in MB/s (10^6 bytes).
    pub mb_per_s: Summary,
    /// Mean throughput as a share of the configured link rate.
    pub fraction_of_link: f64,
    /// Mean throughput as a share of the raw TCP stream's.
    pub fraction_of_tcp_stream: f64,
    /// Bytes of frames on the busier direction of the client's link per user byte: parity,
    /// reconstruction reads, headers and requests. Measured from the client interface's
    /// counters (modeled from the scheme if they could not be read).
    pub wire_factor: f64,
    /// How busy the busier direction of the client's link was: its frames' bytes over what
    /// the rate allows in the time.
    pub link_utilization: f64,
    /// Mean busy share of the CPUs.
    pub cpu_busy: f64,
    /// Frames the network's `tbf` queues (switch ports and hosts) dropped during all the
    /// repetitions.
    pub drops: u64,
    /// What limited it.
    pub limit: Limit,
    /// Each repetition's duration.
    pub seconds: Vec<f64>,
}

/// The whole result.
#[derive(Debug, Clone, Serialize)]
pub struct SwiftWindowReport {
    /// "swift-window".
    pub experiment: &'static str,
    /// Version of this report's format.
    pub version: u32,
    /// When it started.
    pub started_unix_s: u64,
    /// How long it took, teardown included.
    pub duration_s: f64,
    /// The testbed.
    pub testbed: Testbed,
    /// The raw TCP stream, and what limited it.
    pub calibration: Calibration,
    /// What was measured.
    pub config: SwiftWindowConfig,
    /// The measurements.
    pub rows: Vec<Row>,
}

/// Run it; writes `DIR/swift-window.{json,csv,md,png}`. Returns the report and the files.
pub fn run(
    lab: &LabConfig,
    config: &SwiftWindowConfig,
) -> Result<(SwiftWindowReport, Vec<PathBuf>), LabError> {
    let start = Instant::now();
    let started_unix_s = super::unix_time_s();
    let hosts_max = config
        .servers
        .iter()
        .chain(&config.degraded_servers)
        .copied()
        .max()
        .unwrap_or(3);
    let topology = Topology::cluster(RunPrefix::new(), hosts_max, lab.link)?;
    lab.say(&format!(
        "building the network: manager, client, {hosts_max} servers, links {} ({})",
        lab.link.rate,
        topology.prefix.as_str()
    ));
    let network = Network::build(topology)?;
    let seconds = if config.quick { 1.0 } else { 2.0 };
    let calibration = calibrate(&network, &lab.link, CLIENT_HOST, "s1", seconds, &lab.cancel)?;
    lab.say(&calibration.markdown());

    let mut rows = Vec::new();
    for &servers in &config.servers {
        for transport in config.transports() {
            lab.cancel.check()?;
            let began = Instant::now();
            let measured =
                measure_windows(lab, config, &network, &calibration, servers, transport)?;
            lab.say(&format!(
                "{servers} servers, {}: {} in {:.1} s",
                transport.label(),
                brief(&measured),
                began.elapsed().as_secs_f64()
            ));
            rows.extend(measured);
        }
    }
    for case in &config.degraded {
        for &servers in &config.degraded_servers {
            for transport in config.degraded_transports() {
                lab.cancel.check()?;
                let began = Instant::now();
                let measured = measure_degraded(
                    lab,
                    config,
                    &network,
                    &calibration,
                    *case,
                    servers,
                    transport,
                )?;
                lab.say(&format!(
                    "degraded {} ({} lost), {servers} servers, {}: {} in {:.1} s",
                    case.scheme,
                    case.lost.name(),
                    transport.label(),
                    brief(&measured),
                    began.elapsed().as_secs_f64()
                ));
                rows.extend(measured);
            }
        }
    }
    network.teardown()?;

    let report = SwiftWindowReport {
        experiment: "swift-window",
        version: 1,
        started_unix_s,
        duration_s: start.elapsed().as_secs_f64(),
        testbed: Testbed::describe(lab),
        calibration,
        config: config.clone(),
        rows,
    };
    let paths = results::write_outputs(
        &lab.out_dir,
        "swift-window",
        &report,
        &table(&report),
        &preamble(&report),
        &figure(&report),
    )?;
    Ok((report, paths))
}

/// Figures 2–4 for one cluster: every scheme's files, written and read.
fn measure_windows(
    lab: &LabConfig,
    config: &SwiftWindowConfig,
    network: &Network,
    calibration: &Calibration,
    servers: u32,
    transport: Transport,
) -> Result<Vec<Row>, LabError> {
    let mut cluster = start_cluster(lab, config, network, servers, transport)?;
    let files: Vec<FileSpec> = config
        .schemes
        .iter()
        .flat_map(|s| config.files(*s))
        .collect();
    prepare(lab, config, &mut cluster, &files)?;
    let samples = measure(lab, config, &mut cluster, &files)?;
    let context = Context {
        config,
        lab,
        calibration,
        servers,
        transport,
        case: None,
    };
    Ok(context.rows("window", "normal", &files, &samples, None))
}

/// Figure 5 for one cluster: throughput before, then after stopping a server.
fn measure_degraded(
    lab: &LabConfig,
    config: &SwiftWindowConfig,
    network: &Network,
    calibration: &Calibration,
    case: DegradedCase,
    servers: u32,
    transport: Transport,
) -> Result<Vec<Row>, LabError> {
    let mut cluster = start_cluster(lab, config, network, servers, transport)?;
    let files = config.files(case.scheme).to_vec();
    let prepared = prepare(lab, config, &mut cluster, &files)?;
    let context = Context {
        config,
        lab,
        calibration,
        servers,
        transport,
        case: Some(case.lost),
    };
    let before = measure(lab, config, &mut cluster, &files)?;
    let mut rows = context.rows("degraded", "normal", &files, &before, None);

    // Stop the server holding the large file's first column (data), or its last (RAID-4's
    // parity); then wait until the manager has noticed, so no request waits on a timeout.
    let columns = &prepared
        .iter()
        .find(|p| p.path == files[1].path)
        .expect("prepared the large file")
        .columns;
    let victim = match case.lost {
        Lost::Data => columns[0],
        Lost::Parity => *columns.last().expect("a file has columns"),
    };
    cluster.stop_server(victim)?;
    let up: Vec<u32> = (1..=servers).filter(|id| *id != victim).collect();
    cluster.wait_servers(&up, &[victim], Duration::from_secs(30))?;
    let after = measure(lab, config, &mut cluster, &files)?;
    rows.extend(context.rows(
        "degraded",
        "degraded",
        &files,
        &after,
        Some((victim, &prepared)),
    ));
    Ok(rows)
}

fn start_cluster<'n>(
    lab: &LabConfig,
    config: &SwiftWindowConfig,
    network: &'n Network,
    servers: u32,
    transport: Transport,
) -> Result<Cluster<'n>, LabError> {
    let mut spec = ClusterSpec::new(lab.exe.clone(), servers, transport);
    spec.server_args = config.server_args.clone();
    spec.client_args = config.client_args.clone();
    Cluster::start(network, spec, &lab.cancel)
}

fn prepare(
    lab: &LabConfig,
    config: &SwiftWindowConfig,
    cluster: &mut Cluster<'_>,
    files: &[FileSpec],
) -> Result<Vec<PreparedFile>, LabError> {
    let bytes = files.iter().map(|f| f.bytes).sum();
    let job = ClientJob::Prepare {
        files: files.to_vec(),
    };
    match cluster.run_job(&job, config.job_timeout(bytes, lab))? {
        ClientReport::Prepared { files } => Ok(files),
        _ => Err(LabError::WrongReport {
            job: job.kind().into(),
        }),
    }
}

/// Every timed op, and the frames dropped during each (file, op).
#[derive(Debug, Default)]
struct Measured {
    samples: Vec<Sample>,
    drops: BTreeMap<(String, Op), u64>,
}

/// Each file's writes, then its reads, each op with its repetitions as one job.
fn measure(
    lab: &LabConfig,
    config: &SwiftWindowConfig,
    cluster: &mut Cluster<'_>,
    files: &[FileSpec],
) -> Result<Measured, LabError> {
    let mut measured = Measured::default();
    for file in files {
        let repetitions = match config.file_size_of(&file.path) {
            FileSize::Small => config.repetitions_small,
            FileSize::Large => config.repetitions_large,
        };
        for op in [Op::Write, Op::Read] {
            if repetitions == 0 {
                continue;
            }
            let timeout = config.job_timeout(file.bytes * u64::from(repetitions), lab);
            let m = cluster.measure(std::slice::from_ref(file), op, repetitions, timeout)?;
            measured.samples.extend(m.samples);
            measured.drops.insert((file.path.clone(), op), m.drops);
        }
    }
    Ok(measured)
}

/// What rows of one cluster have in common.
struct Context<'a> {
    config: &'a SwiftWindowConfig,
    lab: &'a LabConfig,
    calibration: &'a Calibration,
    servers: u32,
    transport: Transport,
    case: Option<Lost>,
}

impl Context<'_> {
    /// A row per file and op, averaging its samples. `lost` is the stopped server and the
    /// columns of each file, in degraded mode.
    fn rows(
        &self,
        part: &'static str,
        mode: &'static str,
        files: &[FileSpec],
        measured: &Measured,
        lost: Option<(u32, &[PreparedFile])>,
    ) -> Vec<Row> {
        let samples = &measured.samples;
        let link_bytes_per_s = self.lab.link.rate.bytes_per_s();
        let stream_bytes_per_s = self.calibration.stream_fraction * link_bytes_per_s;
        let mut rows = Vec::new();
        for file in files {
            for op in [Op::Read, Op::Write] {
                let mine: Vec<&Sample> = samples
                    .iter()
                    .filter(|s| s.path == file.path && s.op == op)
                    .collect();
                if mine.is_empty() {
                    continue;
                }
                let rates: Vec<f64> = mine.iter().map(|s| s.bytes_per_s() / 1e6).collect();
                let summary = Summary::of(&rates);
                let cpu_busy = mine.iter().map(|s| s.cpu_busy).sum::<f64>() / mine.len() as f64;
                let lost_role = lost.map(|(victim, prepared)| {
                    let columns = prepared
                        .iter()
                        .find(|p| p.path == file.path)
                        .map(|p| p.columns.as_slice())
                        .unwrap_or(&[]);
                    let parity_column =
                        file.scheme == Scheme::Raid4 && columns.last() == Some(&victim);
                    if parity_column {
                        Lost::Parity
                    } else {
                        Lost::Data
                    }
                });
                let fraction_of_link = summary.mean * 1e6 / link_bytes_per_s;
                let factors = mine
                    .iter()
                    .map(|s| Some(s.link_bytes()? as f64 / s.bytes.max(1) as f64))
                    .collect::<Option<Vec<f64>>>();
                let (wire_factor, link_utilization) = match factors {
                    Some(factors) if !factors.is_empty() => (
                        factors.iter().sum::<f64>() / factors.len() as f64,
                        super::link_utilization(&mine, self.lab.link.rate).unwrap_or(0.0),
                    ),
                    _ => {
                        // A healthy full-stripe write sends a parity unit per W-1 data units;
                        // a degraded one W-1 units (data or parity) per W-1 data units.
                        let units = match (op, file.scheme, lost.is_some()) {
                            (Op::Write, Scheme::Raid4 | Scheme::Raid5, false) => {
                                self.servers as f64 / (self.servers as f64 - 1.0)
                            }
                            _ => 1.0,
                        };
                        let factor = units * super::stream_utilization(1.0);
                        (factor, fraction_of_link * factor)
                    }
                };
                rows.push(Row {
                    part,
                    scheme: file.scheme.to_string(),
                    servers: self.servers,
                    transport: match self.transport {
                        Transport::Tcp => "tcp",
                        Transport::Datagram { .. } | Transport::Adaptive => "udp",
                    },
                    window: self.transport.window(),
                    file: self.config.file_label(self.config.file_size_of(&file.path)),
                    file_bytes: file.bytes,
                    op,
                    mode,
                    case: self.case,
                    lost: lost_role,
                    lost_server: lost.map(|(victim, _)| victim),
                    mb_per_s: summary,
                    fraction_of_link,
                    fraction_of_tcp_stream: summary.mean * 1e6 / stream_bytes_per_s.max(1.0),
                    wire_factor,
                    link_utilization,
                    cpu_busy,
                    drops: measured
                        .drops
                        .get(&(file.path.clone(), op))
                        .copied()
                        .unwrap_or(0),
                    limit: Limit::classify(link_utilization, cpu_busy),
                    seconds: mine.iter().map(|s| s.seconds).collect(),
                });
            }
        }
        rows
    }
}

/// One line for the progress: the large file's read and write as fractions of the link.
fn brief(rows: &[Row]) -> String {
    let parts: Vec<String> = rows
        .iter()
        .filter(|r| r.file == "large")
        .map(|r| {
            format!(
                "{} {}{} {:.2}",
                r.scheme,
                if r.mode == "degraded" {
                    "degraded "
                } else {
                    ""
                },
                r.op.name(),
                r.fraction_of_link
            )
        })
        .collect();
    format!("large file, fraction of link: {}", parts.join(", "))
}

fn table(report: &SwiftWindowReport) -> Table {
    let mut table = Table::new(&[
        "part",
        "scheme",
        "servers",
        "transport",
        "window",
        "file",
        "file bytes",
        "op",
        "mode",
        "lost",
        "n",
        "MB/s",
        "±90%",
        "of link",
        "of TCP stream",
        "wire/user",
        "link busy",
        "CPU busy",
        "drops",
        "limit",
    ]);
    for r in &report.rows {
        table.push(vec![
            r.part.into(),
            r.scheme.clone().into(),
            r.servers.into(),
            r.transport.into(),
            r.window.into(),
            r.file.clone().into(),
            Cell::Int(r.file_bytes as i64),
            r.op.name().into(),
            r.mode.into(),
            r.lost
                .map(|l| format!("{} (server {})", l.name(), r.lost_server.unwrap_or(0)))
                .into(),
            Cell::Int(r.mb_per_s.n as i64),
            Cell::float(r.mb_per_s.mean, 2),
            Cell::float(r.mb_per_s.ci90, 2),
            Cell::float(r.fraction_of_link, 3),
            Cell::float(r.fraction_of_tcp_stream, 3),
            Cell::float(r.wire_factor, 2),
            Cell::float(r.link_utilization, 3),
            Cell::float(r.cpu_busy, 2),
            Cell::Int(r.drops as i64),
            r.limit.name().into(),
        ]);
    }
    table
}

fn preamble(report: &SwiftWindowReport) -> String {
    let c = &report.config;
    format!(
        "# Swift/RAID window experiment (figures 2–5){}\n\n\
         {}\n\n{}\n\n\
         Files: {} blocks of {} KiB ({} bytes) and a large file of {} bytes, preallocated; \
         every timed write overwrites a whole file, every timed read reads one whole. \
         Repetitions: {} (small), {} (large); MB/s is the mean of 10^6 bytes per second with \
         its 90% confidence interval. \"of link\" is the mean as a share of the configured link \
         rate, \"of TCP stream\" as a share of the raw stream above. \"wire/user\" is the bytes of \
         frames on the busier direction of the client's link per user byte (parity, \
         reconstruction, headers; from the interface's counters), \"link busy\" that \
         direction's bytes over what the rate allows. \"drops\" counts the frames every `tbf` \
         queue (switch ports and hosts) dropped during all repetitions. \"limit\" is network when the link was \
         at least {} busy, cpu when the CPUs were {:.0}% busy, latency otherwise (waiting for \
         round trips). Degraded mode stops one server (SIGKILL) \
         and waits until the manager reports it down; its normal rows are the same cluster \
         before the stop. Took {:.0} s.",
        if c.quick { " — quick subset" } else { "" },
        report.testbed.markdown(),
        report.calibration.markdown(),
        c.small_blocks,
        c.stripe_unit_bytes >> 10,
        c.small_bytes(),
        c.large_bytes,
        c.repetitions_small,
        c.repetitions_large,
        super::NETWORK_BOUND_SHARE,
        super::CPU_BOUND_SHARE * 100.0,
        report.duration_s
    )
}

fn figure(report: &SwiftWindowReport) -> Figure {
    let c = &report.config;
    let x_max = c.windows.iter().copied().max().unwrap_or(8).max(2) as f64;
    let y_max = report
        .rows
        .iter()
        .map(|r| r.fraction_of_link)
        .fold(1.0f64, f64::max)
        * 1.05;
    let mut rows = Vec::new();
    for &scheme in &c.schemes {
        let mut panels = Vec::new();
        for size in [FileSize::Small, FileSize::Large] {
            for op in [Op::Read, Op::Write] {
                let file = c.file_label(size);
                let of = |r: &&Row| {
                    r.part == "window" && r.scheme == scheme.name() && r.file == file && r.op == op
                };
                let mut series = Vec::new();
                for (color, &servers) in c.servers.iter().enumerate() {
                    let mine: Vec<&Row> = report
                        .rows
                        .iter()
                        .filter(of)
                        .filter(|r| r.servers == servers)
                        .collect();
                    let mut points: Vec<(f64, f64)> = mine
                        .iter()
                        .filter_map(|r| Some((r.window? as f64, r.fraction_of_link)))
                        .collect();
                    points.sort_by(|a, b| a.0.total_cmp(&b.0));
                    if !points.is_empty() {
                        series.push(LineSeries {
                            label: format!("{servers} servers"),
                            color,
                            dashed: false,
                            points,
                        });
                    }
                    if let Some(tcp) = mine.iter().find(|r| r.transport == "tcp") {
                        series.push(LineSeries {
                            label: format!("{servers} servers, TCP"),
                            color,
                            dashed: true,
                            points: vec![
                                (1.0, tcp.fraction_of_link),
                                (x_max, tcp.fraction_of_link),
                            ],
                        });
                    }
                }
                let bytes = match size {
                    FileSize::Small => c.small_bytes(),
                    FileSize::Large => c.large_bytes,
                };
                panels.push(Panel::Lines(LinePanel {
                    title: format!("{scheme}, {file} ({}), {}", mib(bytes), op.name()),
                    x_label: "window (datagrams in flight per session)".into(),
                    y_label: "throughput / link rate".into(),
                    x_range: (1.0, x_max),
                    x_scale: XScale::Linear,
                    y_range: (0.0, y_max),
                    series,
                }));
            }
        }
        rows.push(panels);
    }
    let degraded: Vec<Panel> = c
        .degraded_transports()
        .into_iter()
        .filter_map(|t| degraded_panel(report, t, y_max))
        .collect();
    if !degraded.is_empty() {
        rows.push(degraded);
    }
    Figure {
        title: format!(
            "Tessera, Swift/RAID figures 2-5{}: links {}, stripe unit {} KiB",
            if c.quick { " (quick)" } else { "" },
            crate::net::Rate {
                bits_per_s: report.testbed.link_rate_bits_per_s
            },
            c.stripe_unit_bytes >> 10
        ),
        rows,
        width_px: 1920,
        row_height_px: 400,
    }
}

/// Figure 5 for one transport: the large file, read and write, before and after.
fn degraded_panel(report: &SwiftWindowReport, transport: Transport, y_max: f64) -> Option<Panel> {
    let c = &report.config;
    let mine: Vec<&Row> = report
        .rows
        .iter()
        .filter(|r| r.part == "degraded" && r.window == transport.window() && r.file == "large")
        .filter(|r| (r.transport == "tcp") == (transport == Transport::Tcp))
        .collect();
    if mine.is_empty() {
        return None;
    }
    let mut groups = Vec::new();
    let mut values: [Vec<Option<f64>>; 4] = Default::default();
    for case in &c.degraded {
        for &servers in &c.degraded_servers {
            let group: Vec<&&Row> = mine
                .iter()
                .filter(|r| r.scheme == case.scheme.name() && r.servers == servers)
                .filter(|r| r.case == Some(case.lost))
                .collect();
            let value = |mode: &str, op: Op| {
                group
                    .iter()
                    .find(|r| r.mode == mode && r.op == op)
                    .map(|r| r.fraction_of_link)
            };
            groups.push(match case.scheme {
                Scheme::Raid4 => {
                    format!("raid4, {servers} servers, {} server lost", case.lost.name())
                }
                _ => format!("{}, {servers} servers, one lost", case.scheme),
            });
            values[0].push(value("normal", Op::Read));
            values[1].push(value("degraded", Op::Read));
            values[2].push(value("normal", Op::Write));
            values[3].push(value("degraded", Op::Write));
        }
    }
    let labels = ["read", "read, degraded", "write", "write, degraded"];
    Some(Panel::Bars(BarPanel {
        title: format!("degraded mode, large file, {}", transport.label()),
        y_label: "throughput / link rate".into(),
        // Headroom over the bars for the legend and the values.
        y_range: (0.0, y_max * 1.3),
        groups,
        series: labels
            .iter()
            .zip(values)
            .enumerate()
            .map(|(i, (label, values))| BarSeries {
                label: label.to_string(),
                color: i,
                values,
            })
            .collect(),
    }))
}

fn mib(bytes: u64) -> String {
    let mib = bytes as f64 / (1u64 << 20) as f64;
    if mib.fract() == 0.0 {
        format!("{mib:.0} MiB")
    } else {
        format!("{mib:.1} MiB")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_is_a_subset_of_full() {
        let (full, quick) = (SwiftWindowConfig::full(), SwiftWindowConfig::quick());
        assert!(quick.schemes.iter().all(|s| full.schemes.contains(s)));
        assert!(quick.windows.iter().all(|w| full.windows.contains(w)));
        assert_eq!(full.windows, (1..=8).collect::<Vec<_>>());
        assert_eq!(
            quick.transports(),
            [1, 2, 3, 8]
                .map(|window| Transport::Datagram { window })
                .into_iter()
                .chain([Transport::Tcp])
                .collect::<Vec<_>>()
        );
        assert_eq!(
            quick.degraded_transports(),
            [Transport::Datagram { window: 2 }, Transport::Tcp]
        );
    }

    #[test]
    fn tcp_only_runs_tcp_everywhere() {
        let mut c = SwiftWindowConfig::quick();
        c.windows.clear();
        assert_eq!(c.transports(), [Transport::Tcp]);
        assert_eq!(c.degraded_transports(), [Transport::Tcp]);
    }

    #[test]
    fn files_are_forty_blocks_and_large_with_distinct_seeds() {
        let c = SwiftWindowConfig::full();
        let [small, large] = c.files(Scheme::Raid5);
        assert_eq!(small.bytes, 40 * 65536);
        assert_eq!(small.path, "lab/raid5-small");
        assert_eq!(large.bytes, 32 << 20);
        assert_ne!(small.seed, large.seed);
        assert_eq!(c.file_size_of(&large.path), FileSize::Large);
        assert_eq!(c.file_label(FileSize::Small), "40-block");
        let [other, _] = c.files(Scheme::Raid4);
        assert_ne!(other.seed, small.seed);
    }

    fn sample(path: &str, op: Op, seconds: f64) -> Sample {
        Sample {
            path: path.into(),
            op,
            bytes: 25_000_000,
            seconds,
            cpu_busy: 0.2,
            link_rx_bytes: None,
            link_tx_bytes: None,
        }
    }

    #[test]
    fn rows_average_samples_and_classify_limits() {
        let lab = LabConfig::new(
            "/bin/tessera".into(),
            crate::net::LinkSpec::new(crate::net::Rate::mbit(200)),
            "results".into(),
            crate::cmd::Cancel::new(),
        );
        let config = SwiftWindowConfig::quick();
        let stream = crate::probe::StreamStats {
            bytes: 1,
            seconds: 1.0,
            bits_per_s: 190e6,
            cpu_busy: 0.1,
            drops: 0,
        };
        let echo = crate::probe::EchoStats {
            sent: 1,
            received: 1,
            rtt_us_min: 50.0,
            rtt_us_median: 50.0,
            rtt_us_max: 50.0,
        };
        let calibration = Calibration {
            configured_bits_per_s: 200_000_000,
            stream_from_client: stream.clone(),
            stream_to_client: stream,
            stream_fraction: 0.95,
            cpu_busy: 0.1,
            background_cpu_busy: 0.0,
            echo,
            wakeups: crate::probe::WakeupStats::of(100, &mut [5.0, 1500.0], 10_000.0),
            limit: Limit::Network,
        };
        let context = Context {
            config: &config,
            lab: &lab,
            calibration: &calibration,
            servers: 3,
            transport: Transport::Datagram { window: 2 },
            case: None,
        };
        let files = config.files(Scheme::Raid5).to_vec();
        // 25 MB in 1 s = the whole 200 Mbit/s link; in 4 s a quarter of it.
        let samples = [
            sample(&files[1].path, Op::Read, 1.0),
            sample(&files[1].path, Op::Read, 1.0),
            sample(&files[1].path, Op::Write, 4.0),
        ];
        let mut measured = Measured {
            samples: samples[..1].to_vec(),
            drops: BTreeMap::from([((files[1].path.clone(), Op::Read), 17)]),
        };
        // The first read's counters: 26 MB of frames received in the second.
        measured.samples[0].link_rx_bytes = Some(26_000_000);
        measured.samples[0].link_tx_bytes = Some(500_000);
        let rows = context.rows("window", "normal", &files, &measured, None);
        assert!((rows[0].wire_factor - 1.04).abs() < 1e-9);
        assert!((rows[0].link_utilization - 1.04).abs() < 1e-9);
        assert_eq!(rows[0].drops, 17);
        measured.samples = samples.to_vec();
        let rows = context.rows("window", "normal", &files, &measured, None);
        assert_eq!(
            rows.len(),
            2,
            "no samples of the small file, no rows for it"
        );
        let read = &rows[0];
        assert_eq!(
            (read.op, read.mb_per_s.n, read.window),
            (Op::Read, 2, Some(2))
        );
        assert!((read.fraction_of_link - 1.0).abs() < 1e-9);
        assert_eq!(read.limit, Limit::Network);
        let write = &rows[1];
        assert!((write.fraction_of_link - 0.25).abs() < 1e-9);
        // Without counters: raid5 on 3 sends a parity unit per 2, in 1514-byte frames of 1448.
        assert!((write.wire_factor - 1.5 * 1514.0 / 1448.0).abs() < 1e-9);
        assert_eq!(write.limit, Limit::Latency);
        assert_eq!(write.transport, "udp");
        let t = table(&SwiftWindowReport {
            experiment: "swift-window",
            version: 1,
            started_unix_s: 0,
            duration_s: 1.0,
            testbed: Testbed::describe(&lab),
            calibration,
            config: config.clone(),
            rows,
        });
        assert_eq!(t.rows.len(), 2);
        assert!(t
            .to_csv()
            .contains("window,raid5,3,udp,2,large,8388608,read,normal,,2,25.00,"));
    }
}
