//! `tessera bench --mount`: sequential throughput through a FUSE mount (`tessera mount`)
//! against the client library's transfer API (what `put` and `get` run, without starting a
//! process), side by side in interleaved rounds on an embedded cluster of its own.
//!
//! Each round writes one file through the mount (1 MiB `write`s, then `fsync`) and one with
//! the library (upload, then sync), then reads each with the *other* path: the mount reads
//! the library's file and the library the mount's, so neither read finds the bytes in a
//! cache of its own (the servers' page cache serves both alike). Every byte is checked.
//!
//! Where `fio` is installed (Debian package `fio`), each round also runs it through the mount:
//! a sequential write (1 MiB blocks, `psync`, fsync at the end) of a file the library then
//! reads back and checks (fio writes a known pattern), and a sequential read of that file.
//! Its speeds are fio's own (its job's bytes over its run, the final fsync included; not
//! the process's start, which takes about 0.4 s here).

use crate::bench::{read_all, write_all, EmbeddedCluster};
use crate::config::Config;
use anyhow::{bail, Context, Result};
use rand::{RngCore, SeedableRng};
use serde::Serialize;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;
use tessera_client::{Client, LayoutRequest, Scheme};

const SERVERS: u32 = 5;
const STRIPE_UNIT: &str = "64K";
/// The size of each `write` and `read` through the mount (what `dd bs=1M` or fio would use).
const BLOCK: usize = 1 << 20;

#[derive(Serialize, Default)]
struct Samples {
    mount_write: Vec<f64>,
    library_write: Vec<f64>,
    mount_read: Vec<f64>,
    library_read: Vec<f64>,
    fio_write: Vec<f64>,
    fio_read: Vec<f64>,
}

/// What fio writes, repeated: the library checks the file fio wrote against it.
const FIO_PATTERN: &[u8] = b"tessera!";

