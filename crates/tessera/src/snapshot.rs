//! `tessera snapshot create|ls|rm` and `get`/`read --snapshot NAME`: copy-on-write
//! snapshots of files (the design is in `tessera-store`'s `snapshot` module).

use crate::commands::{connect, open_output};
use crate::config::Config;
use anyhow::Result;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum SnapshotAction {
    /// Take snapshot NAME of every file whose path starts with PREFIX (default: all). No
    /// data is copied now: each server copies a block before its first overwrite.
    Create {
        name: String,
        #[arg(default_value = "")]
        prefix: String,
    },
    /// List the snapshots.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Remove snapshot NAME and free the copies only it needed.
    Rm { name: String },
}

pub async fn run(config: &Config, action: SnapshotAction) -> Result<()> {
    let client = connect(config)?;
    match action {
        SnapshotAction::Create { name, prefix } => {
            let began = std::time::Instant::now();
            let info = client.snapshot_create(&name, &prefix).await?;
            eprintln!(
                "snapshot {} (epoch {}): {} files, {} bytes, taken in {:.1} ms",
                info.name,
                info.epoch,
                info.file_count,
                info.bytes,
                began.elapsed().as_secs_f64() * 1e3
            );
        }
        SnapshotAction::Ls { json } => {
            let all = client.snapshot_list().await?;
            if json {
                let list: Vec<_> = all
                    .iter()
                    .map(|s| {
                        serde_json::json!({"name": s.name, "epoch": s.epoch, "prefix": s.prefix,
                            "ready": s.ready, "files": s.file_count, "bytes": s.bytes})
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&list)?);
            }
            for s in all.iter().filter(|_| !json) {
                let state = if s.ready { "" } else { "  (incomplete)" };
                println!(
                    "{:<20} {:>6} files {:>14} bytes  {:?}{state}",
                    s.name, s.file_count, s.bytes, s.prefix
                );
            }
        }
        SnapshotAction::Rm { name } => {
            let removed = client.snapshot_remove(&name).await?;
            if !removed.unreachable.is_empty() {
                eprintln!(
                    "servers {:?} were not reached: they keep their copies of its files",
                    removed.unreachable
                );
            }
        }
    }
    Ok(())
}

/// `get`/`read --snapshot NAME`: LENGTH bytes (all, with none) at OFFSET of REMOTE as
/// snapshot NAME holds it.
pub async fn read(
    config: &Config,
    name: &str,
    remote: &str,
    offset: u64,
    length: Option<u64>,
    local: &str,
) -> Result<()> {
    let client = connect(config)?;
    let handle = client.snapshot_open(name, remote).await?;
    let end = match length {
        Some(length) => offset.saturating_add(length).min(handle.size()),
        None => handle.size(),
    };
    let mut out = open_output(local)?;
    let want = end.saturating_sub(offset);
    let copied: Result<()> = async {
        let got = client
            .snapshot_download(&handle, offset, want, &mut out, &mut |_| {})
            .await?;
        anyhow::ensure!(got == want, "short read: {got} of {want} bytes");
        Ok(())
    }
    .await;
    if copied.is_err() && local != "-" && length.is_none() {
        drop(out);
        let _ = std::fs::remove_file(local);
    }
    copied
}
