//! `tessera lab incast`: TCP incast ("TCP Throughput Collapse in Cluster-based Storage
//! Systems", Phanishayee, Krevat, Vasudevan, Andersen, Ganger, Gibson and Seshan, CMU) on
//! Tessera.
//!
//! A client reads a RAID-0 file striped over N servers one *block* at a time: a block is a
//! whole stripe, one stripe unit (the paper's server request unit) from every server, asked
//! for at once; the next block is asked for only when every server has answered. Every
//! server's answer arrives at the same switch port, toward the client, whose buffer (32 KiB,
//! as in the paper's testbed) overflows as N grows. TCP loses whole windows there, waits for
//! its retransmission timeout (200 ms by default on Linux) while the link idles, and goodput
//! collapses. The experiment measures goodput against N for three lines: TCP as the kernel
//! ships it, TCP with `rto_min 1ms` on every route (the paper's remedy), and Tessera's own
//! datagram transport, and counts drops at the client's port, retransmissions and timeouts.
//!
//! One network holds the most servers asked for; per N a cluster of N servers (datagram
//! transport, which serves TCP as well) stores one file per stripe unit, and each line reads
//! each file with a fresh measurement client.

use super::{calibrate, Calibration, LabConfig, Limit, Testbed};
use crate::cluster::{Cluster, ClusterSpec, Transport};
use crate::job::{ClientJob, ClientReport, Counters, FileSpec, SyncReadsSample};
use crate::net::{
    server_host, Buffer, LinkSpec, Network, Rate, RunPrefix, Topology, CLIENT_HOST, MANAGER_HOST,
};
use crate::probe::TcpCounters;
use crate::results::{self, Cell, Figure, LinePanel, LineSeries, Panel, Table, XScale};
use crate::LabError;
use serde::Serialize;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::{Duration, Instant};
use tessera_client::Scheme;

/// The minimum retransmission timeout of the `tcp-rto1ms` line, in milliseconds.
pub const RTO_MIN_MS: u32 = 1;
/// Tessera's goodput target, as a share of the link rate, at every N.
pub const GOODPUT_TARGET: f64 = 0.9;
/// Tessera's target for its longest retransmission timeout that expired, in microseconds.
pub const TIMEOUT_US_TARGET: u64 = 1000;
/// Counters of the datagram endpoint whose name ends so hold a maximum, not a count: across
/// servers they combine by `max`, and their value after a job is since the server started.
const MAXIMUM_SUFFIX: &str = "_max";

/// One way to carry the reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Line {
    /// TCP with the kernel's defaults (a 200 ms minimum retransmission timeout).
    #[serde(rename = "tcp")]
    Tcp,
    /// TCP with `rto_min 1ms` on the routes of the client, the manager and every server.
    #[serde(rename = "tcp-rto1ms")]
    TcpRtoMin,
    /// Tessera's datagram transport.
    #[serde(rename = "tessera")]
    Tessera,
}

impl Line {
    /// Every line, in the order they are measured and drawn.
    pub const ALL: [Line; 3] = [Line::Tcp, Line::TcpRtoMin, Line::Tessera];

    /// The name on the command line and in the CSV.
    pub fn name(self) -> &'static str {
        match self {
            Line::Tcp => "tcp",
            Line::TcpRtoMin => "tcp-rto1ms",
            Line::Tessera => "tessera",
        }
    }

    /// The name in plots and tables.
    pub fn label(self) -> &'static str {
        match self {
            Line::Tcp => "TCP",
            Line::TcpRtoMin => "TCP, rto_min 1 ms",
            Line::Tessera => "Tessera",
        }
    }

    /// How the measurement client connects.
    pub fn transport(self) -> Transport {
        match self {
            Line::Tcp | Line::TcpRtoMin => Transport::Tcp,
            Line::Tessera => Transport::Adaptive,
        }
    }

    /// The minimum retransmission timeout its routes get, if not the kernel's.
    pub fn rto_min_ms(self) -> Option<u32> {
        (self == Line::TcpRtoMin).then_some(RTO_MIN_MS)
    }

    /// Whether its counters are the kernel's TCP counters.
    pub fn is_tcp(self) -> bool {
        self.transport() == Transport::Tcp
    }
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Line {
    type Err = LabError;
    fn from_str(text: &str) -> Result<Line, LabError> {
        Line::ALL
            .into_iter()
            .find(|line| line.name() == text.trim())
            .ok_or_else(|| LabError::BadValue {
                what: "incast line",
                text: text.to_string(),
                expected: "tcp, tcp-rto1ms or tessera",
            })
    }
}

/// What to measure.
#[derive(Debug, Clone, Serialize)]
pub struct IncastConfig {
    /// The reduced run.
    pub quick: bool,
    /// Numbers of servers (N).
    pub servers: Vec<u32>,
    /// Stripe units (the paper's server request units).
    pub stripe_units_bytes: Vec<u32>,
    /// The lines.
    pub lines: Vec<Line>,
    /// Timed reads of each point; `None`: enough blocks for about `bytes_per_point`.
    pub reads: Option<u32>,
    /// Blocks the client keeps in flight: 1 is the paper's barrier (the next block is asked
    /// for when the last has arrived whole), more is the client's read-ahead.
    pub read_ahead: u32,
    /// Bytes each point reads, roughly, when `reads` is not given.
    pub bytes_per_point: u64,
    /// Fewest timed reads of a point, when `reads` is not given.
    pub reads_min: u32,
    /// Most timed reads of a point, when `reads` is not given.
    pub reads_max: u32,
    /// Smallest file; it is a whole number of blocks.
    pub file_bytes_min: u64,
    /// Fewest blocks of a file.
    pub file_blocks_min: u64,
    /// Extra flags for every server.
    pub server_args: Vec<String>,
    /// Extra flags for the measurement client.
    pub client_args: Vec<String>,
}

impl IncastConfig {
    /// N = 1 to 64, stripe units of 32 and 256 KiB, all three lines.
    pub fn full() -> IncastConfig {
        IncastConfig {
            quick: false,
            servers: vec![1, 2, 4, 8, 16, 32, 64],
            stripe_units_bytes: vec![32 << 10, 256 << 10],
            lines: Line::ALL.to_vec(),
            reads: None,
            read_ahead: 1,
            bytes_per_point: 128 << 20,
            reads_min: 20,
            reads_max: 4000,
            file_bytes_min: 8 << 20,
            file_blocks_min: 4,
            server_args: Vec::new(),
            client_args: Vec::new(),
        }
    }

    /// N = 1 to 16 with fewer bytes per point: under two minutes.
    pub fn quick() -> IncastConfig {
        IncastConfig {
            quick: true,
            servers: vec![1, 2, 4, 8, 16],
            bytes_per_point: 48 << 20,
            reads_min: 24,
            reads_max: 1500,
            file_bytes_min: 4 << 20,
            ..IncastConfig::full()
        }
    }

