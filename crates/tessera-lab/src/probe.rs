//! Raw measurements across the lab network, from threads inside its namespaces: a UDP echo
//! (the lab's ping) and one TCP stream (the yardstick that tells whether the configured link
//! rate is what the testbed delivers), and the machine's CPU time.

use crate::net::{run_in_namespace, Network};
use crate::LabError;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Port of the echo probe.
const ECHO_PORT: u16 = 7901;
/// Port of the stream probe.
const STREAM_PORT: u16 = 7902;
/// How long one echo waits for its answer.
const ECHO_TIMEOUT: Duration = Duration::from_millis(500);
/// Most echoes one probe sends.
pub const ECHOES_MAX: u32 = 1000;
/// Bytes one stream write hands the kernel.
const STREAM_WRITE_BYTES: usize = 256 << 10;

/// Round trips of a UDP echo.
#[derive(Debug, Clone, Serialize)]
pub struct EchoStats {
    /// Echoes sent.
    pub sent: u32,
    /// Echoes answered in time.
    pub received: u32,
    /// Shortest round trip, in microseconds.
    pub rtt_us_min: f64,
    /// Median round trip, in microseconds.
    pub rtt_us_median: f64,
    /// Longest round trip, in microseconds.
    pub rtt_us_max: f64,
}

/// How late this machine wakes a thread from a short sleep. Every hop of a message between
/// the lab's processes is such a wakeup, and on a virtual machine the hypervisor decides
/// when a virtual CPU runs, so a busy host makes every process of the lab late, whatever
/// the transport: this is what the run's figures stand on.
#[derive(Debug, Clone, Serialize)]
pub struct WakeupStats {
    /// The sleep asked for, in microseconds.
    pub sleep_us: u64,
    /// Sleeps timed.
    pub samples: usize,
    /// Lateness past the sleep asked for, in microseconds: median, 99th percentile, most.
    pub late_us_median: f64,
    /// See `late_us_median`.
    pub late_us_p99: f64,
    /// See `late_us_median`.
    pub late_us_max: f64,
    /// Share of the measured time lost to wakeups more than a millisecond late.
    pub lost_to_late_over_1ms: f64,
}

impl WakeupStats {
    /// From the lateness of each sleep (microseconds) over `elapsed_us` of measurement.
    pub fn of(sleep_us: u64, late_us: &mut [f64], elapsed_us: f64) -> WakeupStats {
        late_us.sort_by(f64::total_cmp);
        let at = |q: f64| -> f64 {
            if late_us.is_empty() {
                return 0.0;
            }
            late_us[((late_us.len() - 1) as f64 * q).round() as usize]
        };
        // A fold from +0.0: an empty float sum is -0.0, printed "-0.0%".
        let lost = late_us
            .iter()
            .filter(|&&l| l > 1000.0)
            .fold(0.0, |sum, l| sum + l);
        WakeupStats {
            sleep_us,
            samples: late_us.len(),
            late_us_median: at(0.5),
            late_us_p99: at(0.99),
            late_us_max: late_us.last().copied().unwrap_or(0.0),
            lost_to_late_over_1ms: if elapsed_us > 0.0 {
                lost / elapsed_us
            } else {
                0.0
            },
        }
    }
}

/// Sleep `sleep` over and over for `duration` and time how late each wakeup is.
pub fn wakeup_lateness(sleep: Duration, duration: Duration) -> WakeupStats {
    let start = Instant::now();
    let mut late_us = Vec::new();
    while start.elapsed() < duration {
        let asleep = Instant::now();
        std::thread::sleep(sleep);
        late_us.push(asleep.elapsed().saturating_sub(sleep).as_secs_f64() * 1e6);
    }
    let elapsed_us = start.elapsed().as_secs_f64() * 1e6;
    WakeupStats::of(sleep.as_micros() as u64, &mut late_us, elapsed_us)
}

