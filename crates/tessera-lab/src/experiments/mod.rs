//! The experiments, and what they share: the lab's settings, the description of the testbed,
//! the calibration of the link rate against a raw TCP stream, and statistics.
//!
//! - [`check`]: the smoke test: build, echo across the bridge, store and read a file, tear down.
//! - [`calibrate`](mod@calibrate): a raw TCP stream and Tessera at several link rates, with CPU use, to show
//!   at which rates this machine is network-bound.
//! - [`swift_window`]: Swift/RAID's figures 2–5 (Fullmer, Long, Cabrera 1995).
//! - [`incast`]: TCP incast (Phanishayee et al.): synchronized reads from 1 to 64 servers
//!   through one switch port, over TCP, TCP with a 1 ms minimum RTO, and Tessera.
//! - [`radon`]: Shewmaker's Radon experiments (punctuated, fairshare, unfair): six streams into
//!   one switch port, constant-rate, Radon and Tessera (admission control) lines.
//! - [`total_order`]: Greenman's two-switch testbed with `tessera-order` over multicast, beside
//!   a raw multicast UDP stream through the same switches.

pub mod calibrate;
pub mod check;
pub mod incast;
pub mod radon;
pub mod swift_window;
pub mod total_order;

use crate::cmd::Cancel;
use crate::job::Sample;
use crate::net::{LinkSpec, Network, Rate, FRAME_BYTES_MAX};
use crate::probe::{self, EchoStats, StreamStats, WakeupStats};
use crate::LabError;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Where progress lines go (the binary prints them to stderr).
pub type Progress = Arc<dyn Fn(&str) + Send + Sync>;

/// Settings every experiment takes.
#[derive(Clone)]
pub struct LabConfig {
    /// The tessera binary whose daemons and `lab-client` run on the hosts.
    pub exe: PathBuf,
    /// The links.
    pub link: LinkSpec,
    /// Where `NAME.{json,csv,md,png}` go.
    pub out_dir: PathBuf,
    /// Set by the signal handler to stop and tear down.
    pub cancel: Cancel,
    /// Progress lines.
    pub progress: Progress,
}

impl LabConfig {
    /// Settings with progress printed to stderr.
    pub fn new(exe: PathBuf, link: LinkSpec, out_dir: PathBuf, cancel: Cancel) -> LabConfig {
        LabConfig {
            exe,
            link,
            out_dir,
            cancel,
            progress: Arc::new(|line| eprintln!("lab: {line}")),
        }
    }

    pub(crate) fn say(&self, line: &str) {
        (self.progress)(line);
    }
}

/// The machine and network an experiment ran on.
#[derive(Debug, Clone, Serialize)]
pub struct Testbed {
    /// Configured rate of every link, each direction.
    pub link_rate_bits_per_s: u64,
    /// Queue of each switch port toward a host.
    pub switch_buffer_bytes: u64,
    /// Transmit queue of each host.
    pub nic_buffer_bytes: u64,
    /// `tbf` bucket.
    pub burst_bytes: u64,
    /// Bytes of a full-MTU frame as `tbf` counts it.
    pub frame_bytes: u64,
    /// CPUs of the machine (every host shares them).
    pub cpus: usize,
    /// Kernel release.
    pub kernel: String,
    /// How long an idle CPU polled before halting, in microseconds ([`crate::host`]);
    /// `None` on a machine without the `haltpoll` governor.
    pub halt_poll_us: Option<u64>,
    /// The tessera binary.
    pub tessera: String,
}

impl Testbed {
    /// This machine with `link`.
    pub fn describe(config: &LabConfig) -> Testbed {
        Testbed {
            link_rate_bits_per_s: config.link.rate.bits_per_s,
            switch_buffer_bytes: config.link.switch_buffer.bytes(),
            nic_buffer_bytes: config.link.nic_buffer.bytes(),
            burst_bytes: config.link.burst_bytes(),
            frame_bytes: FRAME_BYTES_MAX,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
            halt_poll_us: crate::host::halt_poll_us(),
            tessera: config.exe.display().to_string(),
        }
    }

    /// One Markdown paragraph.
    pub fn markdown(&self) -> String {
        format!(
            "Testbed: hosts in network namespaces on one bridge; every link {} each way (`tbf`, \
             bucket {} bytes), switch port buffer {} bytes, host transmit queue {} bytes; \
             offloads off, so frames are at most {} bytes. {} CPUs shared by every host{}; \
             Linux {}.",
            crate::net::Rate {
                bits_per_s: self.link_rate_bits_per_s
            },
            self.burst_bytes,
            self.switch_buffer_bytes,
            self.nic_buffer_bytes,
            self.frame_bytes,
            self.cpus,
            match self.halt_poll_us {
                Some(us) => format!(", an idle CPU polls {us} us before it halts (haltpoll)"),
                None => String::new(),
            },
            self.kernel
        )
    }
}

