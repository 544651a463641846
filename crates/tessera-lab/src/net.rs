//! The test network: hosts in network namespaces, a bridge as the switch, `tbf` as links.
//!
//! Every host gets a namespace of its own with one interface, `eth0`, the far end of a veth
//! pair whose near end is a port of bridge `br0` in the switch's namespace. Nothing is created
//! in the namespace the lab runs in, so removing the run's namespaces removes every link too.
//!
//! A link of rate R is two `tbf` qdiscs: one on the switch port toward the host (the switch's
//! output port: its rate and its buffer, where incast traffic queues and drops) and one on the
//! host's `eth0` (the host's NIC: its rate and its transmit queue, where a sender that bursts
//! faster than the link loses datagrams, like the Ethernet queue of Swift/RAID's section 3).
//! Segmentation and receive offloads are off on both ends of every veth, so every packet is a
//! real, at most MTU-sized frame, and `tbf` shapes what a wire would carry.

use crate::cmd::{self, Cmd};
use crate::LabError;
use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};

/// Every namespace of the lab starts with this; `tessera lab cleanup` looks for it.
pub const NAMESPACE_PREFIX: &str = "tl-";
/// The lab's subnet, /24; it exists only inside the lab's namespaces.
pub const SUBNET: [u8; 3] = [10, 77, 0];
/// Bytes `tbf` counts for one full-MTU Ethernet frame (1500 bytes of IP plus a 14-byte header).
pub const FRAME_BYTES_MAX: u64 = 1514;
/// Settings of the switch's namespace that keep its bridge from calling the firewall.
const BRIDGE_FIREWALL_OFF: [&str; 3] = [
    "net.bridge.bridge-nf-call-iptables=0",
    "net.bridge.bridge-nf-call-ip6tables=0",
    "net.bridge.bridge-nf-call-arptables=0",
];

/// The bridge in the switch's namespace.
pub const BRIDGE: &str = "br0";
/// A host's one interface.
pub const HOST_INTERFACE: &str = "eth0";
/// The lab's host names: the manager, the client and server `k` (`s1`, `s2`, ...).
pub const MANAGER_HOST: &str = "mgr";
/// See [`MANAGER_HOST`].
pub const CLIENT_HOST: &str = "cli";
/// Most servers a lab network holds (addresses 10.77.0.11 and up).
pub const SERVERS_MAX: u32 = 200;
/// Linux's limit on interface names, without the terminating zero.
const INTERFACE_NAME_BYTES_MAX: usize = 15;
/// Offloads turned off on every veth end, so that no packet is larger than a frame.
const OFFLOADS: [&str; 4] = ["tso", "gso", "gro", "tx-udp-segmentation"];

/// The host name of server `id`.
pub fn server_host(id: u32) -> String {
    format!("s{id}")
}

/// A link rate, in bits per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Rate {
    /// Bits per second.
    pub bits_per_s: u64,
}

impl Rate {
    /// `megabits` Mbit/s (decimal, as `tc` counts).
    pub const fn mbit(megabits: u64) -> Rate {
        Rate {
            bits_per_s: megabits * 1_000_000,
        }
    }

    /// Bytes per second.
    pub fn bytes_per_s(self) -> f64 {
        self.bits_per_s as f64 / 8.0
    }

    /// The value `tc` takes.
    pub fn tc_arg(self) -> String {
        format!("{}bit", self.bits_per_s)
    }
}

impl FromStr for Rate {
    type Err = LabError;
    /// `200mbit`, `1gbit`, `500kbit`, `64000bit`, or the same with `M`, `G`, `K` alone.
    fn from_str(text: &str) -> Result<Rate, LabError> {
        let bad = || LabError::BadValue {
            what: "link rate",
            text: text.to_string(),
            expected: "a rate such as 100mbit, 1gbit or 500kbit",
        };
        let t = text.trim().to_ascii_lowercase();
        let digits: String = t.chars().take_while(|c| c.is_ascii_digit()).collect();
        let value: u64 = digits.parse().map_err(|_| bad())?;
        let scale: u64 = match t[digits.len()..].trim() {
            "" | "bit" => 1,
            "k" | "kbit" => 1_000,
            "m" | "mbit" => 1_000_000,
            "g" | "gbit" => 1_000_000_000,
            _ => return Err(bad()),
        };
        let bits_per_s = value.checked_mul(scale).ok_or_else(bad)?;
        if !(8_000..=100_000_000_000).contains(&bits_per_s) {
            return Err(bad());
        }
        Ok(Rate { bits_per_s })
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.bits_per_s;
        for (scale, unit) in [
            (1_000_000_000, "Gbit/s"),
            (1_000_000, "Mbit/s"),
            (1_000, "kbit/s"),
        ] {
            if b >= scale && b / scale * scale == b {
                return write!(f, "{} {unit}", b / scale);
            }
        }
        write!(f, "{b} bit/s")
    }
}