/// Send `count` small datagrams from host `from` to host `to` and time their echoes; they
/// cross both hosts' links, the bridge and its `tbf` ports.
pub fn udp_echo(
    network: &Network,
    from: &str,
    to: &str,
    count: u32,
) -> Result<EchoStats, LabError> {
    assert!((1..=ECHOES_MAX).contains(&count), "1..={ECHOES_MAX} echoes");
    let (from_ns, to_ns) = (network.namespace(from)?, network.namespace(to)?);
    let target = SocketAddrV4::new(network.addr(to)?, ECHO_PORT);
    let (ready_tx, ready_rx) = mpsc::channel();
    std::thread::scope(|scope| {
        let echo = scope.spawn(move || {
            run_in_namespace(&to_ns, || {
                let socket = UdpSocket::bind(target).map_err(LabError::io("bind the echo"))?;
                socket
                    .set_read_timeout(Some(ECHO_TIMEOUT * 2))
                    .map_err(LabError::io("set a timeout"))?;
                let _ = ready_tx.send(());
                let mut buf = [0u8; 64];
                // Answers until the prober stops sending (a read times out).
                while let Ok((n, peer)) = socket.recv_from(&mut buf) {
                    if &buf[..n] == b"done" {
                        break;
                    }
                    socket
                        .send_to(&buf[..n], peer)
                        .map_err(LabError::io("answer an echo"))?;
                }
                Ok(())
            })
        });
        let prober = run_in_namespace(&from_ns, move || {
            ready_rx.recv().map_err(|_| LabError::Timeout {
                what: "the echo to start".into(),
                seconds: 0.0,
            })?;
            let socket = UdpSocket::bind("0.0.0.0:0").map_err(LabError::io("bind the prober"))?;
            socket
                .set_read_timeout(Some(ECHO_TIMEOUT))
                .map_err(LabError::io("set a timeout"))?;
            let mut rtts_us = Vec::new();
            let mut buf = [0u8; 64];
            for seq in 0..count {
                let message = seq.to_be_bytes();
                let sent = Instant::now();
                socket
                    .send_to(&message, target)
                    .map_err(LabError::io(format!("send an echo to {target}")))?;
                // Skip late answers to earlier echoes; wait for this one or time out.
                while let Ok(n) = socket.recv(&mut buf) {
                    if buf[..n] == message {
                        rtts_us.push(sent.elapsed().as_secs_f64() * 1e6);
                        break;
                    }
                }
            }
            let _ = socket.send_to(b"done", target);
            Ok(rtts_us)
        });
        let echo = echo.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        // The echo's failure (it could not bind, say) is the cause of the prober's.
        echo?;
        let mut rtts_us = prober?;
        rtts_us.sort_by(f64::total_cmp);
        let pick = |i: usize| rtts_us.get(i).copied().unwrap_or(f64::NAN);
        Ok(EchoStats {
            sent: count,
            received: rtts_us.len() as u32,
            rtt_us_min: pick(0),
            rtt_us_median: pick(rtts_us.len() / 2),
            rtt_us_max: pick(rtts_us.len().wrapping_sub(1)),
        })
    })
}

/// One TCP stream's throughput.
#[derive(Debug, Clone, Serialize)]
pub struct StreamStats {
    /// Bytes carried.
    pub bytes: u64,
    /// From the sender's connect to the receiver's last byte.
    pub seconds: f64,
    /// Payload bits per second.
    pub bits_per_s: f64,
    /// Share of the machine's CPU time that was busy meanwhile (all processes, 0..=1).
    pub cpu_busy: f64,
    /// Frames the network's `tbf` queues dropped meanwhile.
    pub drops: u64,
}