/// What limited a measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    /// The link was (nearly) full.
    Network,
    /// The CPUs were (nearly) all busy.
    Cpu,
    /// Neither: waiting for round trips (a small window, a request at a time).
    Latency,
}

impl Limit {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Limit::Network => "network",
            Limit::Cpu => "cpu",
            Limit::Latency => "latency",
        }
    }

    /// Classify by how busy the busier direction of the link was (its frames' bytes over
    /// what the rate allows in the time) and how busy the CPUs were.
    pub fn classify(link_utilization: f64, cpu_busy: f64) -> Limit {
        if link_utilization >= NETWORK_BOUND_SHARE {
            Limit::Network
        } else if cpu_busy >= CPU_BOUND_SHARE {
            Limit::Cpu
        } else {
            Limit::Latency
        }
    }
}

/// A measurement that keeps the busier direction of the link this busy (frames' bytes over
/// what the rate allows) counts as network-bound.
pub const NETWORK_BOUND_SHARE: f64 = 0.85;
/// Payload bytes of a full-size TCP segment with timestamps (1500 - 20 - 20 - 12).
pub const TCP_PAYLOAD_BYTES_MAX: u64 = 1448;

/// How busy a link is when a TCP stream carries `payload_fraction` of its rate in payload.
pub fn stream_utilization(payload_fraction: f64) -> f64 {
    payload_fraction * FRAME_BYTES_MAX as f64 / TCP_PAYLOAD_BYTES_MAX as f64
}
/// A measurement with this share of CPU time busy counts as CPU-bound.
pub const CPU_BOUND_SHARE: f64 = 0.85;

/// The raw TCP stream through the link, against the configured rate.
#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    /// Configured link rate.
    pub configured_bits_per_s: u64,
    /// Client to server 1 (the client's `tbf` and server 1's port).
    pub stream_from_client: StreamStats,
    /// Server 1 to the client (server 1's `tbf` and the client's port).
    pub stream_to_client: StreamStats,
    /// The smaller of the two, as a share of the configured rate (at most about 0.956: TCP
    /// carries 1448 payload bytes per 1514-byte frame).
    pub stream_fraction: f64,
    /// The larger CPU share busy during the two streams.
    pub cpu_busy: f64,
    /// CPU share busy in the half second before, with the network idle: whatever else the
    /// machine was doing (a busy machine makes every CPU figure of the run suspect).
    pub background_cpu_busy: f64,
    /// Round trips of small datagrams client to server 1.
    pub echo: EchoStats,
    /// How late the machine woke a thread from 100 us sleeps, with the network idle.
    pub wakeups: WakeupStats,
    /// What limited the stream.
    pub limit: Limit,
}

impl Calibration {
    /// One Markdown paragraph.
    pub fn markdown(&self) -> String {
        format!(
            "Calibration: one raw TCP stream through the links reached {:.1} Mbit/s from the \
             client and {:.1} Mbit/s to it, {:.3} of the configured rate, with {:.0}% of the \
             CPUs busy ({:.0}% before it, with the network idle): **{}-bound**. Echo round \
             trip {:.0} us (min {:.0} us). Sleeps of {} us woke late by {:.0} us (median), \
             {:.0} us (p99), {:.0} us at most; wakeups over 1 ms late took {:.1}% of the time \
             (the host's scheduling, which every line of the run shares).",
            self.stream_from_client.bits_per_s / 1e6,
            self.stream_to_client.bits_per_s / 1e6,
            self.stream_fraction,
            self.cpu_busy * 100.0,
            self.background_cpu_busy * 100.0,
            self.limit.name(),
            self.echo.rtt_us_median,
            self.echo.rtt_us_min,
            self.wakeups.sleep_us,
            self.wakeups.late_us_median,
            self.wakeups.late_us_p99,
            self.wakeups.late_us_max,
            self.wakeups.lost_to_late_over_1ms * 100.0,
        )
    }
}

/// The sleep whose lateness the calibration times: about a Tessera round trip.
const WAKEUP_SLEEP: Duration = Duration::from_micros(100);
/// How long it times it.
const WAKEUP_PROBE: Duration = Duration::from_secs(1);

