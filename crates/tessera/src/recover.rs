//! `tessera manager recover`: rebuild a lost metadata store from the servers' file records.
//!
//! Asks every server (over TCP) for its identity and its file records, page by page, merges
//! them ([`tessera_manager::recovery::merge`]) and writes the store where the manager opens
//! it. A manager already running without a store there picks it up within a tick.

use crate::cluster::LocalCluster;
use crate::config::Config;
use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tessera_manager::recovery::{self, ServerReport};
use tessera_transport::{TcpConfig, TcpTransport, Transport};
use tessera_wire::{StorageCall, StorageRequest, StorageResponse};

/// Most pages of records asked of one server: far more than any server's files (a page holds
/// `RECORDS_PER_PAGE`), so that a server that always says "more" cannot keep recovery going.
const PAGES_MAX: usize = 1 << 20;

/// Runs the recovery and prints what it did.
pub async fn run(config: &Config, dir: &Path, servers: Vec<String>) -> Result<()> {
    let local = local_cluster(config.cluster.as_deref());
    let addrs = server_addresses(local.as_ref(), servers)?;
    // The servers know the admin by the key derived from the cluster secret; the manager,
    // whose store is gone, is not asked for anything.
    let secret = local.as_ref().and_then(LocalCluster::secret_path);
    let credential = crate::credentials::admin(config, secret.as_deref())?;
    let config = TcpConfig {
        connect_timeout: Duration::from_secs(3),
        request_timeout: Duration::from_secs(30),
    };
    let transport = Arc::new(TcpTransport::with_credential(
        config,
        Some(credential.for_storage()),
    ));
    let mut reports = Vec::new();
    for addr in &addrs {
        let report = ask(&transport, *addr)
            .await
            .with_context(|| format!("server {addr} did not give its records"))?;
        reports.push(report);
    }
    let mut recovered = recovery::merge(&reports)?;
    // Access keys live only in the lost store; the local cluster's own survives in its file.
    match local.as_ref().and_then(|local| local.file.key.clone()) {
        Some(text) => {
            let credential = tessera_client::parse_access_key(&text).map_err(|e| anyhow!("{e}"))?;
            let tessera_client::Claim::Client(id) = credential.claim else {
                bail!("the local cluster's key is not an access key");
            };
            recovered
                .access_keys
                .push((id, "local cluster".into(), credential.key));
            recovered.notes.push(format!(
                "access keys are not kept by servers: the local cluster's key {id} was put back; \
                 issue new keys for other clients with `tessera key create`"
            ));
        }
        None => recovered.notes.push(
            "access keys are not kept by servers: issue new keys for clients with `tessera key \
             create`"
                .into(),
        ),
    }
    let write_dir = dir.to_path_buf();
    let written = recovered.clone();
    tokio::task::spawn_blocking(move || recovery::write_store(&write_dir, &written))
        .await
        .context("the store writer failed")??;
    for note in &recovered.notes {
        eprintln!("tessera: note: {note}");
    }
    println!(
        "recovered cluster {:#x}: {} files on {} servers into {}",
        recovered.cluster,
        recovered.files.len(),
        recovered.servers.len(),
        dir.display()
    );
    Ok(())
}

/// The local cluster `--cluster` names (a directory or its `cluster.toml`), else
/// `./tessera-data`, if there is one there.
fn local_cluster(spec: Option<&str>) -> Option<LocalCluster> {
    let path = Path::new(spec.unwrap_or("tessera-data/cluster.toml"));
    let dir = if path.is_dir() {
        path
    } else {
        path.parent().unwrap_or(Path::new("."))
    };
    LocalCluster::load(dir).ok()
}

/// The servers to ask: those named, else those of the local cluster's file.
fn server_addresses(local: Option<&LocalCluster>, named: Vec<String>) -> Result<Vec<SocketAddr>> {
    let named: Vec<String> = if named.is_empty() {
        let local = local.context("no --servers given, and no cluster file to read them from")?;
        local
            .file
            .servers
            .iter()
            .map(|s| s.process.addr.clone())
            .collect()
    } else {
        named
    };
    if named.is_empty() {
        bail!("no servers to recover from");
    }
    named
        .iter()
        .map(|text| {
            text.to_socket_addrs()
                .ok()
                .and_then(|mut addrs| addrs.next())
                .ok_or_else(|| anyhow!("bad server address '{text}'"))
        })
        .collect()
}

/// One server's identity and every record it keeps.
async fn ask(transport: &Arc<TcpTransport>, addr: SocketAddr) -> Result<ServerReport> {
    let mut report = ServerReport {
        addr: addr.to_string(),
        server: None,
        incarnation: 0,
        cluster: None,
        records: Vec::new(),
        damaged: Vec::new(),
        unrecorded: Vec::new(),
        uncommitted: Vec::new(),
    };
    let mut after = 0;
    for _ in 0..PAGES_MAX {
        // The listing is answered whatever store the call names.
        let call = StorageCall {
            incarnation: 0,
            request: StorageRequest::Records { after },
            service: tessera_wire::Service::BestEffort,
        };
        let (answer, _) = tessera_transport::call::<_, StorageResponse>(
            transport as &dyn Transport,
            addr,
            &call,
            Bytes::new(),
        )
        .await?;
        let StorageResponse::Records {
            server,
            incarnation,
            cluster,
            records,
            damaged,
            unrecorded,
            uncommitted,
            more,
        } = answer
        else {
            bail!("answered {answer:?} (a server of an older build?)");
        };
        let last = records
            .iter()
            .map(|r| r.id)
            .chain(damaged.iter().copied())
            .chain(unrecorded.iter().copied())
            .max();
        (report.server, report.incarnation, report.cluster) = (server, incarnation, cluster);
        report.records.extend(records);
        report.damaged.extend(damaged);
        report.unrecorded.extend(unrecorded);
        report.uncommitted.extend(uncommitted);
        match last {
            Some(last) if more && last > after => after = last,
            _ => return Ok(report),
        }
    }
    bail!("kept saying more records follow after {PAGES_MAX} pages")
}
