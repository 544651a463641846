//! Multi-host tests in network namespaces (testing layer 4). They need root and `ip`, `tc`
//! and `ethtool` (CI runs as root and installs them); anywhere else they fail and say why,
//! rather than skip and pass.

use std::sync::Mutex;
use std::time::Duration;
use tessera_lab::cmd::{self, Cmd};
use tessera_lab::net::{self, LinkSpec, Network, Rate, RunPrefix, Topology};
use tessera_lab::probe;

fn require_lab_host() {
    if let Err(e) = cmd::require_lab_host() {
        panic!("the lab's network tests cannot run here: {e} (run them as root with iproute2 and ethtool installed)");
    }
}

fn left_over(names: &[String]) -> Vec<String> {
    let listed = net::list_namespaces().expect("ip netns list");
    names
        .iter()
        .filter(|n| listed.contains(n))
        .cloned()
        .collect()
}

#[test]
fn two_hosts_echo_across_the_bridge_through_tbf_and_teardown_leaves_nothing() {
    require_lab_host();
    let rate = Rate::mbit(50);
    let topology = Topology::new(RunPrefix::new(), &["a", "b"], LinkSpec::new(rate)).unwrap();
    let names = topology.namespaces();
    let switch = topology.switch_namespace();
    let network = Network::build(topology).unwrap();
    assert_eq!(left_over(&names), names, "every namespace exists");

    let echo = probe::udp_echo(&network, "a", "b", 10).unwrap();
    assert_eq!(echo.received, 10, "every echo answered: {echo:?}");
    assert!(
        echo.rtt_us_min > 0.0 && echo.rtt_us_min < 50_000.0,
        "{echo:?}"
    );

    // 2.5 MB at 50 Mbit/s is about 0.4 s; tbf must hold the stream near the rate (TCP gets
    // at most 1448/1514 of it), and the switch port toward b must have carried it.
    let bytes = 2_500_000;
    let stream = probe::tcp_stream(&network, "a", "b", bytes, Duration::from_secs(20)).unwrap();
    let share = stream.bits_per_s / rate.bits_per_s as f64;
    assert!(
        (0.6..=1.05).contains(&share),
        "stream at {share:.3} of the link rate: {stream:?}"
    );
    let port = Cmd::new("tc")
        .args(["-s", "-n", &switch, "qdisc", "show", "dev", "p-b"])
        .run()
        .unwrap();
    assert!(
        port.contains("tbf") && port.contains("rate 50Mbit"),
        "{port}"
    );
    let sent: u64 = port
        .split_whitespace()
        .skip_while(|w| *w != "Sent")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        sent >= bytes,
        "the tbf port toward b carried only {sent} bytes:\n{port}"
    );

    network.teardown().unwrap();
    assert!(
        left_over(&names).is_empty(),
        "teardown left {:?}",
        left_over(&names)
    );
}

#[test]
fn a_network_is_torn_down_when_a_panic_unwinds_past_it() {
    require_lab_host();
    let names = Mutex::new(Vec::new());
    let result = std::panic::catch_unwind(|| {
        let link = LinkSpec::new(Rate::mbit(10));
        let topology = Topology::new(RunPrefix::new(), &["a", "b"], link).unwrap();
        *names.lock().unwrap() = topology.namespaces();
        let _network = Network::build(topology).unwrap();
        panic!("an experiment fails half-way");
    });
    assert!(result.is_err());
    let names = names.into_inner().unwrap();
    assert_eq!(names.len(), 3);
    assert!(
        left_over(&names).is_empty(),
        "the panic left {:?}",
        left_over(&names)
    );
}

#[test]
fn cleanup_keeps_namespaces_of_live_runs() {
    require_lab_host();
    let link = LinkSpec::new(Rate::mbit(10));
    let topology = Topology::new(RunPrefix::new(), &["a"], link).unwrap();
    let names = topology.namespaces();
    let network = Network::build(topology).unwrap();
    let report = net::cleanup(false).unwrap();
    assert!(
        names.iter().all(|n| !report.removed.contains(n)),
        "{report:?}"
    );
    assert_eq!(left_over(&names), names);
    network.teardown().unwrap();
}