/// A queue's size: in full-size frames or in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buffer {
    /// Room for this many full-MTU frames.
    Packets(u32),
    /// Room for this many bytes.
    Bytes(u64),
}

impl Buffer {
    /// The size in bytes, as `tbf`'s `limit` takes it.
    pub fn bytes(self) -> u64 {
        match self {
            Buffer::Packets(n) => u64::from(n) * FRAME_BYTES_MAX,
            Buffer::Bytes(n) => n,
        }
    }
}

impl FromStr for Buffer {
    type Err = LabError;
    /// `100p` (or `100pkt`) for frames; `150000`, `64K`, `1M` (binary multiples) for bytes.
    fn from_str(text: &str) -> Result<Buffer, LabError> {
        let bad = || LabError::BadValue {
            what: "buffer",
            text: text.to_string(),
            expected: "a size such as 100p (frames), 150000 or 64K (bytes)",
        };
        let t = text.trim().to_ascii_lowercase();
        let digits: String = t.chars().take_while(|c| c.is_ascii_digit()).collect();
        let value: u64 = digits.parse().map_err(|_| bad())?;
        let buffer = match t[digits.len()..].trim() {
            "p" | "pkt" | "packets" => Buffer::Packets(u32::try_from(value).map_err(|_| bad())?),
            "" | "b" => Buffer::Bytes(value),
            "k" | "kb" | "kib" => Buffer::Bytes(value << 10),
            "m" | "mb" | "mib" => Buffer::Bytes(value << 20),
            _ => return Err(bad()),
        };
        // tbf cannot hold less than one frame, and more than 1 GiB is a typo.
        if !(FRAME_BYTES_MAX..=1 << 30).contains(&buffer.bytes()) {
            return Err(bad());
        }
        Ok(buffer)
    }
}

impl fmt::Display for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Buffer::Packets(n) => write!(f, "{n} frames ({} bytes)", self.bytes()),
            Buffer::Bytes(n) => write!(f, "{n} bytes"),
        }
    }
}

/// What every link of the network is like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkSpec {
    /// The rate of every link, in each direction.
    pub rate: Rate,
    /// The queue of each switch port toward a host.
    pub switch_buffer: Buffer,
    /// The transmit queue of each host's interface toward the switch.
    pub nic_buffer: Buffer,
    /// `tbf`'s bucket; by default one millisecond of the rate, at least two frames.
    pub burst_bytes: Option<u64>,
}

impl LinkSpec {
    /// Links of `rate` with the default buffers: 128 frames at the switch port (about what
    /// a small switch gives one port) and 1,000 at the host (Linux's default `txqueuelen`).
    pub fn new(rate: Rate) -> LinkSpec {
        LinkSpec {
            rate,
            switch_buffer: Buffer::Packets(128),
            nic_buffer: Buffer::Packets(1000),
            burst_bytes: None,
        }
    }

    /// The bucket size `tbf` gets.
    pub fn burst_bytes(&self) -> u64 {
        self.burst_bytes.unwrap_or_else(|| {
            let millisecond = self.rate.bits_per_s / 8 / 1000;
            millisecond.max(2 * FRAME_BYTES_MAX)
        })
    }
}

/// One host: a name (short: it names a switch port) and its address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// Short name, e.g. `cli`, `mgr`, `s3`.
    pub name: String,
    /// Its address on the lab's subnet.
    pub addr: Ipv4Addr,
}

/// The unique start of every name one run creates: `tl-PID-SEQ`. The pid lets `cleanup` tell
/// leftovers of dead runs from live runs; the sequence keeps runs in one process apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunPrefix(String);

impl RunPrefix {
    /// A prefix no other run on this machine has now.
    pub fn new() -> RunPrefix {
        static SEQUENCE: AtomicU32 = AtomicU32::new(0);
        let seq = SEQUENCE.fetch_add(1, Ordering::Relaxed);
        RunPrefix(format!("{NAMESPACE_PREFIX}{}-{seq}", std::process::id()))
    }

    /// The prefix as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for RunPrefix {
    fn default() -> Self {
        RunPrefix::new()
    }
}

/// A network to build: its hosts, the links, and the names it will use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// The start of every namespace name.
    pub prefix: RunPrefix,
    /// The hosts, each on one switch port.
    pub hosts: Vec<Host>,
    /// What every link is like.
    pub link: LinkSpec,
}

impl Topology {
    /// Hosts with the given names, at 10.77.0.1, .2, ... in order.
    pub fn new(prefix: RunPrefix, names: &[&str], link: LinkSpec) -> Result<Topology, LabError> {
        let hosts = names
            .iter()
            .enumerate()
            .map(|(i, name)| (name.to_string(), i as u32 + 1))
            .collect::<Vec<_>>();
        Topology::with_numbers(prefix, hosts, link)
    }