    /// The links incast is measured on unless told otherwise: 1 Gbit/s and a 32 KiB buffer
    /// at each switch port (the paper's testbed), with the lab's usual `tbf` bucket of a
    /// millisecond of the rate. A smaller bucket would be closer to a switch, which holds no
    /// burst beyond its buffer, but on a 2-CPU testbed `tbf` then wakes too late to keep the
    /// link busy: one raw TCP stream reached 0.72 of 1 Gbit/s with a 30 KB bucket, 0.76
    /// with 62.5 KB, 0.95 with 125 KB. So after an idle millisecond a port absorbs up to
    /// bucket plus buffer (157 KB); between blocks it idles for a round trip or two, which
    /// refills a few tens of KB.
    pub fn link_defaults() -> LinkSpec {
        LinkSpec {
            switch_buffer: Buffer::Bytes(32 << 10),
            ..LinkSpec::new(Rate::mbit(1000))
        }
    }

    /// Bytes of one block: a stripe unit from each of `servers`.
    pub fn block_bytes(servers: u32, stripe_unit_bytes: u32) -> u64 {
        u64::from(servers) * u64::from(stripe_unit_bytes)
    }

    /// Timed reads of a point with blocks of `block_bytes`.
    pub fn reads_of(&self, block_bytes: u64) -> u32 {
        self.reads.unwrap_or_else(|| {
            let reads = self.bytes_per_point / block_bytes.max(1);
            (reads.min(u64::from(u32::MAX)) as u32).clamp(self.reads_min, self.reads_max)
        })
    }

    /// The file read with stripe unit `stripe_unit_bytes` on `servers` servers.
    pub fn file(&self, servers: u32, stripe_unit_bytes: u32) -> FileSpec {
        let block = Self::block_bytes(servers, stripe_unit_bytes);
        let blocks = self
            .file_blocks_min
            .max(self.file_bytes_min.div_ceil(block));
        FileSpec {
            path: format!("lab/incast-{}k", stripe_unit_bytes >> 10),
            scheme: Scheme::Raid0,
            stripe_unit_bytes,
            bytes: blocks * block,
            seed: u64::from(stripe_unit_bytes) + u64::from(servers),
            width: Some(servers),
        }
    }

    /// A generous bound on one point: its bytes at 1% of the link rate, a second per read
    /// (TCP's timeouts back off from 200 ms), and slack.
    fn job_timeout(&self, bytes: u64, reads: u32, lab: &LabConfig) -> Duration {
        let transfer = bytes as f64 / (lab.link.rate.bytes_per_s() * 0.01);
        Duration::from_secs_f64(transfer + f64::from(reads) + 60.0)
    }
}

/// One point: N servers, one stripe unit, one line.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    /// Servers the file is striped over (N).
    pub servers: u32,
    /// Stripe unit (server request unit).
    pub stripe_unit_bytes: u32,
    /// The line.
    pub line: Line,
    /// Bytes of one block (N stripe units).
    pub block_bytes: u64,
    /// Timed reads.
    pub reads: u32,
    /// User bytes the timed reads returned.
    pub bytes: u64,
    /// How long they took.
    pub seconds: f64,
    /// User bytes per second over the link rate.
    pub goodput_fraction: f64,
    /// Median time of one read, in microseconds.
    pub read_us_median: f64,
    /// 99th percentile of the time of one read, in microseconds.
    pub read_us_p99: f64,
    /// Longest read, in microseconds.
    pub read_us_max: f64,
    /// How busy the busier direction of the client's link was (frames' bytes over what
    /// the rate allows), if its counters were read.
    pub link_utilization: Option<f64>,
    /// Busy share of the CPUs during the timed reads.
    pub cpu_busy: f64,
    /// The part of it spent in the kernel (share of all CPU time): mostly the emulated
    /// network's per-frame work (veth, bridge, `tbf`), which every line pays.
    #[serde(default)]
    pub cpu_kernel: f64,
    /// What limited it.
    pub limit: Limit,
    /// Frames the switch port toward the client dropped (its `tbf`), during the whole job.
    pub client_port_drops: u64,
    /// Frames every `tbf` of the cluster's hosts and their switch ports dropped.
    pub tbf_drops: u64,
    /// Retransmissions of the line's transport, summed over the hosts: the kernel's
    /// retransmitted TCP segments of the servers, the client and the manager for the TCP
    /// lines, the datagram endpoints' `retransmissions` (servers and client) for Tessera.
    pub retransmissions: u64,
    /// Retransmission timer expiries of the line's transport, summed the same way.
    pub timeouts: u64,
    /// Tessera: the longest retransmission timeout that expired at any server (since it
    /// started) or at the client, in microseconds. `None` for TCP and when not reported.
    pub timeout_us_max: Option<u64>,
    /// The servers' longest before the job: if `timeout_us_max` is no larger, that timeout
    /// expired before this point (an earlier job, the files' writing).
    pub timeout_us_max_before: Option<u64>,
    /// The kernel's TCP counters, servers, client and manager summed (every line: for
    /// Tessera only the lookups at the manager).
    pub kernel_tcp: TcpCounters,
    /// The datagram endpoints' counters, grown during the job and summed over servers
    /// (maxima: the largest value after it).
    pub datagram_servers: Counters,
    /// The client's own datagram counters during the job.
    pub datagram_client: Counters,
    /// Blocks compared with the file's contents.
    pub verified_blocks: u32,
}

/// A point that could not be measured: the measurement client failed (a request timed out,
/// the bytes differed) or took too long. The other points go on.
#[derive(Debug, Clone, Serialize)]
pub struct FailedPoint {
    /// Servers.
    pub servers: u32,
    /// Stripe unit.
    pub stripe_unit_bytes: u32,
    /// The line.
    pub line: Line,
    /// Why.
    pub error: String,
}

/// How long one cluster took to get ready.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterTiming {
    /// Servers.
    pub servers: u32,
    /// Starting the daemons until the manager reported every server up.
    pub start_s: f64,
    /// Writing the files.
    pub prepare_s: f64,
}

pub use crate::results::Target;

/// The whole result.
#[derive(Debug, Clone, Serialize)]
pub struct IncastReport {
    /// "incast".
    pub experiment: &'static str,
    /// Version of this report's format.
    pub version: u32,
    /// When it started.
    pub started_unix_s: u64,
    /// How long it took, teardown included.
    pub duration_s: f64,
    /// Building the network (all its namespaces).
    pub network_build_s: f64,
    /// Tearing it down.
    pub teardown_s: f64,
    /// Each cluster's start.
    pub clusters: Vec<ClusterTiming>,
    /// The testbed.
    pub testbed: Testbed,
    /// The raw TCP stream, and what limited it.
    pub calibration: Calibration,
    /// What was measured.
    pub config: IncastConfig,
    /// The measurements.
    pub points: Vec<Point>,
    /// Points that failed.
    pub failed: Vec<FailedPoint>,
    /// The targets, computed from the points.
    pub targets: Vec<Target>,
    /// How late the host ran Tessera's expired timers: measured and reported, but the
    /// scheduling of 65 hosts on the machine's CPUs, not a target ([`timers_as_run`]).
    pub timers_as_run: Option<String>,
}