/// Stream `seconds` worth of the configured rate each way between `client` and `server`.
pub fn calibrate(
    network: &Network,
    link: &LinkSpec,
    client: &str,
    server: &str,
    seconds: f64,
    cancel: &Cancel,
) -> Result<Calibration, LabError> {
    let idle = probe::CpuTimes::now()?;
    cancel.sleep(Duration::from_millis(500))?;
    let background_cpu_busy = probe::CpuTimes::now()?.busy_since(&idle);
    let wakeups = probe::wakeup_lateness(WAKEUP_SLEEP, WAKEUP_PROBE);
    cancel.check()?;
    let echo = probe::udp_echo(network, client, server, 20)?;
    let bytes = (link.rate.bytes_per_s() * seconds) as u64;
    // A stream below a fifth of the rate is hopeless; give up long before that.
    let timeout = Duration::from_secs_f64(seconds * 5.0 + 5.0);
    let from = probe::tcp_stream(network, client, server, bytes, timeout)?;
    cancel.check()?;
    let to = probe::tcp_stream(network, server, client, bytes, timeout)?;
    let configured = link.rate.bits_per_s as f64;
    let stream_fraction = from.bits_per_s.min(to.bits_per_s) / configured;
    let cpu_busy = from.cpu_busy.max(to.cpu_busy);
    Ok(Calibration {
        configured_bits_per_s: link.rate.bits_per_s,
        stream_from_client: from,
        stream_to_client: to,
        stream_fraction,
        cpu_busy,
        background_cpu_busy,
        echo,
        wakeups,
        limit: Limit::classify(stream_utilization(stream_fraction), cpu_busy),
    })
}

/// Mean utilization of the busier direction of the client's link during `samples` at `rate`,
/// if their counters were read.
pub fn link_utilization(samples: &[&Sample], rate: Rate) -> Option<f64> {
    let values = samples
        .iter()
        .map(|s| Some(s.link_bytes()? as f64 / (rate.bytes_per_s() * s.seconds.max(1e-9))))
        .collect::<Option<Vec<f64>>>()?;
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// Mean, spread and a 90% confidence interval of samples.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    /// How many.
    pub n: usize,
    /// Mean.
    pub mean: f64,
    /// Sample standard deviation (0 for one sample).
    pub stddev: f64,
    /// Half-width of the 90% confidence interval of the mean (Student's t; 0 for one sample).
    pub ci90: f64,
}

impl Summary {
    /// Of `values`, which must not be empty.
    pub fn of(values: &[f64]) -> Summary {
        assert!(!values.is_empty(), "a summary of nothing");
        let n = values.len();
        let mean = values.iter().sum::<f64>() / n as f64;
        if n == 1 {
            return Summary {
                n,
                mean,
                stddev: 0.0,
                ci90: 0.0,
            };
        }
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        let stddev = var.sqrt();
        Summary {
            n,
            mean,
            stddev,
            ci90: t_90(n - 1) * stddev / (n as f64).sqrt(),
        }
    }
}

/// Student's t for a two-sided 90% interval with `df` degrees of freedom.
fn t_90(df: usize) -> f64 {
    const T: [f64; 30] = [
        6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771,
        1.761, 1.753, 1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706,
        1.703, 1.701, 1.699, 1.697,
    ];
    T.get(df.wrapping_sub(1)).copied().unwrap_or(1.645)
}

/// Seconds since the Unix epoch.
pub(crate) fn unix_time_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_samples() {
        let s = Summary::of(&[10.0]);
        assert_eq!((s.n, s.mean, s.stddev, s.ci90), (1, 10.0, 0.0, 0.0));
        let s = Summary::of(&[9.0, 11.0]);
        assert_eq!(s.mean, 10.0);
        assert!((s.stddev - 2f64.sqrt()).abs() < 1e-12);
        assert!((s.ci90 - 6.314 * 2f64.sqrt() / 2f64.sqrt()).abs() < 1e-9);
        assert_eq!(t_90(1000), 1.645);
    }

    #[test]
    fn limits_are_classified_network_first() {
        assert_eq!(Limit::classify(0.9, 0.99), Limit::Network);
        assert_eq!(Limit::classify(0.5, 0.9), Limit::Cpu);
        assert_eq!(Limit::classify(0.5, 0.3), Limit::Latency);
        assert!((stream_utilization(1448.0 / 1514.0) - 1.0).abs() < 1e-12);
    }
}