    /// The lab's usual network: the manager (10.77.0.1), the client (.2) and servers 1..=N
    /// (.11 and up).
    pub fn cluster(prefix: RunPrefix, servers: u32, link: LinkSpec) -> Result<Topology, LabError> {
        if !(1..=SERVERS_MAX).contains(&servers) {
            return Err(LabError::BadValue {
                what: "number of servers",
                text: servers.to_string(),
                expected: "1 to 200",
            });
        }
        let mut hosts = vec![(MANAGER_HOST.to_string(), 1), (CLIENT_HOST.to_string(), 2)];
        hosts.extend((1..=servers).map(|id| (server_host(id), 10 + id)));
        Topology::with_numbers(prefix, hosts, link)
    }

    fn with_numbers(
        prefix: RunPrefix,
        hosts: Vec<(String, u32)>,
        link: LinkSpec,
    ) -> Result<Topology, LabError> {
        let mut built = Vec::with_capacity(hosts.len());
        for (name, number) in hosts {
            let port = port_name(&name);
            let valid = !name.is_empty()
                && port.len() <= INTERFACE_NAME_BYTES_MAX
                && name.chars().all(|c| c.is_ascii_alphanumeric())
                && name != "sw";
            if !valid || !(1..=254).contains(&number) {
                return Err(LabError::BadValue {
                    what: "host",
                    text: name,
                    expected: "at most 254 hosts with short alphanumeric names other than 'sw'",
                });
            }
            let [a, b, c] = SUBNET;
            built.push(Host {
                name,
                addr: Ipv4Addr::new(a, b, c, number as u8),
            });
        }
        Ok(Topology {
            prefix,
            hosts: built,
            link,
        })
    }

    /// The switch's namespace.
    pub fn switch_namespace(&self) -> String {
        format!("{}-sw", self.prefix.as_str())
    }

    /// The namespace of host `name`.
    pub fn namespace(&self, name: &str) -> String {
        format!("{}-{name}", self.prefix.as_str())
    }

    /// Host `name`.
    pub fn host(&self, name: &str) -> Result<&Host, LabError> {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .ok_or_else(|| LabError::BadValue {
                what: "host",
                text: name.to_string(),
                expected: "a host of this network",
            })
    }

    /// Every namespace, in the order they are created: the switch first.
    pub fn namespaces(&self) -> Vec<String> {
        std::iter::once(self.switch_namespace())
            .chain(self.hosts.iter().map(|h| self.namespace(&h.name)))
            .collect()
    }

    /// The commands that create the namespaces.
    pub fn namespace_commands(&self) -> Vec<Cmd> {
        self.namespaces()
            .into_iter()
            .map(|ns| Cmd::new("ip").args(["netns", "add"]).arg(ns))
            .collect()
    }

    /// The commands that build the switch and the links, once the namespaces exist.
    pub fn link_commands(&self) -> Vec<Cmd> {
        let sw = self.switch_namespace();
        let ip = |ns: &str| Cmd::new("ip").args(["-n", ns]);
        let mut out = vec![
            ip(&sw).args(["link", "set", "lo", "up"]),
            ip(&sw).args(["link", "add", BRIDGE, "type", "bridge"]),
            ip(&sw).args(["link", "set", BRIDGE, "up"]),
            // A switch does not run the firewall on what it forwards; with br_netfilter loaded
            // the bridge would, at a cost per frame that every line pays on the testbed's CPUs
            // (a route lookup and hooks, ~3% of a profile). `-e`: the keys exist only when
            // br_netfilter is loaded, and without it there is nothing to turn off.
            Cmd::new("sysctl")
                .args(["-q", "-e", "-w"])
                .args(BRIDGE_FIREWALL_OFF)
                .in_namespace(&sw),
        ];
        for host in &self.hosts {
            let ns = self.namespace(&host.name);
            let port = port_name(&host.name);
            let offloads_off = |interface: &str| {
                let mut cmd = Cmd::new("ethtool").args(["-K", interface]);
                for offload in OFFLOADS {
                    cmd = cmd.args([offload, "off"]);
                }
                cmd
            };
            out.extend([
                ip(&ns).args(["link", "set", "lo", "up"]),
                ip(&sw)
                    .args(["link", "add", &port, "type", "veth", "peer", "name"])
                    .args([HOST_INTERFACE, "netns", &ns]),
                offloads_off(&port).in_namespace(&sw),
                offloads_off(HOST_INTERFACE).in_namespace(&ns),
                ip(&sw).args(["link", "set", &port, "master", BRIDGE]),
                ip(&sw).args(["link", "set", &port, "up"]),
                ip(&ns).args([
                    "addr",
                    "add",
                    &format!("{}/24", host.addr),
                    "dev",
                    HOST_INTERFACE,
                ]),
                ip(&ns).args(["link", "set", HOST_INTERFACE, "up"]),
                tbf_command(
                    &sw,
                    &port,
                    self.link.rate,
                    self.link.burst_bytes(),
                    self.link.switch_buffer,
                ),
                tbf_command(
                    &ns,
                    HOST_INTERFACE,
                    self.link.rate,
                    self.link.burst_bytes(),
                    self.link.nic_buffer,
                ),
            ]);
        }
        out
    }
}