/// Run it; writes `DIR/incast.{json,csv,md,png}`. Returns the report and the files.
pub fn run(
    lab: &LabConfig,
    config: &IncastConfig,
) -> Result<(IncastReport, Vec<PathBuf>), LabError> {
    let start = Instant::now();
    let started_unix_s = super::unix_time_s();
    let hosts_max = config.servers.iter().copied().max().unwrap_or(1);
    let topology = Topology::cluster(RunPrefix::new(), hosts_max, lab.link)?;
    lab.say(&format!(
        "building the network: manager, client, {hosts_max} servers, links {}, switch \
         buffer {}, bucket {} bytes ({})",
        lab.link.rate,
        lab.link.switch_buffer,
        lab.link.burst_bytes(),
        topology.prefix.as_str()
    ));
    let began = Instant::now();
    let network = Network::build(topology)?;
    let network_build_s = began.elapsed().as_secs_f64();
    lab.say(&format!(
        "{} namespaces built in {network_build_s:.1} s",
        network.topology().namespaces().len()
    ));
    let seconds = if config.quick { 0.5 } else { 2.0 };
    let calibration = calibrate(&network, &lab.link, CLIENT_HOST, "s1", seconds, &lab.cancel)?;
    lab.say(&calibration.markdown());

    let mut measured = Measured::default();
    let mut clusters = Vec::new();
    for &servers in &config.servers {
        lab.cancel.check()?;
        clusters.push(measure_cluster(
            lab,
            config,
            &network,
            servers,
            &mut measured,
        )?);
    }
    let began = Instant::now();
    network.teardown()?;
    let teardown_s = began.elapsed().as_secs_f64();
    lab.say(&format!("torn down in {teardown_s:.1} s"));

    let targets = targets(config, &measured.points, &measured.failed);
    let timers_as_run = timers_as_run(&measured.points, Some(calibration.wakeups.late_us_max));
    let report = IncastReport {
        experiment: "incast",
        // 2: the time from arming a timer to handling it left the targets (`timers_as_run`).
        version: 2,
        started_unix_s,
        duration_s: start.elapsed().as_secs_f64(),
        network_build_s,
        teardown_s,
        clusters,
        testbed: Testbed::describe(lab),
        calibration,
        config: config.clone(),
        points: measured.points,
        failed: measured.failed,
        targets,
        timers_as_run,
    };
    let paths = results::write_outputs(
        &lab.out_dir,
        "incast",
        &report,
        &table(&report),
        &preamble(&report),
        &figure(&report),
    )?;
    Ok((report, paths))
}

/// The points so far.
#[derive(Debug, Default)]
struct Measured {
    points: Vec<Point>,
    failed: Vec<FailedPoint>,
}

/// Every line and stripe unit on one cluster of `servers` servers.
fn measure_cluster(
    lab: &LabConfig,
    config: &IncastConfig,
    network: &Network,
    servers: u32,
    measured: &mut Measured,
) -> Result<ClusterTiming, LabError> {
    let began = Instant::now();
    // The datagram transport's servers serve TCP too: one cluster serves every line.
    let mut spec = ClusterSpec::new(lab.exe.clone(), servers, Transport::Adaptive);
    spec.server_args = config.server_args.clone();
    spec.client_args = config.client_args.clone();
    let mut cluster = Cluster::start(network, spec, &lab.cancel)?;
    let start_s = began.elapsed().as_secs_f64();

    let began = Instant::now();
    let files: Vec<FileSpec> = config
        .stripe_units_bytes
        .iter()
        .map(|&unit| config.file(servers, unit))
        .collect();
    let bytes: u64 = files.iter().map(|f| f.bytes).sum();
    let job = ClientJob::Prepare {
        files: files.clone(),
    };
    // Written over TCP, so that the servers' datagram counters (their longest timeout
    // above all, which counts since they started) begin with the Tessera line's reads.
    let timeout = config.job_timeout(bytes, 0, lab);
    match cluster.run_job_over(&job, Transport::Tcp, timeout)? {
        ClientReport::Prepared { .. } => {}
        _ => {
            return Err(LabError::WrongReport {
                job: job.kind().into(),
            })
        }
    }
    let prepare_s = began.elapsed().as_secs_f64();
    lab.say(&format!(
        "{servers} servers: cluster up in {start_s:.1} s, files written in {prepare_s:.1} s"
    ));

    // The hosts that send data toward the client's port, and the client: they get the
    // line's rto_min, and their TCP counters are summed. The manager is one of them: the
    // client looks the file up before every read, and its answers queue at the same port.
    let senders: Vec<String> = [CLIENT_HOST, MANAGER_HOST]
        .into_iter()
        .map(str::to_string)
        .chain((1..=servers).map(server_host))
        .collect();
    for &line in &config.lines {
        for host in &senders {
            network.set_rto_min(host, line.rto_min_ms())?;
        }
        for file in &files {
            lab.cancel.check()?;
            let began = Instant::now();
            let what = format!(
                "{servers} servers, {} KiB, {}",
                file.stripe_unit_bytes >> 10,
                line.name()
            );
            match measure_point(lab, config, network, &mut cluster, &senders, file, line) {
                Ok(point) => {
                    lab.say(&format!(
                        "{what}: {} in {:.1} s",
                        brief(&point),
                        began.elapsed().as_secs_f64()
                    ));
                    measured.points.push(point);
                }
                // The client gave up (a server silent past its request timeout, wrong
                // bytes) or ran out of time: a result of this point, not of the run.
                Err(
                    e @ (LabError::ClientFailed { .. }
                    | LabError::Timeout { .. }
                    | LabError::Corrupt { .. }),
                ) => {
                    lab.say(&format!("{what}: failed: {e}"));
                    measured.failed.push(FailedPoint {
                        servers,
                        stripe_unit_bytes: file.stripe_unit_bytes,
                        line,
                        error: e.to_string(),
                    });
                }
                Err(e) => return Err(e),
            }
        }
        if line.rto_min_ms().is_some() {
            for host in &senders {
                network.set_rto_min(host, None)?;
            }
        }
    }
    Ok(ClusterTiming {
        servers,
        start_s,
        prepare_s,
    })
}