/// Send `bytes` over one TCP connection from host `from` to host `to`.
pub fn tcp_stream(
    network: &Network,
    from: &str,
    to: &str,
    bytes: u64,
    timeout: Duration,
) -> Result<StreamStats, LabError> {
    let (from_ns, to_ns) = (network.namespace(from)?, network.namespace(to)?);
    let target = SocketAddr::V4(SocketAddrV4::new(network.addr(to)?, STREAM_PORT));
    let drops_before = network.tbf_drops()?;
    let (ready_tx, ready_rx) = mpsc::channel();
    std::thread::scope(|scope| {
        let sink = scope.spawn(move || {
            run_in_namespace(&to_ns, || {
                let listener = TcpListener::bind(target).map_err(LabError::io("bind the sink"))?;
                let _ = ready_tx.send(());
                let mut stream = accept_within(&listener, timeout)?;
                stream
                    .set_read_timeout(Some(timeout))
                    .map_err(LabError::io("set a timeout"))?;
                let mut buf = vec![0u8; STREAM_WRITE_BYTES];
                let mut got = 0u64;
                loop {
                    let n = stream
                        .read(&mut buf)
                        .map_err(LabError::io("read the stream"))?;
                    if n == 0 {
                        return Ok((got, Instant::now()));
                    }
                    got += n as u64;
                }
            })
        });
        let source = run_in_namespace(&from_ns, move || {
            ready_rx.recv().map_err(|_| LabError::Timeout {
                what: "the stream sink to start".into(),
                seconds: 0.0,
            })?;
            let cpu = CpuTimes::now()?;
            let start = Instant::now();
            let mut stream = TcpStream::connect_timeout(&target, timeout)
                .map_err(LabError::io(format!("connect to {target}")))?;
            stream
                .set_write_timeout(Some(timeout))
                .map_err(LabError::io("set a timeout"))?;
            let block = vec![0x5au8; STREAM_WRITE_BYTES];
            let mut sent = 0u64;
            while sent < bytes {
                let n = block.len().min((bytes - sent) as usize);
                stream
                    .write_all(&block[..n])
                    .map_err(LabError::io("write the stream"))?;
                sent += n as u64;
            }
            Ok((start, cpu))
        });
        let sunk = sink.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        let (got, end) = sunk?;
        let (start, cpu) = source?;
        let cpu_busy = CpuTimes::now()?.busy_since(&cpu);
        if got != bytes {
            return Err(LabError::Io {
                action: format!("carry {bytes} bytes over TCP"),
                source: std::io::Error::other(format!("only {got} arrived")),
            });
        }
        let seconds = (end - start).as_secs_f64();
        Ok(StreamStats {
            bytes,
            seconds,
            bits_per_s: bytes as f64 * 8.0 / seconds.max(1e-9),
            cpu_busy,
            drops: network.tbf_drops()?.saturating_sub(drops_before),
        })
    })
}

/// Accept one connection, giving up after `timeout` (a sender that failed never connects).
fn accept_within(listener: &TcpListener, timeout: Duration) -> Result<TcpStream, LabError> {
    listener
        .set_nonblocking(true)
        .map_err(LabError::io("make the listener non-blocking"))?;
    let deadline = Instant::now() + timeout;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream
                    .set_nonblocking(false)
                    .map_err(LabError::io("make the stream blocking"))?;
                return Ok(stream);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(LabError::Timeout {
                        what: "the stream's sender to connect".into(),
                        seconds: timeout.as_secs_f64(),
                    });
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(LabError::io("accept the stream")(e)),
        }
    }
}

/// The machine's CPU time so far (all CPUs, from `/proc/stat`), in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTimes {
    /// Ticks spent running anything (user, nice, system, interrupts, steal).
    pub busy: u64,
    /// Ticks spent in the kernel (system, interrupts, softirqs): on the lab's hosts, mostly
    /// the emulated network (veth, bridge, `tbf`), which runs in the sender's system call or
    /// in softirqs.
    pub kernel: u64,
    /// All ticks, idle and I/O wait included.
    pub total: u64,
}

impl CpuTimes {
    /// Read them now.
    pub fn now() -> Result<CpuTimes, LabError> {
        let stat =
            std::fs::read_to_string("/proc/stat").map_err(LabError::io("read /proc/stat"))?;
        Ok(CpuTimes::parse(&stat))
    }