/// The switch port toward host `name`.
pub fn port_name(name: &str) -> String {
    format!("p-{name}")
}

/// `tc` putting a token bucket of `rate` with a queue of `buffer` on `interface`'s egress.
pub fn tbf_command(
    namespace: &str,
    interface: &str,
    rate: Rate,
    burst_bytes: u64,
    buffer: Buffer,
) -> Cmd {
    Cmd::new("tc")
        .args([
            "-n", namespace, "qdisc", "replace", "dev", interface, "root", "tbf",
        ])
        .args(["rate".to_string(), rate.tc_arg()])
        .args(["burst".to_string(), burst_bytes.to_string()])
        .args(["limit".to_string(), buffer.bytes().to_string()])
}

/// A built network; dropping it tears it down (kills what runs in its namespaces and deletes
/// them), on success, error and panic alike.
#[derive(Debug)]
pub struct Network {
    topology: Topology,
    /// Namespaces created so far, so that a half-built network is torn down too.
    created: Vec<String>,
}

impl Network {
    /// Build `topology`. Needs root and `ip`, `tc`, `ethtool`.
    pub fn build(topology: Topology) -> Result<Network, LabError> {
        cmd::require_lab_host()?;
        let mut network = Network {
            topology,
            created: Vec::new(),
        };
        for (ns, command) in network
            .topology
            .namespaces()
            .into_iter()
            .zip(network.topology.namespace_commands())
        {
            command.run()?;
            network.created.push(ns.clone());
            // No IPv6 in the lab: its neighbour discovery and multicast reports would be
            // traffic in the queues that no experiment sent.
            run_in_namespace(&ns, disable_ipv6)?;
        }
        for command in network.topology.link_commands() {
            command.run()?;
        }
        Ok(network)
    }

    /// What was built.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The namespace of host `name`.
    pub fn namespace(&self, name: &str) -> Result<String, LabError> {
        self.topology.host(name)?;
        Ok(self.topology.namespace(name))
    }

    /// The address of host `name`.
    pub fn addr(&self, name: &str) -> Result<Ipv4Addr, LabError> {
        Ok(self.topology.host(name)?.addr)
    }

    /// Frames dropped so far by every `tbf` of the network: the switch's ports (a full
    /// output queue) and the hosts' interfaces (a full transmit queue) together.
    pub fn tbf_drops(&self) -> Result<u64, LabError> {
        let mut drops = 0;
        for ns in self.topology.namespaces() {
            let stats = Cmd::new("tc")
                .args(["-s", "-n", &ns, "qdisc", "show"])
                .run()?;
            drops += parse_tbf_drops(&stats);
        }
        Ok(drops)
    }

    /// Frames dropped so far by the `tbf` of each switch port, by the name of the host the
    /// port leads to: what a full output queue toward that host discarded.
    pub fn port_drops(&self) -> Result<BTreeMap<String, u64>, LabError> {
        let stats = Cmd::new("tc")
            .args([
                "-s",
                "-n",
                &self.topology.switch_namespace(),
                "qdisc",
                "show",
            ])
            .run()?;
        let by_port = parse_tbf_drops_by_device(&stats);
        Ok(self
            .topology
            .hosts
            .iter()
            .map(|h| {
                let drops = by_port.get(&port_name(&h.name)).copied().unwrap_or(0);
                (h.name.clone(), drops)
            })
            .collect())
    }

    /// The counters of the `tbf` of the switch port toward host `name` (its output queue).
    pub fn port_stats(&self, name: &str) -> Result<TbfStats, LabError> {
        self.topology.host(name)?;
        let port = port_name(name);
        let stats = Cmd::new("tc")
            .args([
                "-s",
                "-n",
                &self.topology.switch_namespace(),
                "qdisc",
                "show",
            ])
            // Not `dev PORT`: tc then leaves the device out of the qdisc's line.
            .run()?;
        Ok(parse_tbf_stats_by_device(&stats)
            .remove(&port)
            .unwrap_or_default())
    }

    /// Frames dropped so far by the `tbf` on host `name`'s interface (a full transmit queue).
    pub fn nic_drops(&self, name: &str) -> Result<u64, LabError> {
        let stats = Cmd::new("tc")
            .args(["-s", "-n", &self.namespace(name)?, "qdisc", "show"])
            .args(["dev", HOST_INTERFACE])
            .run()?;
        Ok(parse_tbf_drops(&stats))
    }