/// Drop counters of the cluster's part of the network.
struct Drops {
    client_port: u64,
    total: u64,
}

fn drops(network: &Network, hosts: &[String]) -> Result<Drops, LabError> {
    let ports = network.port_drops()?;
    let mut total: u64 = ports.values().sum();
    for host in hosts {
        total += network.nic_drops(host)?;
    }
    Ok(Drops {
        client_port: ports.get(CLIENT_HOST).copied().unwrap_or(0),
        total,
    })
}

fn tcp_counters(network: &Network, hosts: &[String]) -> Result<TcpCounters, LabError> {
    hosts.iter().try_fold(TcpCounters::default(), |sum, host| {
        Ok(sum.plus(&TcpCounters::of_host(network, host)?))
    })
}

/// One point: the job, with the kernel's counters and the drops read around it.
fn measure_point(
    lab: &LabConfig,
    config: &IncastConfig,
    network: &Network,
    cluster: &mut Cluster<'_>,
    hosts: &[String],
    file: &FileSpec,
    line: Line,
) -> Result<Point, LabError> {
    let servers = file.width.unwrap_or(1);
    let block_bytes = IncastConfig::block_bytes(servers, file.stripe_unit_bytes);
    let reads = config.reads_of(block_bytes);
    let job = ClientJob::SyncReads {
        file: file.clone(),
        block_bytes,
        reads,
        read_ahead: config.read_ahead,
    };
    let timeout = config.job_timeout(block_bytes * u64::from(reads), reads, lab);
    let tcp_before = tcp_counters(network, hosts)?;
    let drops_before = drops(network, hosts)?;
    let report = cluster.run_job_over(&job, line.transport(), timeout)?;
    let drops_after = drops(network, hosts)?;
    let tcp = tcp_counters(network, hosts)?.since(&tcp_before);
    let ClientReport::SyncReads(sample) = report else {
        return Err(LabError::WrongReport {
            job: job.kind().into(),
        });
    };
    Ok(point(
        lab.link.rate,
        file,
        line,
        &sample,
        tcp,
        Drops {
            client_port: drops_after
                .client_port
                .saturating_sub(drops_before.client_port),
            total: drops_after.total.saturating_sub(drops_before.total),
        },
    ))
}

/// A point from what the client and the lab measured.
fn point(
    rate: Rate,
    file: &FileSpec,
    line: Line,
    sample: &SyncReadsSample,
    kernel_tcp: TcpCounters,
    drops: Drops,
) -> Point {
    let datagram_servers = counters_grown(
        &sample.server_counters_before,
        &sample.server_counters_after,
    );
    let datagram_client = counters_grown(
        &[(0, sample.client_counters_before.clone())],
        &[(0, sample.client_counters_after.clone())],
    );
    let datagram = |name: &str| {
        datagram_servers.get(name).copied().unwrap_or(0)
            + datagram_client.get(name).copied().unwrap_or(0)
    };
    let timeout_us_max_before = sample
        .server_counters_before
        .iter()
        .filter_map(|(_, c)| c.get("timeout_us_max"))
        .copied()
        .max()
        .filter(|_| !line.is_tcp());
    let (retransmissions, timeouts, timeout_us_max) = if line.is_tcp() {
        (kernel_tcp.retransmitted_segments, kernel_tcp.timeouts, None)
    } else {
        let longest = [&datagram_servers, &datagram_client]
            .iter()
            .filter_map(|c| c.get("timeout_us_max"))
            .copied()
            .max();
        (datagram("retransmissions"), datagram("timeouts"), longest)
    };
    let link_utilization = sample
        .link_rx_bytes
        .zip(sample.link_tx_bytes)
        .map(|(rx, tx)| rx.max(tx) as f64 / (rate.bytes_per_s() * sample.seconds.max(1e-9)));
    Point {
        servers: file.width.unwrap_or(1),
        stripe_unit_bytes: file.stripe_unit_bytes,
        line,
        block_bytes: sample.block_bytes,
        reads: sample.reads,
        bytes: sample.bytes,
        seconds: sample.seconds,
        goodput_fraction: sample.bytes_per_s() / rate.bytes_per_s(),
        read_us_median: sample.read_us_median,
        read_us_p99: sample.read_us_p99,
        read_us_max: sample.read_us_max,
        link_utilization,
        cpu_busy: sample.cpu_busy,
        cpu_kernel: sample.cpu_kernel,
        limit: Limit::classify(link_utilization.unwrap_or(0.0), sample.cpu_busy),
        client_port_drops: drops.client_port,
        tbf_drops: drops.total,
        retransmissions,
        timeouts,
        timeout_us_max,
        timeout_us_max_before,
        kernel_tcp,
        datagram_servers,
        datagram_client,
        verified_blocks: sample.verified_blocks,
    }
}

/// How much each counter grew from `before` to `after`, summed over servers; counters that
/// hold a maximum (`*_max`) are the largest value after, not a growth.
pub fn counters_grown(before: &[(u32, Counters)], after: &[(u32, Counters)]) -> Counters {
    let mut out = Counters::new();
    for (server, counters) in after {
        let earlier = before.iter().find(|(id, _)| id == server).map(|(_, c)| c);
        for (name, &value) in counters {
            let entry = out.entry(name.clone()).or_insert(0);
            if name.ends_with(MAXIMUM_SUFFIX) {
                *entry = (*entry).max(value);
            } else {
                let base = earlier.and_then(|c| c.get(name)).copied().unwrap_or(0);
                *entry += value.saturating_sub(base);
            }
        }
    }
    out
}

