//! Membership of the replicated manager's group (issue 17 item 3) on a local cluster of the
//! real binary: `tessera up --managers 3`, then `tessera manager remove 2`, `tessera manager
//! add 4` (a fresh replica that joins by state transfer), a kill of replica 1 while replicas
//! 3 and 4 carry on, and replica 2 wiped and added again as a new member. Every put
//! acknowledged along the way must be listed and read back at the end.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Longest a change of the group may take to show in `tessera status`.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

fn tessera() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tessera"));
    command
        .env_remove("TESSERA_CLUSTER")
        .env("TESSERA_LOG", "info");
    command
}

/// `tessera ARGS` on the local cluster in `dir` (`--dir` for cluster commands, `--cluster`
/// for the rest).
fn local(dir: &Path, args: &[&str]) -> Output {
    let mut command = tessera();
    command.args(args);
    if matches!(args[0], "up" | "down" | "manager") {
        command.arg("--dir").arg(dir);
    } else {
        command.arg("--cluster").arg(dir);
    }
    command.output().unwrap()
}

#[track_caller]
fn local_ok(dir: &Path, args: &[&str]) -> String {
    let output = local(dir, args);
    assert!(
        output.status.success(),
        "tessera {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The group line of `tessera status`'s output: the member ids.
fn group_of(status: &str) -> Vec<u16> {
    let line = status
        .lines()
        .find(|line| line.starts_with("manager group"))
        .unwrap_or_else(|| panic!("no group in the status: {status}"));
    let (_, members) = line.split_once("): ").expect("members");
    members
        .split(", ")
        .map(|member| member.split(' ').next().unwrap().parse().unwrap())
        .collect()
}

/// Waits until `tessera status` shows the group `members`, each of them a normal member
/// (leader or follower); the status seen.
fn wait_group(dir: &Path, members: &[u16]) -> String {
    let start = Instant::now();
    loop {
        let status = local_ok(dir, &["status"]);
        let normal = status
            .lines()
            .filter(|l| l.contains("leader") || l.contains("follower"))
            .count();
        if group_of(&status) == members && normal == members.len() {
            return status;
        }
        assert!(
            start.elapsed() < SETTLE_TIMEOUT,
            "the group did not become {members:?}: {status}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn replicas_are_removed_added_and_replaced_without_loss() {
    let temp = tempfile::Builder::new()
        .prefix("tessera-membership-")
        .tempdir()
        .unwrap();
    let dir = temp.path().join("cluster");
    let file = temp.path().join("small");
    std::fs::write(&file, b"membership").unwrap();
    let file = file.to_str().unwrap();
    local_ok(
        &dir,
        &["up", "--managers", "3", "--servers", "4", "--detach"],
    );
    struct Down<'a>(&'a Path);
    impl Drop for Down<'_> {
        fn drop(&mut self) {
            let _ = local(self.0, &["down"]);
        }
    }
    let _down = Down(&dir);
    let mut acknowledged = Vec::new();
    let mut put = |path: &str| {
        local_ok(&dir, &["put", file, path]);
        acknowledged.push(path.to_string());
    };
    put("/a");
    let began = Instant::now();
    let removed = local_ok(&dir, &["manager", "remove", "2"]);
    println!("remove 2: {} ms: {removed}", began.elapsed().as_millis());
    println!("{}", wait_group(&dir, &[1, 3]));
    put("/b");
    let began = Instant::now();
    let added = local_ok(&dir, &["manager", "add", "4"]);
    println!("add 4: {} ms: {added}", began.elapsed().as_millis());
    put("/c");
    println!("{}", wait_group(&dir, &[1, 3, 4]));
    // Replica 1 killed: 3 and 4 are a majority of the new group, so 4 must be a member that
    // acknowledges.
    local_ok(&dir, &["manager", "stop", "1"]);
    put("/d");
    local_ok(&dir, &["manager", "start", "1"]);
    println!("{}", wait_group(&dir, &[1, 3, 4]));
    // Replica 2, removed, comes back wiped as a new member.
    let began = Instant::now();
    let added = local_ok(&dir, &["manager", "add", "2"]);
    println!("add 2 (wiped): {} ms: {added}", began.elapsed().as_millis());
    put("/e");
    let status = wait_group(&dir, &[1, 2, 3, 4]);
    println!("{status}");
    let listing = local_ok(&dir, &["ls"]);
    for path in &acknowledged {
        assert!(listing.contains(path.as_str()), "{path} lost: {listing}");
    }
    // Every acknowledged file reads back.
    let out = temp.path().join("back");
    for path in &acknowledged {
        let start = Instant::now();
        loop {
            let output = local(&dir, &["get", path, out.to_str().unwrap()]);
            if output.status.success() {
                break;
            }
            let why = String::from_utf8_lossy(&output.stderr).into_owned();
            assert!(start.elapsed() < SETTLE_TIMEOUT, "get {path}: {why}");
            println!("get {path} refused, tried again: {why}");
            std::thread::sleep(Duration::from_millis(500));
        }
        assert_eq!(std::fs::read(&out).unwrap(), b"membership", "{path}");
    }
    // Every member applied the same positions (nothing proposed since the last put).
    let start = Instant::now();
    loop {
        let status = local_ok(&dir, &["status", "--json"]);
        let value: serde_json::Value = serde_json::from_str(&status).unwrap();
        let applied: Vec<u64> = value["managers"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["applied"].as_u64())
            .collect();
        if applied.len() == 4 && applied.iter().all(|&a| a == applied[0]) {
            println!("every member applied {}", applied[0]);
            break;
        }
        assert!(
            start.elapsed() < SETTLE_TIMEOUT,
            "members stand apart: {status}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