    /// Set (or with `None` remove) the minimum TCP retransmission timeout of host `name`'s
    /// route to the lab's subnet. It applies to connections made afterwards.
    pub fn set_rto_min(&self, name: &str, rto_min_ms: Option<u32>) -> Result<(), LabError> {
        let ns = self.namespace(name)?;
        let routes = Cmd::new("ip").args(["-n", &ns, "route", "show"]).run()?;
        let subnet = subnet_prefix();
        let route = routes
            .lines()
            .find(|line| line.split_whitespace().next() == Some(subnet.as_str()))
            .ok_or_else(|| LabError::BadValue {
                what: "route table",
                text: routes.trim().to_string(),
                expected: "a route to the lab's subnet",
            })?;
        rto_min_route_command(&ns, route, rto_min_ms).run()?;
        Ok(())
    }

    /// Tear down now and check that nothing is left.
    pub fn teardown(mut self) -> Result<(), LabError> {
        self.teardown_all();
        let left: Vec<String> = list_namespaces()?
            .into_iter()
            .filter(|ns| self.topology.namespaces().contains(ns))
            .collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(LabError::Leftovers(left))
        }
    }

    fn teardown_all(&mut self) {
        // Hosts first, the switch last: the reverse of creation.
        while let Some(ns) = self.created.pop() {
            if let Err(e) = remove_namespace(&ns) {
                eprintln!("lab: teardown of {ns}: {e}");
            }
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        self.teardown_all();
    }
}

/// The sum of the `dropped` counts of the `tbf` qdiscs in the output of `tc -s qdisc show`.
pub fn parse_tbf_drops(stats: &str) -> u64 {
    let mut drops = 0;
    let mut in_tbf = false;
    for line in stats.lines() {
        if line.starts_with("qdisc ") {
            in_tbf = line.starts_with("qdisc tbf ");
        } else if in_tbf {
            if let Some(rest) = line.split("(dropped ").nth(1) {
                let count: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
                drops += count.parse::<u64>().unwrap_or(0);
                in_tbf = false;
            }
        }
    }
    drops
}

/// The `dropped` count of each `tbf` qdisc in the output of `tc -s qdisc show`, by device.
pub fn parse_tbf_drops_by_device(stats: &str) -> BTreeMap<String, u64> {
    parse_tbf_stats_by_device(stats)
        .into_iter()
        .map(|(device, stats)| (device, stats.dropped))
        .collect()
}

/// One `tbf` qdisc's counters, as `tc -s qdisc show` prints them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct TbfStats {
    /// Packets sent so far.
    pub sent_packets: u64,
    /// Packets dropped so far (a full queue).
    pub dropped: u64,
    /// Bytes in the queue now.
    pub backlog_bytes: u64,
    /// Packets in the queue now.
    pub backlog_packets: u64,
}

/// The counters of each `tbf` qdisc in the output of `tc -s qdisc show`, by device.
pub fn parse_tbf_stats_by_device(stats: &str) -> BTreeMap<String, TbfStats> {
    let number = |text: &str| -> u64 {
        let digits: String = text.chars().take_while(|c| c.is_ascii_digit()).collect();
        digits.parse().unwrap_or(0)
    };
    let mut out = BTreeMap::new();
    let mut device: Option<String> = None;
    for line in stats.lines() {
        if line.starts_with("qdisc ") {
            device = line
                .starts_with("qdisc tbf ")
                .then(|| {
                    let mut words = line.split_whitespace();
                    words.find(|w| *w == "dev")?;
                    words.next().map(str::to_string)
                })
                .flatten();
            continue;
        }
        let Some(dev) = &device else { continue };
        let entry: &mut TbfStats = out.entry(dev.clone()).or_default();
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["Sent", _, "bytes", packets, "pkt", rest @ ..] => {
                entry.sent_packets = number(packets);
                entry.dropped = rest.get(1).map_or(0, |d| number(d));
            }
            ["backlog", bytes, packets, ..] => {
                entry.backlog_bytes = number(bytes);
                entry.backlog_packets = number(packets);
            }
            _ => {}
        }
    }
    out
}

/// The lab's subnet as `ip route` shows it: `10.77.0.0/24`.
pub fn subnet_prefix() -> String {
    let [a, b, c] = SUBNET;
    format!("{a}.{b}.{c}.0/24")
}

/// `ip route change` of the route `route` (a line of `ip route show`) in `namespace`, with
/// its fields kept and its `rto_min` set to `rto_min_ms` milliseconds, or removed.
pub fn rto_min_route_command(namespace: &str, route: &str, rto_min_ms: Option<u32>) -> Cmd {
    let mut fields = Vec::new();
    let mut words = route.split_whitespace();
    while let Some(word) = words.next() {
        if word == "rto_min" {
            // `ip route show` prints a locked metric as `rto_min lock 1ms`.
            if words.next() == Some("lock") {
                words.next();
            }
        } else {
            fields.push(word.to_string());
        }
    }
    let mut cmd = Cmd::new("ip")
        .args(["-n", namespace, "route", "change"])
        .args(fields);
    if let Some(ms) = rto_min_ms {
        cmd = cmd.args(["rto_min".to_string(), format!("{ms}ms")]);
    }
    cmd
}