    /// From the text of `/proc/stat`: its first line sums all CPUs.
    pub fn parse(stat: &str) -> CpuTimes {
        let fields: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or("")
            .split_whitespace()
            .skip(1)
            .filter_map(|f| f.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal [guest guest_nice, already in user].
        let total: u64 = fields.iter().take(8).sum();
        let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
        let kernel = [2, 5, 6].iter().filter_map(|&i| fields.get(i)).sum();
        CpuTimes {
            busy: total - idle,
            kernel,
            total,
        }
    }

    /// The busy share of the time between `earlier` and `self`, 0..=1.
    pub fn busy_since(&self, earlier: &CpuTimes) -> f64 {
        self.share_since(earlier, |times| times.busy)
    }

    /// The share of the time between `earlier` and `self` spent in the kernel, 0..=1.
    pub fn kernel_since(&self, earlier: &CpuTimes) -> f64 {
        self.share_since(earlier, |times| times.kernel)
    }

    /// The share of all ticks between `earlier` and `self` that `ticks` counts.
    fn share_since(&self, earlier: &CpuTimes, ticks: impl Fn(&CpuTimes) -> u64) -> f64 {
        let total = self.total.saturating_sub(earlier.total);
        if total == 0 {
            return 0.0;
        }
        ticks(self).saturating_sub(ticks(earlier)) as f64 / total as f64
    }
}

/// The kernel's TCP counters of one network namespace (each namespace counts its own).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TcpCounters {
    /// Segments retransmitted (`Tcp: RetransSegs` of `/proc/net/snmp`).
    pub retransmitted_segments: u64,
    /// Retransmission timer expiries (`TcpExt: TCPTimeouts` of `/proc/net/netstat`).
    pub timeouts: u64,
    /// Every counter of the `Tcp`, `TcpExt` and `Udp` sections, as `Tcp.Name`, `TcpExt.Name`
    /// and `Udp.Name` (loss probes, recoveries, zero windows, datagrams a full socket buffer
    /// dropped, ... for a closer look); zeros left out.
    pub all: BTreeMap<String, u64>,
}

impl TcpCounters {
    /// From the texts of `/proc/net/snmp` and `/proc/net/netstat`; missing counters are 0.
    pub fn parse(snmp: &str, netstat: &str) -> TcpCounters {
        let mut all = proc_net_section(snmp, "Tcp");
        all.extend(proc_net_section(netstat, "TcpExt"));
        all.extend(proc_net_section(snmp, "Udp"));
        all.retain(|_, v| *v > 0);
        TcpCounters {
            retransmitted_segments: proc_net_counter(snmp, "Tcp", "RetransSegs").unwrap_or(0),
            timeouts: proc_net_counter(netstat, "TcpExt", "TCPTimeouts").unwrap_or(0),
            all,
        }
    }

    /// Those of host `name`'s namespace now, read from a thread inside it.
    pub fn of_host(network: &Network, name: &str) -> Result<TcpCounters, LabError> {
        let ns = network.namespace(name)?;
        run_in_namespace(&ns, || {
            // `/proc/net` is the namespace of the process; `thread-self` that of this thread.
            let read = |file: &str| {
                let path = format!("/proc/thread-self/net/{file}");
                std::fs::read_to_string(&path).map_err(LabError::io(format!("read {path}")))
            };
            Ok(TcpCounters::parse(&read("snmp")?, &read("netstat")?))
        })
    }

    /// Tail loss probes sent (`TcpExt: TCPLossProbes`): a timer, like the retransmission
    /// timer, which with one segment in flight waits two round trips plus `rto_min`.
    pub fn loss_probes(&self) -> u64 {
        self.all.get("TcpExt.TCPLossProbes").copied().unwrap_or(0)
    }