/// The targets, from the points; a failed Tessera point fails the goodput target.
pub fn targets(config: &IncastConfig, points: &[Point], failed: &[FailedPoint]) -> Vec<Target> {
    let of = |line: Line| points.iter().filter(move |p| p.line == line);
    let mut out = Vec::new();
    let tessera_failed = failed.iter().find(|f| f.line == Line::Tessera);

    let lowest = of(Line::Tessera).min_by(|a, b| a.goodput_fraction.total_cmp(&b.goodput_fraction));
    out.push(Target {
        goal: format!(
            "Tessera's goodput at least {GOODPUT_TARGET} of the link at every N, for every \
             stripe unit"
        ),
        measured: match (tessera_failed, lowest) {
            (Some(f), _) => format!(
                "failed at N = {}, {} KiB: {}",
                f.servers,
                f.stripe_unit_bytes >> 10,
                f.error
            ),
            (None, Some(p)) => format!(
                "lowest {:.3} (N = {}, {} KiB)",
                p.goodput_fraction,
                p.servers,
                p.stripe_unit_bytes >> 10
            ),
            (None, None) => "no Tessera points".into(),
        },
        pass: match tessera_failed {
            Some(_) => Some(false),
            None => lowest.map(|p| p.goodput_fraction >= GOODPUT_TARGET),
        },
    });

    // A retransmission timeout is the time a timer is armed for, as the issue's "timeouts of a
    // few hundred microseconds" and TCP's 200 ms rto_min are: backoff included, it must stay
    // within the ceiling. How late a host of 65 on two CPUs runs an expired timer is the
    // testbed's, reported apart ([`timers_as_run`]). So is the wait a timer adds for the ACK
    // holds its peer reports (a client that holds its ACKs is slow to answer, not lossy):
    // it is stated beside the RTO, not in it.
    let counter = |name: &'static str| {
        of(Line::Tessera)
            .flat_map(|p| [&p.datagram_servers, &p.datagram_client])
            .filter_map(move |counters| counters.get(name).copied())
    };
    let reported =
        of(Line::Tessera).count() > 0 && of(Line::Tessera).all(|p| p.timeout_us_max.is_some());
    let longest_timer = counter("timer_us_max").max();
    let longest_hold_wait = counter("ack_hold_wait_us_max").max().unwrap_or(0);
    // How many timers were armed past the ceiling because the measured RTO was longer.
    let long_timeouts: u64 = counter("long_timeouts").sum();
    let timeouts: u64 = counter("timeouts").sum();
    out.push(Target {
        goal: format!(
            "no Tessera retransmission timeout longer than {TIMEOUT_US_TARGET} us (each timer \
             as armed, backoff included; without the wait for a peer's reported ACK holds)"
        ),
        measured: match longest_timer {
            Some(timer) if reported => format!(
                "longest {timer} us; {long_timeouts} of {timeouts} timeouts had timers longer \
                 than {TIMEOUT_US_TARGET} us, because the round trip stayed longer; the \
                 longest wait for a peer's ACK holds {longest_hold_wait} us"
            ),
            _ => "not reported by the servers".into(),
        },
        pass: longest_timer
            .filter(|_| reported)
            .map(|timer| timer <= TIMEOUT_US_TARGET),
    });

    let total = |line: Line| -> Option<u64> {
        (config.lines.contains(&line) && of(line).next().is_some())
            .then(|| of(line).map(|p| p.client_port_drops).sum())
    };
    let tessera = total(Line::Tessera);
    let tcp_lines: Vec<(Line, u64)> = [Line::Tcp, Line::TcpRtoMin]
        .into_iter()
        .filter_map(|line| Some((line, total(line)?)))
        .collect();
    out.push(Target {
        goal: "fewer drops at the client's switch port with Tessera than with either TCP line \
               (summed over all points)"
            .into(),
        measured: {
            let mut parts: Vec<String> = tessera
                .map(|d| format!("Tessera {d}"))
                .into_iter()
                .collect();
            parts.extend(tcp_lines.iter().map(|(l, d)| format!("{} {d}", l.label())));
            parts.join(", ")
        },
        // Without TCP drops there was no incast to compare with.
        pass: tessera
            .filter(|_| tcp_lines.iter().any(|(_, d)| *d > 0))
            .map(|t| tcp_lines.iter().all(|(_, d)| t < *d)),
    });
    out
}

/// How late the host ran Tessera's expired timers: the longest time from arming a timer to
/// handling it, with the CPU load of the point where it happened. Not a target: past the
/// length of the timer, it is how long a process of 65 on the machine's CPUs waited for one
/// (`idle_wakeup_late_us_max`, from the calibration, is how late the idle host woke a short
/// sleep at most, the floor under any timer of the run). `None` without Tessera points, or
/// when a point's servers did not report it.
pub fn timers_as_run(points: &[Point], idle_wakeup_late_us_max: Option<f64>) -> Option<String> {
    let tessera: Vec<&Point> = points.iter().filter(|p| p.line == Line::Tessera).collect();
    if tessera.is_empty() || tessera.iter().any(|p| p.timeout_us_max.is_none()) {
        return None;
    }
    let (us, p) = tessera
        .iter()
        .filter_map(|p| Some((p.timeout_us_max?, *p)))
        .max_by_key(|(us, _)| *us)?;
    let expired_before = matches!(p.timeout_us_max_before, Some(before) if before >= us);
    Some(format!(
        "the longest Tessera timeout took {us} us from arming to handling (after N = {}, {} KiB; \
         servers count since they started{}); past the timer's length, that is how late the \
         busy host ran it (its CPUs were {:.0}% busy during that point's reads, {:.0}% in the \
         kernel{})",
        p.servers,
        p.stripe_unit_bytes >> 10,
        if expired_before {
            ", and it had expired before that point's reads"
        } else {
            ""
        },
        p.cpu_busy * 100.0,
        p.cpu_kernel * 100.0,
        idle_wakeup_late_us_max.map_or(String::new(), |late| format!(
            "; idle, it woke a 100 us sleep up to {late:.0} us late"
        ))
    ))
}

/// One line of progress for a point.
fn brief(p: &Point) -> String {
    format!(
        "goodput {:.3}, port drops {}, retransmissions {}, timeouts {}{}, read max {:.1} ms, \
         CPU {:.0}% ({:.0}% in the kernel; {})",
        p.goodput_fraction,
        p.client_port_drops,
        p.retransmissions,
        p.timeouts,
        p.timeout_us_max
            .map_or(String::new(), |us| format!(" (longest {us} us)")),
        p.read_us_max / 1000.0,
        p.cpu_busy * 100.0,
        p.cpu_kernel * 100.0,
        p.limit.name()
    )
}

/// Every point, one row each: the CSV, and the Markdown's last table.
fn table(report: &IncastReport) -> Table {
    let mut table = Table::new(&[
        "servers",
        "unit KiB",
        "line",
        "block bytes",
        "reads",
        "seconds",
        "goodput",
        "read ms median",
        "read ms p99",
        "read ms max",
        "link busy",
        "CPU busy",
        "CPU in kernel",
        "limit",
        "client port drops",
        "tbf drops",
        "retransmissions",
        "timeouts",
        "timeout us max",
        "before: timeout us max",
        "kernel TCP retransmissions",
        "kernel TCP timeouts",
        "kernel TCP loss probes",
    ]);
    for p in &report.points {
        table.push(vec![
            p.servers.into(),
            (p.stripe_unit_bytes >> 10).into(),
            p.line.name().into(),
            Cell::Int(p.block_bytes as i64),
            p.reads.into(),
            Cell::float(p.seconds, 3),
            Cell::float(p.goodput_fraction, 3),
            Cell::float(p.read_us_median / 1000.0, 2),
            Cell::float(p.read_us_p99 / 1000.0, 2),
            Cell::float(p.read_us_max / 1000.0, 2),
            p.link_utilization.map(|u| Cell::float(u, 3)).into(),
            Cell::float(p.cpu_busy, 2),
            Cell::float(p.cpu_kernel, 2),
            p.limit.name().into(),
            Cell::Int(p.client_port_drops as i64),
            Cell::Int(p.tbf_drops as i64),
            Cell::Int(p.retransmissions as i64),
            Cell::Int(p.timeouts as i64),
            p.timeout_us_max.map(|us| Cell::Int(us as i64)).into(),
            p.timeout_us_max_before
                .map(|us| Cell::Int(us as i64))
                .into(),
            Cell::Int(p.kernel_tcp.retransmitted_segments as i64),
            Cell::Int(p.kernel_tcp.timeouts as i64),
            Cell::Int(p.kernel_tcp.loss_probes() as i64),
        ]);
    }
    table
}