/// Run `f` on a new thread whose network namespace is `namespace`; sockets it opens live
/// there. The calling thread's namespace is untouched.
pub fn run_in_namespace<T, F>(namespace: &str, f: F) -> Result<T, LabError>
where
    T: Send,
    F: FnOnce() -> Result<T, LabError> + Send,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                enter_namespace(namespace)?;
                f()
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Move the calling thread into network namespace `namespace` for good. Only for threads
/// made for the purpose (see [`run_in_namespace`]).
pub fn enter_namespace(namespace: &str) -> Result<(), LabError> {
    let path = format!("/run/netns/{namespace}");
    let file =
        std::fs::File::open(&path).map_err(LabError::io(format!("open namespace {path}")))?;
    // SAFETY: the descriptor is open and valid for the call; setns only changes this thread's
    // network namespace.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(LabError::Io {
            action: format!("enter namespace {namespace}"),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

fn disable_ipv6() -> Result<(), LabError> {
    for conf in ["all", "default"] {
        let path = format!("/proc/sys/net/ipv6/conf/{conf}/disable_ipv6");
        // A kernel without IPv6 has no such file, and then nothing needs disabling.
        if std::path::Path::new(&path).exists() {
            std::fs::write(&path, "1").map_err(LabError::io(format!("write {path}")))?;
        }
    }
    Ok(())
}

/// Kill whatever runs in `namespace` and delete it (its links go with it).
pub fn remove_namespace(namespace: &str) -> Result<(), LabError> {
    let pids = Cmd::new("ip")
        .args(["netns", "pids", namespace])
        .run()
        .unwrap_or_default();
    let own = std::process::id();
    for pid in pids
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
    {
        // Only processes inside the lab's own namespace; never the lab itself.
        if pid != own {
            // SAFETY: kill has no memory preconditions; a vanished pid just fails.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
        }
    }
    match Cmd::new("ip").args(["netns", "del", namespace]).run() {
        // Gone already (its own run tore it down meanwhile) is as good as deleted.
        Err(_) if !std::path::Path::new(&format!("/run/netns/{namespace}")).exists() => Ok(()),
        other => other.map(drop),
    }
}

/// Every lab namespace on this machine (from any run).
pub fn list_namespaces() -> Result<Vec<String>, LabError> {
    let out = Cmd::new("ip").args(["netns", "list"]).run()?;
    Ok(out
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| name.starts_with(NAMESPACE_PREFIX))
        .map(str::to_string)
        .collect())
}

/// What `cleanup` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cleanup {
    /// Namespaces removed.
    pub removed: Vec<String>,
    /// Namespaces kept because the run that made them is still alive.
    pub kept: Vec<String>,
    /// Data directories of clusters removed (logs and stores of dead runs).
    pub removed_dirs: Vec<std::path::PathBuf>,
}

/// Start of the name of a cluster's temporary directory: `tessera-lab-PID-`, so that
/// `cleanup` can tell those of dead runs.
pub fn run_dir_prefix() -> String {
    format!("tessera-lab-{}-", std::process::id())
}

/// Remove leftover lab namespaces (and so their links and processes): those whose run is no
/// longer alive, or all of them with `all`.
pub fn cleanup(all: bool) -> Result<Cleanup, LabError> {
    cmd::require_lab_host()?;
    let mut report = Cleanup::default();
    for ns in list_namespaces()? {
        let owner = owner_pid(&ns);
        let alive = owner.is_some_and(process_alive);
        if alive && !all {
            report.kept.push(ns);
        } else {
            remove_namespace(&ns)?;
            report.removed.push(ns);
        }
    }
    let tmp = std::env::temp_dir();
    let entries =
        std::fs::read_dir(&tmp).map_err(LabError::io(format!("list {}", tmp.display())))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("tessera-lab-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if all || !process_alive(pid) {
            let path = entry.path();
            std::fs::remove_dir_all(&path)
                .map_err(LabError::io(format!("remove {}", path.display())))?;
            report.removed_dirs.push(path);
        }
    }
    Ok(report)
}

/// The pid of the run that made lab namespace `ns` (`tl-PID-SEQ-HOST`).
pub fn owner_pid(ns: &str) -> Option<u32> {
    ns.strip_prefix(NAMESPACE_PREFIX)?
        .split('-')
        .next()?
        .parse()
        .ok()
}