    /// The growth from `earlier` to `self` (gauges such as `Tcp.CurrEstab` that shrank
    /// count as 0).
    pub fn since(&self, earlier: &TcpCounters) -> TcpCounters {
        let mut all = self.all.clone();
        for (name, value) in &mut all {
            *value = value.saturating_sub(earlier.all.get(name).copied().unwrap_or(0));
        }
        all.retain(|_, v| *v > 0);
        TcpCounters {
            retransmitted_segments: self
                .retransmitted_segments
                .saturating_sub(earlier.retransmitted_segments),
            timeouts: self.timeouts.saturating_sub(earlier.timeouts),
            all,
        }
    }

    /// Both added, counter by counter.
    pub fn plus(&self, other: &TcpCounters) -> TcpCounters {
        let mut all = self.all.clone();
        for (name, value) in &other.all {
            *all.entry(name.clone()).or_insert(0) += value;
        }
        TcpCounters {
            retransmitted_segments: self.retransmitted_segments + other.retransmitted_segments,
            timeouts: self.timeouts + other.timeouts,
            all,
        }
    }
}

/// Every counter of section `section` in a `/proc/net/snmp`-style text, as `SECTION.Name`;
/// negative values (`Tcp: MaxConn -1`) are left out.
pub fn proc_net_section(text: &str, section: &str) -> BTreeMap<String, u64> {
    let tag = format!("{section}:");
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let mut names = line.split_whitespace();
        if names.next() != Some(tag.as_str()) {
            continue;
        }
        let Some(values) = lines.next() else { break };
        let mut values = values.split_whitespace();
        if values.next() != Some(tag.as_str()) {
            break;
        }
        return names
            .zip(values)
            .filter_map(|(name, value)| Some((format!("{section}.{name}"), value.parse().ok()?)))
            .collect();
    }
    BTreeMap::new()
}