fn fio_available() -> bool {
    Command::new("fio")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Runs one sequential fio job (`write` or `read`) of `size` bytes on `path`; MB/s as fio
/// measured it.
fn fio(path: &Path, rw: &str, size: usize) -> Result<f64> {
    let out = Command::new("fio")
        .arg(format!("--name={rw}"))
        .arg(format!("--filename={}", path.display()))
        .arg(format!("--rw={rw}"))
        .args(["--bs=1M", "--ioengine=psync", "--end_fsync=1"])
        .arg(format!("--size={size}"))
        .arg("--output-format=json")
        .arg(format!(
            "--buffer_pattern=\"{}\"",
            String::from_utf8_lossy(FIO_PATTERN)
        ))
        .stdin(Stdio::null())
        .output()
        .context("cannot run fio")?;
    if !out.status.success() {
        bail!(
            "fio --rw={rw} {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("fio's JSON report")?;
    let job = &report["jobs"][0][rw];
    match (job["bw_bytes"].as_f64(), job["io_bytes"].as_u64()) {
        (Some(bw), Some(bytes)) if bytes == size as u64 => Ok(bw / 1e6),
        _ => bail!("fio --rw={rw}: no bandwidth for {size} bytes in its report"),
    }
}

/// fio's write of `name` through the mount, the library's check of it, fio's read of it.
async fn fio_round(
    client: &Client,
    mnt: &Path,
    name: &str,
    size: usize,
    s: &mut Samples,
) -> Result<()> {
    s.fio_write.push(fio(&mnt.join(name), "write", size)?);
    let file = client.open(name).await?;
    let back = read_all(client, &file, size as u64).await?;
    let expected = FIO_PATTERN.iter().cycle().take(size);
    if back.len() != size || !back.iter().eq(expected) {
        bail!("{name}: the bytes fio wrote through the mount read back wrong");
    }
    s.fio_read.push(fio(&mnt.join(name), "read", size)?);
    client.remove(name).await?;
    Ok(())
}

/// The mount, unmounted on every way out.
struct Mount(PathBuf);

impl Mount {
    fn start(cluster_file: &Path, mountpoint: &Path) -> Result<Mount> {
        std::fs::create_dir_all(mountpoint)?;
        let exe = std::env::current_exe().context("cannot find the tessera binary")?;
        let out = Command::new(exe)
            .arg("--cluster")
            .arg(cluster_file)
            .arg("mount")
            .arg(mountpoint)
            .args(["--scheme", "raid5", "--stripe-unit", STRIPE_UNIT])
            .stdin(Stdio::null())
            .output()
            .context("cannot run tessera mount")?;
        if !out.status.success() {
            bail!(
                "tessera mount: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(Mount(mountpoint.to_path_buf()))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Err(e) = crate::mount::unmount(&self.0) {
            eprintln!("bench: cannot unmount {}: {e:#}", self.0.display());
        }
    }
}

fn mb_s(bytes: usize, start: Instant) -> f64 {
    bytes as f64 / 1e6 / start.elapsed().as_secs_f64().max(1e-9)
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    sorted[sorted.len() / 2]
}

fn mount_write(path: &Path, data: &[u8]) -> Result<f64> {
    let start = Instant::now();
    let mut file = std::fs::File::create(path)?;
    for block in data.chunks(BLOCK) {
        file.write_all(block)?;
    }
    file.sync_all()?;
    Ok(mb_s(data.len(), start))
}

fn mount_read(path: &Path, data: &[u8], back: &mut [u8]) -> Result<f64> {
    let start = Instant::now();
    let mut file = std::fs::File::open(path)?;
    for block in back.chunks_mut(BLOCK) {
        file.read_exact(block)?;
    }
    let speed = mb_s(data.len(), start);
    if back != data {
        bail!("{}: bytes read through the mount differ", path.display());
    }
    Ok(speed)
}

async fn library_write(client: &Client, path: &str, data: &[u8]) -> Result<f64> {
    let layout = LayoutRequest {
        scheme: Scheme::Raid5,
        stripe_unit: 64 << 10,
        width: None,
    };
    let start = Instant::now();
    let file = client.create(path, layout).await?;
    write_all(client, &file, data).await?;
    Ok(mb_s(data.len(), start))
}

async fn library_read(client: &Client, path: &str, data: &[u8]) -> Result<f64> {
    let start = Instant::now();
    let file = client.open(path).await?;
    let back = read_all(client, &file, data.len() as u64).await?;
    let speed = mb_s(data.len(), start);
    if back != data {
        bail!("{path}: bytes read with the library differ");
    }
    Ok(speed)
}

/// One round: both writes, then each file read by the other path; then fio's, if it runs.
async fn round(
    client: &Client,
    mnt: &Path,
    n: usize,
    data: &[u8],
    with_fio: bool,
    s: &mut Samples,
) -> Result<()> {
    let mut back = vec![0u8; data.len()];
    let (by_mount, by_library) = (format!("m{n}"), format!("l{n}"));
    s.mount_write.push(mount_write(&mnt.join(&by_mount), data)?);
    s.library_write
        .push(library_write(client, &by_library, data).await?);
    s.mount_read
        .push(mount_read(&mnt.join(&by_library), data, &mut back)?);
    s.library_read
        .push(library_read(client, &by_mount, data).await?);
    client.remove(&by_mount).await?;
    client.remove(&by_library).await?;
    if with_fio {
        fio_round(client, mnt, &format!("f{n}"), data.len(), s).await?;
    }
    Ok(())
}

pub async fn run(config: &Config, quick: bool, json: Option<PathBuf>) -> Result<()> {
    let embedded = EmbeddedCluster::start(config, SERVERS).await?;
    let cluster = &embedded.cluster;
    let client = cluster.client(config).await?;
    let dir = tempfile::Builder::new().prefix("tessera-mnt-").tempdir()?;
    let cluster_file = crate::cluster::LocalCluster::cluster_file(&cluster.dir);
    let mount = Mount::start(&cluster_file, &dir.path().join("mnt"))?;
    let (size, rounds) = if quick { (64 << 20, 3) } else { (256 << 20, 5) };
    eprintln!(
        "bench --mount: {SERVERS} servers, raid5 {STRIPE_UNIT}, {rounds} rounds of {} MiB \
         through the mount ({} KiB writes and reads) and through the library",
        size >> 20,
        BLOCK >> 10
    );
    let mut data = vec![0u8; size];
    rand::rngs::StdRng::seed_from_u64(0x6d6f756e74).fill_bytes(&mut data);
    let mut samples = Samples::default();
    let with_fio = fio_available();
    for n in 0..rounds {
        round(&client, &mount.0, n, &data, with_fio, &mut samples).await?;
        eprintln!("bench --mount: round {} of {rounds} done", n + 1);
    }
    let (mw, lw) = (median(&samples.mount_write), median(&samples.library_write));
    let (mr, lr) = (median(&samples.mount_read), median(&samples.library_read));
    println!(
        "{:<6} {:>12} {:>12} {:>8}",
        "", "mount MB/s", "library MB/s", "ratio"
    );
    println!("{:<6} {mw:>12.1} {lw:>12.1} {:>8.2}", "write", mw / lw);
    println!("{:<6} {mr:>12.1} {lr:>12.1} {:>8.2}", "read", mr / lr);
    if samples.fio_write.is_empty() {
        println!("fio not found: its rows are left out (apt-get install fio)");
    } else {
        let (fw, fr) = (median(&samples.fio_write), median(&samples.fio_read));
        println!("{:<6} {fw:>12.1} {lw:>12.1} {:>8.2}", "fio w", fw / lw);
        println!("{:<6} {fr:>12.1} {lr:>12.1} {:>8.2}", "fio r", fr / lr);
    }
    if let Some(path) = json {
        std::fs::write(&path, serde_json::to_string_pretty(&samples)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    drop(mount);
    Ok(())
}