/// The table of one stripe unit: a row per N, per line its goodput, drops at the client's
/// port, retransmissions and timeouts.
pub fn unit_table(report: &IncastReport, stripe_unit_bytes: u32) -> Table {
    let lines = &report.config.lines;
    let mut columns = vec!["N".to_string()];
    for line in lines {
        for what in ["goodput", "drops", "retrans.", "timeouts"] {
            columns.push(format!("{} {what}", line.label()));
        }
    }
    let names: Vec<&str> = columns.iter().map(String::as_str).collect();
    let mut table = Table::new(&names);
    for &servers in &report.config.servers {
        let mut row: Vec<Cell> = vec![servers.into()];
        let mut any = false;
        for &line in lines {
            let point = report.points.iter().find(|p| {
                p.servers == servers && p.stripe_unit_bytes == stripe_unit_bytes && p.line == line
            });
            any |= point.is_some();
            match point {
                Some(p) => row.extend([
                    Cell::float(p.goodput_fraction, 3),
                    Cell::Int(p.client_port_drops as i64),
                    Cell::Int(p.retransmissions as i64),
                    Cell::Int(p.timeouts as i64),
                ]),
                None => row.extend([Cell::Empty, Cell::Empty, Cell::Empty, Cell::Empty]),
            }
        }
        if any {
            table.push(row);
        }
    }
    table
}

fn preamble(report: &IncastReport) -> String {
    let c = &report.config;
    let mut out = format!(
        "# TCP incast: synchronized reads against the number of servers{}\n\n{}\n\n{}\n\n\
         Each point reads a RAID-0 file striped over N servers one block at a time: a block \
         is a whole stripe, a stripe unit from every server, all requested at once{} \
         (`Client::read_blocks`, each read timed in the client from its requests to its last \
         byte). Reads per point: {}. Goodput is user bytes per second over the link rate. \
         \"drops\" are the frames the switch port toward the client dropped (its `tbf` \
         queue), \"retrans.\" and \"timeouts\" the retransmitted segments and retransmission \
         timer expiries of the kernel's TCP (`RetransSegs`, `TCPTimeouts`) in the namespaces of \
         every server, the client and the manager (the client looks the file up at the \
         manager once, before the first read) for the TCP lines, and those of Tessera's datagram endpoints (servers and client) for \
         Tessera; drops and counters cover the whole job (an untimed first read included). \
         TCP with rto_min 1 ms sets `rto_min 1ms` on the routes of the client, the manager \
         and every server. A lost tail of a small answer is often recovered by TCP's tail \
         loss probe rather than by a timeout: with one segment in flight the probe waits two \
         round trips plus rto_min (200 ms by default), a stall as long as a timeout that \
         `TCPTimeouts` does not count; the last table has the probes (`TCPLossProbes`). Files are written over TCP, so the servers' longest datagram \
         timeout (kept since they started) covers the Tessera line's jobs only. Took {:.0} s; building the {} \
         namespaces took {:.1} s, tearing them down {:.1} s.\n\n## Targets\n\n",
        if c.quick { " (quick)" } else { "" },
        report.testbed.markdown(),
        report.calibration.markdown(),
        if c.read_ahead <= 1 {
            ", and the next block only after all of it arrived".to_string()
        } else {
            format!(
                "; the client reads ahead, {} blocks in flight (the next block's requests go \
                 out when the oldest block has arrived whole)",
                c.read_ahead
            )
        },
        match c.reads {
            Some(reads) => format!("{reads}"),
            None => format!(
                "about {} MiB of blocks, at least {} and at most {} reads",
                c.bytes_per_point >> 20,
                c.reads_min,
                c.reads_max
            ),
        },
        report.duration_s,
        c.servers.iter().max().map_or(0, |n| n + 3),
        report.network_build_s,
        report.teardown_s,
    );
    for t in &report.targets {
        let verdict = match t.pass {
            Some(true) => "**met**",
            Some(false) => "**not met**",
            None => "**unknown**",
        };
        out += &format!("- {}: {verdict} — {}.\n", t.goal, t.measured);
    }
    if let Some(timers) = &report.timers_as_run {
        out += &format!("- Not a target, the host's scheduling: {timers}.\n");
    }
    if !report.failed.is_empty() {
        out += "\n## Failed points\n\n";
        for f in &report.failed {
            out += &format!(
                "- N = {}, {} KiB, {}: {}\n",
                f.servers,
                f.stripe_unit_bytes >> 10,
                f.line.label(),
                f.error
            );
        }
    }
    for &unit in &c.stripe_units_bytes {
        out += &format!(
            "\n## Stripe unit {} KiB\n\n{}",
            unit >> 10,
            unit_table(report, unit).to_markdown()
        );
    }
    out += "\n## All points\n";
    out
}

