//! The local cluster of the real binary (`tessera up`) as the manager tests drive it: the
//! binary without the caller's environment, `tessera ARGS` on a cluster directory, and an
//! admin client of the library built from the cluster's `cluster.toml`.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output};

/// The `tessera` binary, without `TESSERA_CLUSTER`, logging at info.
pub fn tessera() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tessera"));
    command
        .env_remove("TESSERA_CLUSTER")
        .env("TESSERA_LOG", "info");
    command
}

/// `tessera ARGS` on the local cluster in `dir` (`--dir` for cluster commands, `--cluster`
/// for the rest).
pub fn local(dir: &Path, args: &[&str]) -> Output {
    let mut command = tessera();
    command.args(args);
    if matches!(args[0], "up" | "down" | "manager") {
        command.arg("--dir").arg(dir);
    } else {
        command.arg("--cluster").arg(dir);
    }
    command.output().unwrap()
}

/// [`local`], which must succeed; its standard output.
#[track_caller]
pub fn local_ok(dir: &Path, args: &[&str]) -> String {
    let output = local(dir, args);
    assert!(
        output.status.success(),
        "tessera {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs `tessera down` on `dir` when dropped (a test that fails leaves no daemons behind).
pub struct Down<'a>(pub &'a Path);

impl Drop for Down<'_> {
    fn drop(&mut self) {
        let _ = local(self.0, &["down"]);
    }
}

/// The manager addresses `cluster.toml` of the local cluster in `dir` lists (every member
/// of a replicated manager, else the one manager).
pub fn manager_addrs(dir: &Path) -> Vec<SocketAddr> {
    let file = cluster_file(dir);
    let mut managers: Vec<SocketAddr> = file["managers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().parse().unwrap())
        .collect();
    if managers.is_empty() {
        managers.push(file["manager"].as_str().unwrap().parse().unwrap());
    }
    managers
}

/// An admin client of the local cluster in `dir`, given the managers `cluster.toml` lists.
pub async fn admin_client(dir: &Path) -> tessera_client::Client {
    let file = cluster_file(dir);
    let secret_text = std::fs::read_to_string(file["secret"].as_str().unwrap()).unwrap();
    let secret = tessera_auth::Secret::from_file_text(&secret_text).unwrap();
    let config = tessera_client::ClientConfig {
        credential: Some(tessera_auth::Credential {
            claim: tessera_auth::Claim::Admin,
            key: secret.admin_key(),
        }),
        ..tessera_client::ClientConfig::default()
    };
    tessera_client::Client::connect_replicated(manager_addrs(dir), config)
        .await
        .unwrap()
}

fn cluster_file(dir: &Path) -> toml::Table {
    let text = std::fs::read_to_string(dir.join("cluster.toml")).unwrap();
    text.parse().unwrap()
}
