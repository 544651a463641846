//! Synchronized striped reads in network namespaces through the `tessera` binary (testing
//! layer 4): `tessera lab incast` at one point, sixteen servers answering at once into a client
//! port with a 32 KiB buffer, asserting what does not depend on this machine's speed (drops at
//! the port, the length of the timers, the bytes read). It needs root, `ip`, `tc` and
//! `ethtool` (CI runs as root and installs them); anywhere else the lab fails, and so does
//! this test, saying why, rather than skip and pass.

use serde_json::Value;
use std::path::Path;
use std::process::Command;

/// Servers answering each read: 16 unanswered requests of 32 KiB are 512 KiB toward a port
/// that holds 32 KiB.
const SERVERS: u64 = 16;
/// Timed reads of the point (each a whole stripe, 512 KiB).
const READS: u64 = 40;

/// The one point of `tessera lab incast` over Tessera's transport, with `extra` flags.
fn incast_point(dir: &Path, extra: &[&str]) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "lab", "incast", "--quick", "--lines", "tessera", "--units", "32K",
        ])
        .args([
            "--servers",
            &SERVERS.to_string(),
            "--reads",
            &READS.to_string(),
        ])
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .output()
        .expect("run tessera lab incast");
    assert!(
        output.status.success(),
        "tessera lab incast {extra:?}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let json = std::fs::read_to_string(dir.join("incast.json")).expect("incast.json written");
    let report: Value = serde_json::from_str(&json).expect("incast.json parses");
    let points = report["points"].as_array().expect("points");
    assert_eq!(points.len(), 1, "one point: {points:?}");
    points[0].clone()
}

fn counter(point: &Value, side: &str, name: &str) -> u64 {
    point[side][name]
        .as_u64()
        .unwrap_or_else(|| panic!("{side}.{name} in {point}"))
}

#[test]
fn receive_budget_keeps_sixteen_servers_answering_at_once_from_overflowing_the_client_port() {
    let dir = tempfile::tempdir().expect("temporary directory");

    // The default: the client grants its receive budget (20 packets, under the port's 22
    // frames), so what is in flight toward the port never overflows it.
    let granted = incast_point(&dir.path().join("granted"), &[]);
    assert_eq!(granted["line"], "tessera");
    assert_eq!(granted["reads"].as_u64(), Some(READS), "{granted}");
    assert!(
        granted["verified_blocks"].as_u64() >= Some(1),
        "the blocks read were checked against what was written: {granted}"
    );
    assert_eq!(
        granted["client_port_drops"].as_u64(),
        Some(0),
        "with grants nothing may be dropped at the client's port: {granted}"
    );
    for side in ["datagram_servers", "datagram_client"] {
        let timer = counter(&granted, side, "timer_us_max");
        assert!(
            timer <= 1000,
            "{side}: a retransmission timer armed for {timer} us, over 1 ms: {granted}"
        );
    }

    // The same reads with the grants turned off: each server's own window, however small,
    // times sixteen overflows the port. Without this contrast the zero above would prove
    // nothing about the grants.
    let ungranted = incast_point(&dir.path().join("ungranted"), &["--receive-budget", "0"]);
    assert!(
        ungranted["client_port_drops"].as_u64() > Some(0),
        "without grants sixteen servers at once should overflow the port: {ungranted}"
    );
    assert_eq!(ungranted["reads"].as_u64(), Some(READS), "{ungranted}");
}
