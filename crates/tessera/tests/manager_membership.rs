//! Membership of the replicated manager's group (issue 17 item 3) on a local cluster of the
//! real binary: `tessera up --managers 3`, then `tessera manager remove 2`, `tessera manager
//! add 4` (a fresh replica that joins by state transfer), a kill of replica 1 while replicas
//! 3 and 4 carry on, and replica 2 wiped and added again as a new member. Every put
//! acknowledged along the way must be listed and read back at the end.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};
use support::local::{local, local_ok, Down};

/// Longest a change of the group may take to show in `tessera status`.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The members of the group line of `tessera status`'s output, as (id, address).
fn members_of(status: &str) -> Vec<(u16, std::net::SocketAddr)> {
    let line = status
        .lines()
        .find(|line| line.starts_with("manager group"))
        .unwrap_or_else(|| panic!("no group in the status: {status}"));
    let (_, members) = line.split_once("): ").expect("members");
    members
        .split(", ")
        .map(|member| match member.split(' ').collect::<Vec<_>>()[..] {
            [id, "at", addr] => (id.parse().unwrap(), addr.parse().unwrap()),
            _ => panic!("not ID at ADDR: {member}"),
        })
        .collect()
}

/// The member ids of `tessera status`'s group line.
fn group_of(status: &str) -> Vec<u16> {
    members_of(status).into_iter().map(|(id, _)| id).collect()
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

/// The member addresses of `tessera status`'s group line.
fn member_addrs(status: &str) -> Vec<std::net::SocketAddr> {
    members_of(status)
        .into_iter()
        .map(|(_, addr)| addr)
        .collect()
}

/// Servers and clients learn the group (issue 17): a client of the library and the servers
/// start with replicas 1-3; 4 and 5 are added, 1 and 2 removed (their processes killed) and
/// 3 stopped, so that only replicas they learned of reach the group. The client goes on
/// creating and reading, and the servers stay up past several heartbeat timeouts (they
/// heartbeat to the new members). Then `tessera down` and `tessera up --managers 3` start
/// the changed group (3, 4 and 5), with every acknowledged file.
#[test]
fn clients_and_servers_follow_the_group_and_up_starts_it() {
    let temp = tempfile::Builder::new()
        .prefix("tessera-follow-")
        .tempdir()
        .unwrap();
    let dir = temp.path().join("cluster");
    let up = ["up", "--managers", "3", "--servers", "3", "--detach"];
    local_ok(&dir, &up);
    let _down = Down(&dir);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let client = runtime.block_on(support::local::admin_client(&dir));
    let first = support::local::manager_addrs(&dir);
    let layout = tessera_client::LayoutRequest {
        scheme: tessera_client::Scheme::Raid5,
        stripe_unit: 65536,
        width: Some(3),
    };
    let mut created = Vec::new();
    let mut create = |path: &str| {
        runtime
            .block_on(client.create(path, layout.clone()))
            .unwrap_or_else(|e| panic!("create {path}: {e}"));
        created.push(path.to_string());
    };
    create("/before");
    local_ok(&dir, &["manager", "add", "4"]);
    local_ok(&dir, &["manager", "add", "5"]);
    let status = wait_group(&dir, &[1, 2, 3, 4, 5]);
    let five = member_addrs(&status);
    // The client learns the new members from its answers (at most GROUP_REFRESH apart).
    let start = Instant::now();
    while client.manager_addrs() != five {
        assert!(
            start.elapsed() < SETTLE_TIMEOUT,
            "the client did not learn {five:?}: {:?}",
            client.manager_addrs()
        );
        runtime.block_on(client.stat("/before")).unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
    create("/added");
    // The servers learn them too, by their heartbeats' refresh.
    std::thread::sleep(tessera_transport::managers::GROUP_REFRESH * 2);
    local_ok(&dir, &["manager", "remove", "1"]);
    local_ok(&dir, &["manager", "remove", "2"]);
    let three = member_addrs(&wait_group(&dir, &[3, 4, 5]));
    local_ok(&dir, &["manager", "stop", "3"]);
    // Of the replicas the client was given, none is a running member now.
    create("/after");
    for path in &created {
        runtime
            .block_on(client.stat(path))
            .unwrap_or_else(|e| panic!("stat {path}: {e}"));
    }
    assert_eq!(client.manager_addrs(), three, "learned");
    assert!(first
        .iter()
        .all(|addr| *addr == three[0] || !three.contains(addr)));
    // Three heartbeat timeouts (2 s each) with the servers' first replicas gone: still up.
    std::thread::sleep(Duration::from_secs(6));
    let status = local_ok(&dir, &["status", "--json"]);
    let value: serde_json::Value = serde_json::from_str(&status).unwrap();
    let servers = value["servers"].as_array().unwrap();
    let servers_up = servers.iter().filter(|s| s["state"] == "up").count();
    assert_eq!(
        servers_up, 3,
        "servers fell down with the old group gone: {status}"
    );
    // The whole cluster stopped and started again: the changed group starts.
    drop(client);
    local_ok(&dir, &["down"]);
    local_ok(&dir, &up);
    assert_eq!(member_addrs(&wait_group(&dir, &[3, 4, 5])), three);
    let listing = local_ok(&dir, &["ls"]);
    for path in &created {
        assert!(listing.contains(path.as_str()), "{path} lost: {listing}");
    }
}
