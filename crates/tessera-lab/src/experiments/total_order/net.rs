//! The total-order paper's testbed in namespaces: two bridges joined by one veth pair.
//!
//! One namespace holds both switches: bridge `brA` (the senders' side) and `brB` (the
//! receivers' side), joined by the veth pair `tA`-`tB`, the one link every multicast frame
//! crosses (the "virtual sequencer"). Node `i` has its own namespace with two interfaces:
//! `tx` into `brA` (port `aI`) and `rx` out of `brB` (port `bI`). Every node port is
//! isolated, so a frame from a TX port can only go to the trunk, and reaches the nodes only
//! through `brB`. Multicast snooping is off, so multicast floods without IGMP state.
//!
//! In each node: TX at `10.78.1.(i+1)`, RX at `10.78.2.(i+1)`; the multicast group and every
//! other node's RX address are routed out of `tx` (with permanent neighbour entries, since RX
//! interfaces never send and so never answer ARP through the trunk's learning); reverse-path
//! filtering off and local sources accepted on `rx`, where a node's own multicast comes back.
//! `tbf` shapes each node's TX interface (its NIC), the trunk from A to B, and each port of B
//! toward a node. Offloads are off and the MTU is 9000 everywhere, so the protocol's packet
//! size (1500 or 9000) is what a frame carries. The guard deletes every namespace when
//! dropped.

use crate::cmd::Cmd;
use crate::net::{remove_namespace, tbf_command, LinkSpec, RunPrefix};
use crate::LabError;
use std::net::{Ipv4Addr, SocketAddrV4};

/// The senders' bridge.
const BRIDGE_A: &str = "brA";
/// The receivers' bridge.
const BRIDGE_B: &str = "brB";
/// The trunk's end on bridge A (its egress is the sequencer link from A to B).
const TRUNK_A: &str = "tA";
/// The trunk's end on bridge B.
const TRUNK_B: &str = "tB";
/// A node's interface into switch A.
pub const TX_INTERFACE: &str = "tx";
/// A node's interface out of switch B.
pub const RX_INTERFACE: &str = "rx";
/// MTU of every interface.
pub const LINK_MTU: u32 = 9000;
/// Most nodes (addresses .1 to .16).
pub const NODES_MAX: usize = 16;
/// The multicast group of the experiment.
pub const GROUP: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(239, 78, 0, 1), 7300);
/// Offloads turned off on every veth end.
const OFFLOADS: [&str; 4] = ["tso", "gso", "gro", "tx-udp-segmentation"];

/// Node `i`'s TX address.
pub fn tx_addr(node: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 78, 1, node as u8 + 1)
}

/// Node `i`'s RX address.
pub fn rx_addr(node: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 78, 2, node as u8 + 1)
}

/// Node `i`'s RX MAC address (set, so that the others can hold it as a permanent entry).
fn rx_mac(node: usize) -> String {
    format!("02:78:02:00:00:{:02x}", node + 1)
}

/// The built two-switch network; dropping it deletes its namespaces.
#[derive(Debug)]
pub struct TwoSwitch {
    prefix: RunPrefix,
    nodes: usize,
    created: Vec<String>,
}

impl TwoSwitch {
    /// Builds it for `nodes` nodes with links like `link`. Needs root, `ip`, `tc`, `ethtool`.
    pub fn build(nodes: usize, link: &LinkSpec) -> Result<TwoSwitch, LabError> {
        crate::cmd::require_lab_host()?;
        if !(1..=NODES_MAX).contains(&nodes) {
            return Err(LabError::BadValue {
                what: "number of nodes",
                text: nodes.to_string(),
                expected: "1 to 16",
            });
        }
        let mut network = TwoSwitch {
            prefix: RunPrefix::new(),
            nodes,
            created: Vec::new(),
        };
        let namespaces: Vec<String> = std::iter::once(network.switch_namespace())
            .chain((0..nodes).map(|i| network.namespace(i)))
            .collect();
        for ns in namespaces {
            Cmd::new("ip").args(["netns", "add", &ns]).run()?;
            network.created.push(ns.clone());
            Cmd::new("sysctl")
                .args(["-q", "-e", "-w", "net.ipv6.conf.all.disable_ipv6=1"])
                .arg("net.ipv6.conf.default.disable_ipv6=1")
                .in_namespace(&ns)
                .run()?;
        }
        for command in network.switch_commands(link) {
            command.run()?;
        }
        for node in 0..nodes {
            for command in network.node_commands(node, link) {
                command.run()?;
            }
        }
        Ok(network)
    }

    /// Nodes in the network.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// The switches' namespace.
    pub fn switch_namespace(&self) -> String {
        format!("{}-sw", self.prefix.as_str())
    }

    /// Node `i`'s namespace.
    pub fn namespace(&self, node: usize) -> String {
        format!("{}-n{node}", self.prefix.as_str())
    }