fn figure(report: &IncastReport) -> Figure {
    let c = &report.config;
    let x_max = f64::from(c.servers.iter().copied().max().unwrap_or(2).max(2));
    let x_min = f64::from(c.servers.iter().copied().min().unwrap_or(1));
    let series = |unit: u32, value: &dyn Fn(&Point) -> f64| -> Vec<LineSeries> {
        Line::ALL
            .iter()
            .enumerate()
            .filter(|(_, line)| c.lines.contains(line))
            .map(|(color, &line)| {
                let mut points: Vec<(f64, f64)> = report
                    .points
                    .iter()
                    .filter(|p| p.line == line && p.stripe_unit_bytes == unit)
                    .map(|p| (f64::from(p.servers), value(p)))
                    .collect();
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                LineSeries {
                    label: line.label().into(),
                    color,
                    dashed: false,
                    points,
                }
            })
            .collect()
    };
    let goodput_max = report
        .points
        .iter()
        .map(|p| p.goodput_fraction)
        .fold(1.0f64, f64::max)
        * 1.05;
    let drops_max = report
        .points
        .iter()
        .map(|p| p.client_port_drops as f64)
        .fold(1.0f64, f64::max)
        * 1.1;
    let panel = |title: String, y_label: &str, y_max: f64, series| {
        Panel::Lines(LinePanel {
            title,
            x_label: "servers (N)".into(),
            y_label: y_label.into(),
            x_range: (x_min, x_max),
            x_scale: XScale::Log2,
            y_range: (0.0, y_max),
            series,
        })
    };
    let goodput = c
        .stripe_units_bytes
        .iter()
        .map(|&unit| {
            panel(
                format!("goodput, stripe unit {} KiB", unit >> 10),
                "goodput / link rate",
                goodput_max,
                {
                    let mut lines = series(unit, &|p| p.goodput_fraction);
                    lines.push(LineSeries {
                        label: format!("target {GOODPUT_TARGET}"),
                        color: 7,
                        dashed: true,
                        points: vec![(x_min, GOODPUT_TARGET), (x_max, GOODPUT_TARGET)],
                    });
                    lines
                },
            )
        })
        .collect();
    let drops = c
        .stripe_units_bytes
        .iter()
        .map(|&unit| {
            panel(
                format!("drops at the client's switch port, {} KiB", unit >> 10),
                "frames dropped per point",
                drops_max,
                series(unit, &|p| p.client_port_drops as f64),
            )
        })
        .collect();
    Figure {
        title: format!(
            "TCP incast on Tessera{}: links {}, switch port buffer {} bytes",
            if c.quick { " (quick)" } else { "" },
            Rate {
                bits_per_s: report.testbed.link_rate_bits_per_s
            },
            report.testbed.switch_buffer_bytes
        ),
        rows: vec![goodput, drops],
        width_px: 1600,
        row_height_px: 450,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_is_a_subset_of_full() {
        let (full, quick) = (IncastConfig::full(), IncastConfig::quick());
        assert_eq!(full.servers, [1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(quick.servers, [1, 2, 4, 8, 16]);
        assert!(quick.servers.iter().all(|n| full.servers.contains(n)));
        assert_eq!(quick.stripe_units_bytes, full.stripe_units_bytes);
        assert_eq!(full.stripe_units_bytes, [32 << 10, 256 << 10]);
        assert_eq!(quick.lines, Line::ALL);
        assert!(quick.bytes_per_point < full.bytes_per_point);
        let link = IncastConfig::link_defaults();
        assert_eq!(link.rate, Rate::mbit(1000));
        assert_eq!(link.switch_buffer.bytes(), 32768);
        assert_eq!(link.burst_bytes(), 125_000, "a millisecond of the rate");
    }

    #[test]
    fn lines_parse_by_name() {
        for line in Line::ALL {
            assert_eq!(line.name().parse::<Line>().unwrap(), line);
        }
        assert!("udp".parse::<Line>().is_err());
        assert_eq!(Line::TcpRtoMin.rto_min_ms(), Some(1));
        assert_eq!(Line::Tcp.rto_min_ms(), None);
        assert_eq!(Line::Tessera.transport(), Transport::Adaptive);
        assert_eq!(
            serde_json::to_string(&Line::TcpRtoMin).unwrap(),
            "\"tcp-rto1ms\""
        );
    }

    #[test]
    fn files_are_whole_blocks_and_reads_move_about_the_budget() {
        let c = IncastConfig::full();
        let f = c.file(4, 32 << 10);
        assert_eq!(f.width, Some(4));
        assert_eq!(f.scheme, Scheme::Raid0);
        assert_eq!(f.bytes, 8 << 20, "8 MiB of 128 KiB blocks");
        let big = c.file(64, 256 << 10);
        assert_eq!(big.bytes, 4 * (16 << 20), "at least four blocks");
        assert_eq!(big.bytes % IncastConfig::block_bytes(64, 256 << 10), 0);
        assert_ne!(c.file(4, 256 << 10).path, f.path);
        assert_eq!(c.reads_of(32 << 10), 4000, "capped");
        assert_eq!(c.reads_of(1 << 20), 128);
        assert_eq!(c.reads_of(16 << 20), 20, "at least the minimum");
        let fixed = IncastConfig {
            reads: Some(7),
            ..IncastConfig::quick()
        };
        assert_eq!(fixed.reads_of(1 << 20), 7);
    }

    fn counters(pairs: &[(&str, u64)]) -> Counters {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn counters_grow_summed_and_maxima_are_the_largest_after() {
        let before = vec![
            (
                1,
                counters(&[("retransmissions", 10), ("timeout_us_max", 800)]),
            ),
            (2, counters(&[("retransmissions", 5)])),
        ];
        let after = vec![
            (
                1,
                counters(&[("retransmissions", 13), ("timeout_us_max", 900)]),
            ),
            (
                2,
                counters(&[("retransmissions", 9), ("timeout_us_max", 300)]),
            ),
            (3, counters(&[("retransmissions", 1)])),
        ];
        assert_eq!(
            counters_grown(&before, &after),
            counters(&[("retransmissions", 3 + 4 + 1), ("timeout_us_max", 900)])
        );
        assert!(counters_grown(&before, &[]).is_empty());
    }

    fn sample(seconds: f64, server_after: Counters) -> SyncReadsSample {
        SyncReadsSample {
            reads: 100,
            block_bytes: 4 * 32768,
            bytes: 100 * 4 * 32768,
            seconds,
            read_us_median: 1000.0,
            read_us_p99: 3000.0,
            read_us_max: 200_000.0,
            cpu_busy: 0.4,
            cpu_kernel: 0.3,
            link_rx_bytes: Some(13_700_000),
            link_tx_bytes: Some(100_000),
            verified_blocks: 2,
            server_counters_before: vec![(1, Counters::new())],
            server_counters_after: vec![(1, server_after)],
            client_counters_before: Counters::new(),
            client_counters_after: counters(&[("retransmissions", 1)]),
        }
    }

    fn report(points: Vec<Point>) -> IncastReport {
        let lab = LabConfig::new(
            "/bin/tessera".into(),
            IncastConfig::link_defaults(),
            "results".into(),
            crate::cmd::Cancel::new(),
        );
        let stream = crate::probe::StreamStats {
            bytes: 1,
            seconds: 1.0,
            bits_per_s: 9e8,
            cpu_busy: 0.5,
            drops: 0,
        };
        let echo = crate::probe::EchoStats {
            sent: 1,
            received: 1,
            rtt_us_min: 50.0,
            rtt_us_median: 50.0,
            rtt_us_max: 50.0,
        };
        let config = IncastConfig {
            servers: vec![4],
            stripe_units_bytes: vec![32 << 10],
            ..IncastConfig::quick()
        };
        IncastReport {
            experiment: "incast",
            version: 1,
            started_unix_s: 0,
            duration_s: 1.0,
            network_build_s: 0.1,
            teardown_s: 0.1,
            clusters: Vec::new(),
            testbed: Testbed::describe(&lab),
            calibration: Calibration {
                configured_bits_per_s: 1_000_000_000,
                stream_from_client: stream.clone(),
                stream_to_client: stream,
                stream_fraction: 0.9,
                cpu_busy: 0.5,
                background_cpu_busy: 0.0,
                echo,
                wakeups: crate::probe::WakeupStats::of(100, &mut [5.0, 1500.0], 10_000.0),
                limit: Limit::Network,
            },
            targets: targets(&config, &points, &[]),
            timers_as_run: timers_as_run(&points, Some(1500.0)),
            config,
            points,
            failed: Vec::new(),
        }
    }

    fn points() -> Vec<Point> {
        let config = IncastConfig::quick();
        let file = config.file(4, 32 << 10);
        let rate = Rate::mbit(1000);
        let tcp = TcpCounters {
            retransmitted_segments: 40,
            timeouts: 12,
            all: Default::default(),
        };
        let drops = |n| Drops {
            client_port: n,
            total: n + 1,
        };
        vec![
            // 13.1 MB in 1 s over 125 MB/s.
            point(
                rate,
                &file,
                Line::Tcp,
                &sample(1.0, Counters::new()),
                tcp.clone(),
                drops(300),
            ),
            point(
                rate,
                &file,
                Line::TcpRtoMin,
                &sample(0.2, Counters::new()),
                tcp,
                drops(250),
            ),
            point(
                rate,
                &file,
                Line::Tessera,
                &sample(
                    0.11,
                    counters(&[
                        ("retransmissions", 6),
                        ("timeouts", 2),
                        ("timeout_us_max", 1500),
                        ("timer_us_max", 900),
                    ]),
                ),
                TcpCounters::default(),
                drops(5),
            ),
        ]
    }

    #[test]
    fn points_take_their_line_counters_and_goodput() {
        let p = points();
        assert!((p[0].goodput_fraction - 13_107_200.0 / 125e6).abs() < 1e-9);
        assert_eq!((p[0].retransmissions, p[0].timeouts), (40, 12));
        assert_eq!(p[0].timeout_us_max, None);
        assert_eq!(p[0].client_port_drops, 300);
        assert_eq!(p[0].tbf_drops, 301);
        assert_eq!(p[0].servers, 4);
        assert!((p[0].link_utilization.unwrap() - 13_700_000.0 / 125e6).abs() < 1e-9);
        assert_eq!(p[0].limit, Limit::Latency);
        // Tessera: servers' 6 and the client's 1.
        assert_eq!((p[2].retransmissions, p[2].timeouts), (7, 2));
        assert_eq!(p[2].timeout_us_max, Some(1500));
        assert_eq!(p[2].timeout_us_max_before, None, "none before");
        assert!(p[2].goodput_fraction > 0.9);
        assert_eq!(p[2].limit, Limit::Network);
    }

    #[test]
    fn targets_are_computed_from_the_points() {
        let t = targets(&IncastConfig::quick(), &points(), &[]);
        assert_eq!(t.len(), 3);
        assert_eq!(t[0].pass, Some(true), "{:?}", t[0]);
        assert_eq!(t[1].pass, Some(true), "armed for 900 us: {:?}", t[1]);
        assert!(t[1].measured.starts_with("longest 900 us"), "{:?}", t[1]);
        assert_eq!(t[2].pass, Some(true));
        assert_eq!(t[2].measured, "Tessera 5, TCP 300, TCP, rto_min 1 ms 250");
        let mut long = points();
        long[2].datagram_servers.insert("timer_us_max".into(), 1200);
        let t = targets(&IncastConfig::quick(), &long, &[]);
        assert_eq!(
            t[1].pass,
            Some(false),
            "a timer armed for 1200 us: {:?}",
            t[1]
        );
        let mut slow = points();
        slow[2].goodput_fraction = 0.5;
        slow[2].timeout_us_max = None;
        slow[2].client_port_drops = 250;
        let t = targets(&IncastConfig::quick(), &slow, &[]);
        assert_eq!(t[0].pass, Some(false));
        assert_eq!(t[1].pass, None, "not reported");
        assert_eq!(t[2].pass, Some(false), "not fewer than rto_min's 250");
        let t = targets(&IncastConfig::quick(), &[], &[]);
        assert!(t.iter().all(|t| t.pass.is_none()));
        let failed = FailedPoint {
            servers: 16,
            stripe_unit_bytes: 32 << 10,
            line: Line::Tessera,
            error: "timed out".into(),
        };
        let t = targets(&IncastConfig::quick(), &points(), &[failed]);
        assert_eq!(t[0].pass, Some(false), "a failed point misses the target");
        assert!(t[0].measured.contains("N = 16"));
    }

    #[test]
    fn timers_as_run_name_the_longest_and_the_load_of_its_point() {
        let text = timers_as_run(&points(), Some(1200.0)).expect("reported");
        assert!(
            text.starts_with("the longest Tessera timeout took 1500 us from arming to handling"),
            "{text}"
        );
        assert!(
            text.contains("woke a 100 us sleep up to 1200 us late"),
            "{text}"
        );
        let mut slow = points();
        slow[2].timeout_us_max = None;
        assert_eq!(timers_as_run(&slow, None), None, "not reported");
        assert_eq!(timers_as_run(&[], None), None, "no Tessera points");
    }

    #[test]
    fn tables_have_a_row_per_n_and_columns_per_line() {
        let r = report(points());
        let t = unit_table(&r, 32 << 10);
        assert_eq!(t.columns.len(), 1 + 3 * 4);
        assert_eq!(t.columns[1], "TCP goodput");
        assert_eq!(t.columns[12], "Tessera timeouts");
        assert_eq!(t.rows.len(), 1);
        let md = t.to_markdown();
        assert!(
            md.contains(
                "| 4 | 0.105 | 300 | 40 | 12 | 0.524 | 250 | 40 | 12 | 0.953 | 5 | 7 | 2 |"
            ),
            "{md}"
        );
        assert!(unit_table(&r, 256 << 10).rows.is_empty());
        let all = table(&r);
        assert_eq!(all.rows.len(), 3);
        assert!(all
            .to_csv()
            .contains("\n4,32,tessera,131072,100,0.110,0.953,"));
        let text = preamble(&r);
        assert!(
            text.contains("**met**") && !text.contains("**not met**"),
            "{text}"
        );
        assert!(
            text.contains("- Not a target, the host's scheduling: the longest Tessera timeout"),
            "{text}"
        );
        assert!(text.contains("## Stripe unit 32 KiB"));
        let f = figure(&r);
        assert_eq!(f.rows.len(), 2);
        let Panel::Lines(goodput) = &f.rows[0][0] else {
            panic!("a line panel")
        };
        assert_eq!(goodput.series.len(), 4, "three lines and the target");
        assert_eq!(goodput.x_scale, XScale::Log2);
    }
}