/// Whether process `pid` runs (a zombie, killed but not yet reaped, does not).
fn process_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name, which is in parentheses and may hold spaces.
    let state = stat
        .rsplit(')')
        .next()
        .and_then(|rest| rest.split_whitespace().next());
    !matches!(state, Some("Z") | Some("X") | None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(cmd: &Cmd) -> String {
        cmd.to_string()
    }

    #[test]
    fn rates_parse_like_tc() {
        assert_eq!("200mbit".parse::<Rate>().unwrap(), Rate::mbit(200));
        assert_eq!("1G".parse::<Rate>().unwrap(), Rate::mbit(1000));
        assert_eq!("500kbit".parse::<Rate>().unwrap().bits_per_s, 500_000);
        assert_eq!(Rate::mbit(200).tc_arg(), "200000000bit");
        assert_eq!(Rate::mbit(200).to_string(), "200 Mbit/s");
        assert!("fast".parse::<Rate>().is_err());
        assert!("10bit".parse::<Rate>().is_err());
        assert!("200mb/s".parse::<Rate>().is_err());
    }

    #[test]
    fn buffers_parse_in_frames_or_bytes() {
        assert_eq!("100p".parse::<Buffer>().unwrap(), Buffer::Packets(100));
        assert_eq!(Buffer::Packets(100).bytes(), 151_400);
        assert_eq!("64K".parse::<Buffer>().unwrap(), Buffer::Bytes(65_536));
        assert_eq!("150000".parse::<Buffer>().unwrap(), Buffer::Bytes(150_000));
        assert!("100".parse::<Buffer>().is_err(), "less than one frame");
        assert!("lots".parse::<Buffer>().is_err());
    }

    #[test]
    fn burst_is_a_millisecond_of_rate_but_at_least_two_frames() {
        assert_eq!(LinkSpec::new(Rate::mbit(200)).burst_bytes(), 25_000);
        assert_eq!(
            LinkSpec::new(Rate::mbit(10)).burst_bytes(),
            2 * FRAME_BYTES_MAX
        );
    }

    #[test]
    fn cluster_topology_names_and_addresses() {
        let prefix = RunPrefix("tl-42-0".into());
        let t = Topology::cluster(prefix, 3, LinkSpec::new(Rate::mbit(100))).unwrap();
        let names: Vec<_> = t.hosts.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["mgr", "cli", "s1", "s2", "s3"]);
        assert_eq!(t.host("mgr").unwrap().addr, Ipv4Addr::new(10, 77, 0, 1));
        assert_eq!(t.host("cli").unwrap().addr, Ipv4Addr::new(10, 77, 0, 2));
        assert_eq!(t.host("s3").unwrap().addr, Ipv4Addr::new(10, 77, 0, 13));
        assert_eq!(
            t.namespaces(),
            [
                "tl-42-0-sw",
                "tl-42-0-mgr",
                "tl-42-0-cli",
                "tl-42-0-s1",
                "tl-42-0-s2",
                "tl-42-0-s3"
            ]
        );
        assert_eq!(owner_pid("tl-42-0-s3"), Some(42));
        assert_eq!(owner_pid("other"), None);
        assert!(Topology::cluster(RunPrefix::new(), 0, t.link).is_err());
        assert!(Topology::new(RunPrefix::new(), &["sw"], t.link).is_err());
        assert!(Topology::new(RunPrefix::new(), &["a-very-long-host-name"], t.link).is_err());
    }

    #[test]
    fn this_process_is_alive_and_a_missing_one_is_not() {
        assert!(process_alive(std::process::id()));
        assert!(!process_alive(u32::MAX));
    }

    #[test]
    fn run_prefixes_differ_within_a_process() {
        let (a, b) = (RunPrefix::new(), RunPrefix::new());
        assert_ne!(a, b);
        assert_eq!(
            owner_pid(&format!("{}-cli", a.as_str())),
            Some(std::process::id())
        );
    }

    #[test]
    fn tbf_drops_are_summed_from_tc_statistics() {
        let stats = "qdisc noqueue 0: dev br0 root refcnt 2 \n Sent 10 bytes 1 pkt (dropped 7, overlimits 0 requeues 0) \n backlog 0b 0p requeues 0\n\
qdisc tbf 8001: dev p-a root refcnt 3 rate 100Mbit burst 12500b lat 11ms \n Sent 9000 bytes 6 pkt (dropped 3, overlimits 40 requeues 0) \n backlog 0b 0p requeues 0\n\
qdisc tbf 8002: dev p-b root refcnt 3 rate 100Mbit burst 12500b lat 11ms \n Sent 0 bytes 0 pkt (dropped 12, overlimits 0 requeues 0) \n backlog 0b 0p requeues 0\n";
        assert_eq!(parse_tbf_drops(stats), 15, "only tbf qdiscs count");
        assert_eq!(parse_tbf_drops(""), 0);
    }

    #[test]
    fn tbf_drops_are_told_apart_by_port() {
        let stats = "qdisc noqueue 0: dev br0 root refcnt 2 \n Sent 10 bytes 1 pkt (dropped 7, overlimits 0 requeues 0) \n backlog 0b 0p requeues 0\n\
qdisc tbf 8001: dev p-cli root refcnt 3 rate 1Gbit burst 12112b lat 262us \n Sent 9000 bytes 6 pkt (dropped 3, overlimits 40 requeues 0) \n backlog 0b 0p requeues 0\n\
qdisc tbf 8002: dev p-s1 root refcnt 3 rate 1Gbit burst 12112b lat 262us \n Sent 0 bytes 0 pkt (dropped 12, overlimits 0 requeues 0) \n backlog 0b 0p requeues 0\n";
        let drops = parse_tbf_drops_by_device(stats);
        assert_eq!(
            drops,
            BTreeMap::from([("p-cli".to_string(), 3), ("p-s1".to_string(), 12)])
        );
        assert_eq!(drops.values().sum::<u64>(), parse_tbf_drops(stats));
        assert!(parse_tbf_drops_by_device("").is_empty());
    }

    #[test]
    fn tbf_backlog_and_sent_packets_are_read_by_port() {
        let stats = "qdisc tbf 8002: dev p-s1 root refcnt 3 rate 200Mbit burst 25000b lat 9.6ms \n Sent 151400 bytes 100 pkt (dropped 4, overlimits 40 requeues 0) \n backlog 4542b 3p requeues 0\n";
        let parsed = parse_tbf_stats_by_device(stats);
        assert_eq!(
            parsed["p-s1"],
            TbfStats {
                sent_packets: 100,
                dropped: 4,
                backlog_bytes: 4542,
                backlog_packets: 3,
            }
        );
    }

    #[test]
    fn rto_min_is_set_and_removed_keeping_the_route() {
        let route = "10.77.0.0/24 dev eth0 proto kernel scope link src 10.77.0.2 ";
        assert_eq!(subnet_prefix(), "10.77.0.0/24");
        assert_eq!(
            rto_min_route_command("tl-1-0-cli", route, Some(1)).to_string(),
            "ip -n tl-1-0-cli route change 10.77.0.0/24 dev eth0 proto kernel scope link src 10.77.0.2 rto_min 1ms"
        );
        // What `ip route show` prints once it is set: the value after `lock`.
        let set = "10.77.0.0/24 dev eth0 proto kernel scope link src 10.77.0.2 rto_min lock 1ms";
        assert_eq!(
            rto_min_route_command("ns", set, None).to_string(),
            "ip -n ns route change 10.77.0.0/24 dev eth0 proto kernel scope link src 10.77.0.2"
        );
        assert_eq!(
            rto_min_route_command("ns", "10.77.0.0/24 dev eth0 rto_min 5ms", Some(2)).to_string(),
            "ip -n ns route change 10.77.0.0/24 dev eth0 rto_min 2ms"
        );
    }

    #[test]
    fn namespaces_are_created_switch_first() {
        let t = Topology::new(
            RunPrefix("tl-7-1".into()),
            &["a", "b"],
            LinkSpec::new(Rate::mbit(50)),
        )
        .unwrap();
        let cmds: Vec<String> = t.namespace_commands().iter().map(strings).collect();
        assert_eq!(
            cmds,
            [
                "ip netns add tl-7-1-sw",
                "ip netns add tl-7-1-a",
                "ip netns add tl-7-1-b"
            ]
        );
    }

    #[test]
    fn link_commands_build_bridge_ports_with_tbf_both_ways_and_offloads_off() {
        let mut link = LinkSpec::new(Rate::mbit(100));
        link.switch_buffer = Buffer::Packets(50);
        link.nic_buffer = Buffer::Bytes(300_000);
        let t = Topology::new(RunPrefix("tl-7-1".into()), &["a"], link).unwrap();
        let cmds: Vec<String> = t.link_commands().iter().map(strings).collect();
        let expected = [
            "ip -n tl-7-1-sw link set lo up",
            "ip -n tl-7-1-sw link add br0 type bridge",
            "ip -n tl-7-1-sw link set br0 up",
            "ip netns exec tl-7-1-sw sysctl -q -e -w net.bridge.bridge-nf-call-iptables=0 \
             net.bridge.bridge-nf-call-ip6tables=0 net.bridge.bridge-nf-call-arptables=0",
            "ip -n tl-7-1-a link set lo up",
            "ip -n tl-7-1-sw link add p-a type veth peer name eth0 netns tl-7-1-a",
            "ip netns exec tl-7-1-sw ethtool -K p-a tso off gso off gro off tx-udp-segmentation off",
            "ip netns exec tl-7-1-a ethtool -K eth0 tso off gso off gro off tx-udp-segmentation off",
            "ip -n tl-7-1-sw link set p-a master br0",
            "ip -n tl-7-1-sw link set p-a up",
            "ip -n tl-7-1-a addr add 10.77.0.1/24 dev eth0",
            "ip -n tl-7-1-a link set eth0 up",
            "tc -n tl-7-1-sw qdisc replace dev p-a root tbf rate 100000000bit burst 12500 limit 75700",
            "tc -n tl-7-1-a qdisc replace dev eth0 root tbf rate 100000000bit burst 12500 limit 300000",
        ];
        assert_eq!(cmds, expected);
    }
}