    fn switch_commands(&self, link: &LinkSpec) -> Vec<Cmd> {
        let sw = self.switch_namespace();
        let ip = || Cmd::new("ip").args(["-n", &sw]);
        let mut out = vec![ip().args(["link", "set", "dev", "lo", "up"])];
        for bridge in [BRIDGE_A, BRIDGE_B] {
            out.push(
                ip().args(["link", "add", bridge, "type", "bridge"])
                    .args(["mcast_snooping", "0"]),
            );
        }
        out.push(
            ip().args(["link", "add", TRUNK_A, "type", "veth", "peer", "name"])
                .arg(TRUNK_B),
        );
        for (port, bridge) in [(TRUNK_A, BRIDGE_A), (TRUNK_B, BRIDGE_B)] {
            out.extend(port_commands(&sw, port, bridge, false));
        }
        for bridge in [BRIDGE_A, BRIDGE_B] {
            out.push(ip().args([
                "link",
                "set",
                "dev",
                bridge,
                "mtu",
                &LINK_MTU.to_string(),
                "up",
            ]));
        }
        out.push(
            Cmd::new("sysctl")
                .args(["-q", "-e", "-w", "net.bridge.bridge-nf-call-iptables=0"])
                .in_namespace(&sw),
        );
        // The sequencer link: everything crosses it from A to B.
        out.push(tbf_command(
            &sw,
            TRUNK_A,
            link.rate,
            link.burst_bytes(),
            link.switch_buffer,
        ));
        out
    }

    fn node_commands(&self, node: usize, link: &LinkSpec) -> Vec<Cmd> {
        let (sw, ns) = (self.switch_namespace(), self.namespace(node));
        let (a, b) = (format!("a{node}"), format!("b{node}"));
        let ip = |namespace: &str| Cmd::new("ip").args(["-n", namespace]);
        let mut out = vec![
            ip(&ns).args(["link", "set", "dev", "lo", "up"]),
            ip(&sw)
                .args(["link", "add", &a, "type", "veth", "peer", "name"])
                .args([TX_INTERFACE, "netns", &ns]),
            ip(&sw)
                .args(["link", "add", &b, "type", "veth", "peer", "name"])
                .args([RX_INTERFACE, "netns", &ns]),
            ip(&ns).args(["link", "set", "dev", RX_INTERFACE, "address", &rx_mac(node)]),
        ];
        out.extend(port_commands(&sw, &a, BRIDGE_A, true));
        out.extend(port_commands(&sw, &b, BRIDGE_B, true));
        for (interface, addr) in [(TX_INTERFACE, tx_addr(node)), (RX_INTERFACE, rx_addr(node))] {
            out.push(offloads_off(interface).in_namespace(&ns));
            out.push(ip(&ns).args([
                "link",
                "set",
                "dev",
                interface,
                "mtu",
                &LINK_MTU.to_string(),
            ]));
            out.push(ip(&ns).args(["addr", "add", &format!("{addr}/24"), "dev", interface]));
            out.push(ip(&ns).args(["link", "set", "dev", interface, "up"]));
        }
        out.push(
            Cmd::new("sysctl")
                .args(["-q", "-w", "net.ipv4.conf.all.rp_filter=0"])
                .args(["net.ipv4.conf.default.rp_filter=0"])
                .args([
                    "net.ipv4.conf.rx.rp_filter=0",
                    "net.ipv4.conf.rx.accept_local=1",
                ])
                .in_namespace(&ns),
        );
        out.push(ip(&ns).args(["route", "add", "239.0.0.0/8", "dev", TX_INTERFACE]));
        for other in (0..self.nodes).filter(|&other| other != node) {
            let peer = rx_addr(other).to_string();
            out.push(ip(&ns).args(["route", "add", &format!("{peer}/32"), "dev", TX_INTERFACE]));
            out.push(
                ip(&ns)
                    .args(["neigh", "replace", &peer, "lladdr", &rx_mac(other)])
                    .args(["dev", TX_INTERFACE, "nud", "permanent"]),
            );
        }
        // The node's NIC and the switch B port toward it.
        out.push(tbf_command(
            &ns,
            TX_INTERFACE,
            link.rate,
            link.burst_bytes(),
            link.nic_buffer,
        ));
        out.push(tbf_command(
            &sw,
            &b,
            link.rate,
            link.burst_bytes(),
            link.switch_buffer,
        ));
        out
    }

    /// Frames dropped so far by every `tbf` of the network (full queues).
    pub fn tbf_drops(&self) -> Result<u64, LabError> {
        let mut drops = 0;
        for ns in &self.created {
            let stats = Cmd::new("tc")
                .args(["-s", "-n", ns, "qdisc", "show"])
                .run()?;
            drops += crate::net::parse_tbf_drops(&stats);
        }
        Ok(drops)
    }

    /// Datagrams the nodes' UDP sockets dropped so far for a full receive buffer (their
    /// namespaces' `RcvbufErrors`, summed over nodes).
    pub fn socket_drops(&self) -> Result<u64, LabError> {
        let mut drops = 0;
        for node in 0..self.nodes {
            let snmp = Cmd::new("cat")
                .arg("/proc/net/snmp")
                .in_namespace(&self.namespace(node))
                .run()?;
            drops += parse_udp_counter(&snmp, "RcvbufErrors").unwrap_or(0);
        }
        Ok(drops)
    }