/// Counter `name` of section `section` in a `/proc/net/snmp`-style text: a line of names
/// (`Tcp: RtoAlgorithm RtoMin ...`) followed by a line of values (`Tcp: 1 200 ...`).
pub fn proc_net_counter(text: &str, section: &str, name: &str) -> Option<u64> {
    proc_net_section(text, section)
        .get(&format!("{section}.{name}"))
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wakeup_lateness_quantiles_and_time_lost() {
        // 100 sleeps: 97 late by 10 us, then 2 ms, 3 ms and 500 us.
        let mut late: Vec<f64> = vec![10.0; 97];
        late.extend([2000.0, 3000.0, 500.0]);
        let stats = WakeupStats::of(100, &mut late, 50_000.0);
        assert_eq!((stats.sleep_us, stats.samples), (100, 100));
        assert_eq!(stats.late_us_median, 10.0);
        assert_eq!(stats.late_us_p99, 2000.0);
        assert_eq!(stats.late_us_max, 3000.0);
        // Only the two wakeups over a millisecond count: 5 ms of 50.
        assert!((stats.lost_to_late_over_1ms - 0.1).abs() < 1e-9);
        let none = WakeupStats::of(100, &mut [], 0.0);
        assert_eq!((none.samples, none.late_us_max), (0, 0.0));
        let punctual = WakeupStats::of(100, &mut [3.0, 4.0], 1000.0);
        assert_eq!(
            format!("{:.1}", punctual.lost_to_late_over_1ms * 100.0),
            "0.0"
        );
    }

    #[test]
    fn a_real_sleep_wakes_no_earlier_than_asked() {
        let stats = wakeup_lateness(Duration::from_micros(200), Duration::from_millis(20));
        assert!(stats.samples >= 1 && stats.samples <= 100, "{stats:?}");
        assert!(stats.late_us_median >= 0.0 && stats.late_us_max >= stats.late_us_p99);
    }

    #[test]
    fn tcp_counters_from_proc_net() {
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 2 64\n\
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors\n\
Tcp: 1 200 120000 -1 7 3 0 0 2 5000 6000 42 0 1 0\n\
Udp: InDatagrams NoPorts RcvbufErrors\nUdp: 10 0 4\nUdpLite: InDatagrams\nUdpLite: 9\n";
        let netstat = "TcpExt: SyncookiesSent TCPTimeouts TCPLossProbes\nTcpExt: 0 17 3\n\
IpExt: InNoRoutes\nIpExt: 0\n";
        let c = TcpCounters::parse(snmp, netstat);
        assert_eq!((c.retransmitted_segments, c.timeouts), (42, 17));
        assert_eq!(c.all["TcpExt.TCPTimeouts"], 17);
        assert_eq!(c.all["Tcp.InSegs"], 5000);
        assert!(!c.all.contains_key("Tcp.MaxConn"), "negative");
        assert!(!c.all.contains_key("TcpExt.SyncookiesSent"), "zero");
        // UDP's too: a full socket buffer drops datagrams before any transport sees them.
        assert_eq!(c.all["Udp.RcvbufErrors"], 4);
        assert_eq!(c.all["Udp.InDatagrams"], 10);
        assert!(
            !c.all.contains_key("UdpLite.InDatagrams"),
            "another section"
        );
        assert!(!c.all.contains_key("IpExt.InNoRoutes"), "another section");
        assert_eq!(proc_net_counter(snmp, "Tcp", "MaxConn"), None, "negative");
        assert_eq!(proc_net_counter(snmp, "Udp", "InDatagrams"), Some(10));
        assert_eq!(proc_net_counter(snmp, "Tcp", "Nothing"), None);
        assert_eq!(proc_net_counter("", "Tcp", "RetransSegs"), None);
        assert_eq!(TcpCounters::parse("", ""), TcpCounters::default());
        let later = TcpCounters::parse(
            &snmp
                .replace("6000 42 0", "6100 50 0")
                .replace(" 2 5000", " 1 5000"),
            &netstat.replace("0 17 3", "0 20 3"),
        );
        let grown = later.since(&c);
        assert_eq!((grown.retransmitted_segments, grown.timeouts), (8, 3));
        assert_eq!(
            grown.all,
            BTreeMap::from([
                ("Tcp.OutSegs".to_string(), 100),
                ("Tcp.RetransSegs".to_string(), 8),
                ("TcpExt.TCPTimeouts".to_string(), 3),
            ]),
            "CurrEstab shrank: left out"
        );
        let sum = c.plus(&later);
        assert_eq!(sum.timeouts, 37);
        assert_eq!(sum.loss_probes(), 6);
    }

    #[test]
    fn tcp_counters_of_this_namespace_parse() {
        // Every Linux has these two counters; a parse failure would read as zero.
        let snmp = std::fs::read_to_string("/proc/net/snmp").unwrap();
        let netstat = std::fs::read_to_string("/proc/net/netstat").unwrap();
        assert!(proc_net_counter(&snmp, "Tcp", "RetransSegs").is_some());
        assert!(proc_net_counter(&netstat, "TcpExt", "TCPTimeouts").is_some());
    }

    #[test]
    fn cpu_times_from_proc_stat() {
        // user nice system idle iowait irq softirq steal
        let a = CpuTimes::parse("cpu  100 0 50 800 40 4 6 0 0 0\ncpu0 1 2 3\n");
        assert_eq!(
            a,
            CpuTimes {
                busy: 160,
                kernel: 60,
                total: 1000
            }
        );
        let b = CpuTimes::parse("cpu  200 0 100 1600 80 8 12 0 0 0\n");
        assert!((b.busy_since(&a) - 0.16).abs() < 1e-9);
        assert!((b.kernel_since(&a) - 0.06).abs() < 1e-9);
        assert_eq!(a.busy_since(&a), 0.0);
        assert_eq!(a.kernel_since(&a), 0.0);
    }

    #[test]
    fn cpu_times_of_this_machine_grow() {
        let a = CpuTimes::now().unwrap();
        let b = CpuTimes::now().unwrap();
        assert!(b.total >= a.total && b.busy >= a.busy);
    }
}
