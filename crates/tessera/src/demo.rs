//! `tessera demo`: the main job on an embedded cluster. Store a file with every scheme, lose a
//! server, read everything back degraded, write while degraded, bring the server back, rebuild
//! it, scrub, check every byte again, and print what happened.

use crate::bench::{read_all, write_all, EmbeddedCluster};
use crate::config::Config;
use anyhow::{bail, Result};
use rand::{RngCore, SeedableRng};
use std::time::Instant;
use tessera_client::{ClientError, LayoutRequest, Scheme};

const SERVERS: u32 = 5;
const LOST_SERVER: u32 = 3;
/// An awkward size: not a multiple of anything.
const FILE_BYTES: usize = (24 << 20) + 12_345;

struct Line {
    scheme: Scheme,
    write_mb_s: f64,
    read_mb_s: f64,
    overhead: f64,
    degraded: String,
}

pub async fn run(config: &Config) -> Result<()> {
    println!("starting a local cluster of {SERVERS} servers in a temporary directory");
    let mut embedded = EmbeddedCluster::start(config, SERVERS).await?;
    let client = embedded.cluster.client(config).await?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(2026);
    let mut models = Vec::new();
    let mut lines = Vec::new();
    for scheme in Scheme::ALL {
        let mut data = vec![0u8; FILE_BYTES];
        rng.fill_bytes(&mut data);
        let path = format!("demo/{}", scheme.name());
        let file = client
            .create(
                &path,
                LayoutRequest {
                    scheme,
                    stripe_unit: 64 << 10,
                    width: None,
                },
            )
            .await?;
        let start = Instant::now();
        // Written and synced.
        write_all(&client, &file, &data).await?;
        let write_mb_s = FILE_BYTES as f64 / 1e6 / start.elapsed().as_secs_f64();
        let start = Instant::now();
        let back = read_all(&client, &file, FILE_BYTES as u64).await?;
        let read_mb_s = FILE_BYTES as f64 / 1e6 / start.elapsed().as_secs_f64();
        if back != data {
            bail!("{scheme}: read back differs from what was written");
        }
        let overhead = client.stat(&path).await?.stored_bytes as f64 / FILE_BYTES as f64;
        println!(
            "stored {path}: {} bytes, {write_mb_s:.0} MB/s write, {read_mb_s:.0} MB/s read",
            FILE_BYTES
        );
        lines.push(Line {
            scheme,
            write_mb_s,
            read_mb_s,
            overhead,
            degraded: String::new(),
        });
        models.push((file, data));
    }

    println!("stopping server {LOST_SERVER} (killed, as in a crash)");
    embedded.cluster.stop_server(LOST_SERVER)?;
    for (line, (file, data)) in lines.iter_mut().zip(&models) {
        line.degraded = match read_all(&client, file, FILE_BYTES as u64).await {
            Ok(back) if &back == data => "ok".into(),
            Ok(_) => bail!("{}: degraded read returned wrong bytes", line.scheme),
            Err(e) if line.scheme == Scheme::Raid0 => {
                let unavailable = e
                    .downcast_ref::<ClientError>()
                    .is_some_and(|e| matches!(e, ClientError::Unavailable { .. }));
                if !unavailable {
                    bail!("raid0: expected 'unavailable', got: {e}");
                }
                println!("raid0 read refused, as it must be: {e}");
                "refused (no redundancy)".into()
            }
            Err(e) => bail!("{}: degraded read failed: {e}", line.scheme),
        };
    }
    println!("writing while degraded");
    for (file, data) in models
        .iter_mut()
        .filter(|(f, _)| !f.path.ends_with("raid0"))
    {
        let (offset, len) = (100_000usize, 300_000usize);
        let mut patch = vec![0u8; len];
        rng.fill_bytes(&mut patch);
        client.write_at(file, offset as u64, &patch).await?;
        data[offset..offset + len].copy_from_slice(&patch);
        let back = read_all(&client, file, FILE_BYTES as u64).await?;
        if &back != data {
            bail!("{}: degraded write did not read back", file.path);
        }
    }
    println!("restarting server {LOST_SERVER}");
    embedded.cluster.start_server(LOST_SERVER)?;
    embedded.cluster.wait_all_up(config).await?;
    let state = client.status().await?;
    let me = state
        .iter()
        .find(|s| s.id == LOST_SERVER)
        .map(|s| s.state.name())
        .unwrap_or("?");
    println!("server {LOST_SERVER} is back and {me}: it serves nothing it missed until rebuilt");
    for (file, data) in &models[1..] {
        if &read_all(&client, file, FILE_BYTES as u64).await? != data {
            bail!("{}: stale read after restart", file.path);
        }
    }
    let start = Instant::now();
    // Clearing a server's debt is the admin's: the demo runs the cluster, so it has the secret.
    let admin = embedded.cluster.admin_client(config).await?;
    let rebuilt = admin.rebuild(LOST_SERVER, |_| {}).await?;
    println!(
        "rebuilt server {LOST_SERVER}: {} stripes in {} files in {:.2} s",
        rebuilt.stripes_done,
        rebuilt.files_total,
        start.elapsed().as_secs_f64()
    );
    let report = client.scrub(None).await?;
    println!(
        "scrub: {} stripes checked, {} corrupt, {} parity and {} mirror mismatches repaired, {} unrepairable",
        report.stripes_checked,
        report.corrupt_repaired,
        report.parity_repaired,
        report.mirrors_repaired,
        report.unrepairable.len()
    );
    if report.corrupt_repaired + report.parity_repaired + report.mirrors_repaired > 0
        || !report.unrepairable.is_empty()
    {
        bail!("scrub found damage after a clean rebuild");
    }
    for (file, data) in &models {
        if &read_all(&client, file, FILE_BYTES as u64).await? != data {
            bail!("{}: wrong bytes after rebuild", file.path);
        }
    }
    println!("every file reads back byte for byte after the rebuild\n");
    println!(
        "{:<7} {:>11} {:>10} {:>9}  degraded read",
        "scheme", "write MB/s", "read MB/s", "overhead"
    );
    for l in &lines {
        println!(
            "{:<7} {:>11.0} {:>10.0} {:>9.2}  {}",
            l.scheme.name(),
            l.write_mb_s,
            l.read_mb_s,
            l.overhead,
            l.degraded
        );
    }
    drop(client);
    drop(embedded);
    println!("\ncluster stopped");
    Ok(())
}