    /// Deletes the namespaces now and checks that none is left.
    pub fn teardown(mut self) -> Result<(), LabError> {
        let ours = self.created.clone();
        self.teardown_all();
        let left: Vec<String> = crate::net::list_namespaces()?
            .into_iter()
            .filter(|ns| ours.contains(ns))
            .collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(LabError::Leftovers(left))
        }
    }

    fn teardown_all(&mut self) {
        while let Some(ns) = self.created.pop() {
            if let Err(e) = remove_namespace(&ns) {
                eprintln!("lab: teardown of {ns}: {e}");
            }
        }
    }
}

impl Drop for TwoSwitch {
    fn drop(&mut self) {
        self.teardown_all();
    }
}

/// Frames the kernel dropped so far at a full per-CPU input queue (`netdev_max_backlog`),
/// summed over CPUs: a veth delivers every frame through it, in every namespace (the
/// machine's count, not the network's alone). 0 where `/proc/net/softnet_stat` cannot be
/// read.
pub fn backlog_drops() -> u64 {
    std::fs::read_to_string("/proc/net/softnet_stat")
        .map(|text| parse_softnet_drops(&text))
        .unwrap_or(0)
}

/// The second column (dropped) of every CPU's line of `/proc/net/softnet_stat`, summed.
fn parse_softnet_drops(text: &str) -> u64 {
    text.lines()
        .filter_map(|line| line.split_whitespace().nth(1))
        .filter_map(|hex| u64::from_str_radix(hex, 16).ok())
        .sum()
}

/// The UDP counter `name` of `/proc/net/snmp` (a line of names, then one of values).
fn parse_udp_counter(snmp: &str, name: &str) -> Option<u64> {
    let mut lines = snmp.lines().filter(|line| line.starts_with("Udp: "));
    let names = lines.next()?.split_whitespace();
    let values = lines.next()?.split_whitespace();
    names
        .zip(values)
        .find(|(n, _)| *n == name)
        .and_then(|(_, value)| value.parse().ok())
}

fn offloads_off(interface: &str) -> Cmd {
    let mut cmd = Cmd::new("ethtool").args(["-K", interface]);
    for offload in OFFLOADS {
        cmd = cmd.args([offload, "off"]);
    }
    cmd
}

/// A switch port: offloads off, MTU, into `bridge`, isolated or not, up.
fn port_commands(sw: &str, port: &str, bridge: &str, isolated: bool) -> Vec<Cmd> {
    let ip = || Cmd::new("ip").args(["-n", sw]);
    vec![
        offloads_off(port).in_namespace(sw),
        ip().args(["link", "set", "dev", port, "mtu", &LINK_MTU.to_string()]),
        ip().args(["link", "set", "dev", port, "master", bridge]),
        ip().args(["link", "set", "dev", port, "type", "bridge_slave"])
            .args(["isolated", if isolated { "on" } else { "off" }]),
        ip().args(["link", "set", "dev", port, "up"]),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::Rate;

    #[test]
    fn reads_the_kernels_drop_counters() {
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
                    Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n\
                    Udp: 37 0 5 38 4 1\n\
                    UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors\n\
                    UdpLite: 0 0 0 0 9\n";
        assert_eq!(parse_udp_counter(snmp, "RcvbufErrors"), Some(4));
        assert_eq!(parse_udp_counter(snmp, "SndbufErrors"), Some(1));
        assert_eq!(parse_udp_counter(snmp, "Nothing"), None);
        let softnet = "0000a0b1 0000000a 00000003 00000000\n0000ffff 00000100 00000000 00000000\n";
        assert_eq!(parse_softnet_drops(softnet), 10 + 256);
    }

    #[test]
    fn node_ports_are_isolated_and_routes_go_out_of_tx() {
        let network = TwoSwitch {
            prefix: RunPrefix::new(),
            nodes: 3,
            created: Vec::new(),
        };
        let link = LinkSpec::new(Rate::mbit(1000));
        let commands: Vec<String> = network
            .node_commands(1, &link)
            .iter()
            .map(|c| c.to_string())
            .collect();
        let has = |needle: &str| commands.iter().any(|c| c.contains(needle));
        assert!(has("link set dev a1 type bridge_slave isolated on"));
        assert!(has("link set dev b1 type bridge_slave isolated on"));
        assert!(has("route add 239.0.0.0/8 dev tx"));
        assert!(has("route add 10.78.2.1/32 dev tx"));
        assert!(has("route add 10.78.2.3/32 dev tx"));
        assert!(!has("route add 10.78.2.2/32"), "not to itself");
        assert!(has(
            "neigh replace 10.78.2.3 lladdr 02:78:02:00:00:03 dev tx nud permanent"
        ));
        let switch: Vec<String> = network
            .switch_commands(&link)
            .iter()
            .map(|c| c.to_string())
            .collect();
        assert!(switch
            .iter()
            .any(|c| c.contains("tA type bridge_slave isolated off")));
        assert!(switch.iter().any(|c| c.contains("mcast_snooping 0")));
        assert!(switch
            .iter()
            .any(|c| c.contains("qdisc replace dev tA root tbf")));
    }
}
