//! `tessera bench --against-minio MINIO`: Tessera against MinIO at equal redundancy, side by
//! side in interleaved rounds on this machine: RAID-5 over 5 servers (4 data + 1 parity)
//! against MinIO's erasure coding over 5 drives with one parity shard (`EC:1`, 4+1).
//!
//! Both stores run here, each on its own temporary directories, started and stopped by the
//! bench (never a cluster the user named): Tessera's embedded cluster with its S3 gateway in
//! this process, and the MinIO binary given (`minio server DIR{1...5}`). Each round, for each
//! path (Tessera's client library, Tessera's gateway, MinIO), writes one object (acknowledged
//! only once durable on both: Tessera syncs before a put commits, MinIO writes with
//! fdatasync), reads it back at once (warm: the servers' page cache holds it), and, where the
//! bench runs as root, reads it again after dropping the kernel's page cache (cold). Every
//! byte read is compared (on the S3 paths as the body arrives, inside the timed read, each
//! piece against the bytes at its offset; the library's after its read). The S3 paths use
//! the same minimal client ([`crate::s3_client`]), one connection per request.

use crate::bench::EmbeddedCluster;
use crate::config::Config;
use crate::cpu_meter::{CpuMeter, CpuSnapshot};
use crate::s3_client::S3Client;
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use rand::{RngCore, SeedableRng};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tessera_client::{Client, LayoutRequest, Scheme};

const SERVERS: u32 = 5;
const STRIPE_UNIT: u32 = 256 << 10;
const BUCKET: &str = "bench";
/// How long MinIO may take to answer its readiness check.
const MINIO_START: Duration = Duration::from_secs(60);

/// The three ways an object is stored and read.
#[derive(Clone, Copy)]
enum Route {
    /// Tessera's client library (what `put` and `get` run).
    Library,
    /// Tessera's S3 gateway over the same cluster.
    Gateway,
    /// MinIO.
    Minio,
}

impl Route {
    const ALL: [Route; 3] = [Route::Library, Route::Gateway, Route::Minio];

    fn name(self) -> &'static str {
        match self {
            Route::Library => "tessera",
            Route::Gateway => "tessera-s3",
            Route::Minio => "minio",
        }
    }
}

/// MinIO serving 5 directories of a temporary directory, killed on every way out.
struct Minio {
    child: Child,
    client: S3Client,
    dir: tempfile::TempDir,
}

impl Drop for Minio {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Minio {
    async fn start(binary: &Path) -> Result<Minio> {
        let dir = tempfile::Builder::new()
            .prefix("tessera-minio-")
            .tempdir()?;
        let drives = format!("{}/d{{1...{SERVERS}}}", dir.path().display());
        let (port, console) = (free_port()?, free_port()?);
        let client = S3Client {
            addr: format!("127.0.0.1:{port}").parse()?,
            access: "tesserabench".into(),
            secret: format!("{:032x}", rand::random::<u128>()),
        };
        let log = std::fs::File::create(dir.path().join("minio.log"))?;
        let child = Command::new(binary)
            .args(["server", &drives, "--quiet"])
            .args(["--address", &format!("127.0.0.1:{port}")])
            .args(["--console-address", &format!("127.0.0.1:{console}")])
            .env("MINIO_ROOT_USER", &client.access)
            .env("MINIO_ROOT_PASSWORD", &client.secret)
            .env("MINIO_STORAGE_CLASS_STANDARD", "EC:1")
            .env("MINIO_BROWSER", "off")
            // Its drives are directories on one disk, the root one: allowed only so.
            .env("MINIO_CI_CD", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot run {}", binary.display()))?;
        let mut minio = Minio { child, client, dir };
        minio.wait_ready().await?;
        Ok(minio)
    }

    /// Waits until MinIO takes a CreateBucket (its drives formatted, its quorum up).
    async fn wait_ready(&mut self) -> Result<()> {
        let began = Instant::now();
        loop {
            let attempt = self.client.create_bucket(BUCKET).await;
            let exited = self.child.try_wait()?;
            match (attempt, exited) {
                (Ok(()), _) => return Ok(()),
                (Err(_), Some(status)) => {
                    bail!(
                        "MinIO exited ({status}) before it served: {}",
                        self.last_log_line()
                    )
                }
                (Err(e), None) if began.elapsed() > MINIO_START => {
                    let last = self.last_log_line();
                    bail!("MinIO not ready after {MINIO_START:?}: {e:#} (log: {last})");
                }
                (Err(_), None) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    fn last_log_line(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("minio.log")).unwrap_or_default();
        log.lines().last().unwrap_or("no output").to_string()
    }
}

/// Tessera's gateway over the embedded cluster, in this process.
async fn start_gateway(client: Client) -> Result<S3Client> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let keys = tessera_s3::Keys::generate();
    let s3 = S3Client {
        addr,
        access: keys.access.clone(),
        secret: keys.secret.clone(),
    };
    let defaults = layout();
    let gateway = tessera_s3::Gateway::new(client, defaults);
    tokio::spawn(tessera_s3::serve(listener, gateway, keys, None));
    s3.create_bucket(BUCKET).await?;
    Ok(s3)
}

fn layout() -> LayoutRequest {
    LayoutRequest {
        scheme: Scheme::Raid5,
        stripe_unit: STRIPE_UNIT,
        width: Some(SERVERS),
    }
}

/// Drops the kernel's clean page cache (root only): what makes a read cold.
fn drop_caches() -> Result<()> {
    // SAFETY: sync takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").context("drop the page cache")
}

/// The three groups of processes whose CPU is counted: this one (the client library, the
/// gateway and the bench's S3 client), Tessera's daemons (servers and manager), MinIO.
const CPU_PARTS: [&str; 3] = ["here", "daemons", "minio"];

/// Records the CPU seconds per GiB each of [`CPU_PARTS`] spent since `before` on `bytes`,
/// as `"{key} cpu {part}"`.
fn record_cpu(
    meter: &CpuMeter,
    before: CpuSnapshot,
    bytes: usize,
    key: &str,
    samples: &mut Samples,
) -> Result<()> {
    let spent = meter.per_gib_since(&before, bytes as u64)?;
    for (part, spent) in CPU_PARTS.iter().zip(spent) {
        samples
            .entry(format!("{key} cpu {part}"))
            .or_default()
            .push(spent);
    }
    Ok(())
}

fn mb_s(bytes: usize, start: Instant) -> f64 {
    bytes as f64 / 1e6 / start.elapsed().as_secs_f64().max(1e-9)
}

/// MB/s of each (path, workload), one sample per round.
type Samples = BTreeMap<String, Vec<f64>>;

struct Stores {
    library: Client,
    gateway: S3Client,
    minio: S3Client,
    cold: bool,
    meter: CpuMeter,
}

impl Stores {
    /// The S3 endpoint of an S3 route; `None` for the library.
    fn s3(&self, route: Route) -> Option<&S3Client> {
        match route {
            Route::Library => None,
            Route::Gateway => Some(&self.gateway),
            Route::Minio => Some(&self.minio),
        }
    }

    async fn write(&self, route: Route, key: &str, data: &Bytes) -> Result<()> {
        match self.s3(route) {
            Some(s3) => s3.put(BUCKET, key, data.clone()).await,
            // As `put` writes: a pending file, synced as it is filled, then committed with
            // its size (its full stripes take no stale-parity records: a pending file is
            // discarded whole if its writer dies).
            None => {
                let name = format!("{BUCKET}/{key}");
                let (_, open) = self.library.create_pending_open(&name, layout()).await?;
                let mut open = open.sync_ahead();
                self.library.upload_bytes(&mut open, 0, data).await?;
                Ok(self.library.commit_upload(&open).await?)
            }
        }
    }

    /// Reads `key` by `route`, checking each piece against `data` as it arrives (all three
    /// routes alike; no copy of the whole object after its last byte).
    async fn read(&self, route: Route, key: &str, data: &Bytes) -> Result<()> {
        match self.s3(route) {
            Some(s3) => s3.get_checked(BUCKET, key, data).await,
            // As `get` reads: one open (size and layout come with it), then the chunks,
            // written from the servers' answers as they came (here into the check).
            None => {
                let open = self.library.open_file(&format!("{BUCKET}/{key}")).await?;
                let mut sink = CheckedSink {
                    expected: data,
                    at: 0,
                };
                let size = open.size();
                (self.library)
                    .download(&open, 0, size, &mut sink, None, &mut |_| {})
                    .await?;
                if sink.at != data.len() {
                    bail!(
                        "{key}: {} bytes read where {} were written",
                        sink.at,
                        data.len()
                    );
                }
                Ok(())
            }
        }
    }

    async fn remove(&self, route: Route, key: &str) -> Result<()> {
        match self.s3(route) {
            Some(s3) => s3.delete(BUCKET, key).await,
            None => Ok(self.library.remove(&format!("{BUCKET}/{key}")).await?),
        }
    }

    /// Reads `key` by `route`, checks every byte, and counts the speed as `workload`.
    async fn timed_read(
        &self,
        route: Route,
        key: &str,
        data: &Bytes,
        s: &mut Samples,
        workload: &str,
    ) -> Result<()> {
        let (cpu, start) = (self.meter.snapshot()?, Instant::now());
        self.read(route, key, data).await?;
        let speed = mb_s(data.len(), start);
        let path = route.name();
        let sample = format!("{path} {workload}");
        record_cpu(&self.meter, cpu, data.len(), &sample, s)?;
        s.entry(sample).or_default().push(speed);
        Ok(())
    }

    /// One round: each path writes, reads warm and (as root) cold, in turn, the paths in an
    /// order that rotates from round to round (none always runs first or after the same one).
    async fn round(&self, n: usize, data: &Bytes, s: &mut Samples) -> Result<()> {
        let mut order = Route::ALL;
        order.rotate_left(n % Route::ALL.len());
        for route in order {
            let key = format!("{}-{n}", route.name());
            let (cpu, start) = (self.meter.snapshot()?, Instant::now());
            self.write(route, &key, data).await?;
            let sample = format!("{} write", route.name());
            s.entry(sample.clone())
                .or_default()
                .push(mb_s(data.len(), start));
            record_cpu(&self.meter, cpu, data.len(), &sample, s)?;
            self.timed_read(route, &key, data, s, "warm read").await?;
            if self.cold {
                drop_caches()?;
                self.timed_read(route, &key, data, s, "cold read").await?;
            }
            self.remove(route, &key).await?;
        }
        Ok(())
    }
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    sorted[sorted.len() / 2]
}

fn report(samples: &Samples, cold: bool) {
    println!(
        "{:<10} {:>13} {:>13} {:>11} {:>9} {:>9}",
        "", "tessera MB/s", "gateway MB/s", "minio MB/s", "tessera", "gateway"
    );
    let workloads: &[&str] = if cold {
        &["write", "warm read", "cold read"]
    } else {
        &["write", "warm read"]
    };
    for workload in workloads {
        let m = |path: &str| median(&samples[&format!("{path} {workload}")]);
        let [t, g, minio] = Route::ALL.map(|route| m(route.name()));
        println!(
            "{workload:<10} {t:>13.1} {g:>13.1} {minio:>11.1} {:>8.2}x {:>8.2}x",
            t / minio,
            g / minio
        );
    }
    println!(
        "\nCPU-s per GiB (median; this process + Tessera's daemons + MinIO): \
         tessera, gateway, minio"
    );
    for workload in workloads {
        let cells = Route::ALL.map(|route| {
            let parts = CPU_PARTS
                .map(|part| median(&samples[&format!("{} {workload} cpu {part}", route.name())]));
            let total: f64 = parts.iter().sum();
            format!(
                "{total:.2} ({:.2} + {:.2} + {:.2})",
                parts[0], parts[1], parts[2]
            )
        });
        println!(
            "{workload:<10} {:>26} {:>26} {:>26}",
            cells[0], cells[1], cells[2]
        );
    }
    if !cold {
        println!("cold reads left out: dropping the page cache needs root");
    }
}

/// `(quick, object_size)`: a shorter run, and the size of each object if not the default.
pub async fn run(
    config: &Config,
    minio: &Path,
    (quick, object_size): (bool, Option<u64>),
    json: Option<PathBuf>,
) -> Result<()> {
    if !minio.is_file() {
        bail!("no MinIO binary at {}", minio.display());
    }
    let (size, rounds) = if quick { (64 << 20, 3) } else { (256 << 20, 5) };
    let size: usize = match object_size {
        None => size,
        Some(0) => bail!("--object-size must be at least one byte"),
        Some(bytes) => usize::try_from(bytes)
            .ok()
            .filter(|&b| b <= 16 << 30)
            .ok_or_else(|| anyhow::anyhow!("--object-size {bytes} is over 16 GiB"))?,
    };
    let embedded = EmbeddedCluster::start(config, SERVERS).await?;
    let library = embedded.cluster.client(config).await?;
    library.make_dir(BUCKET).await.ok();
    let gateway = start_gateway(embedded.cluster.client(config).await?).await?;
    let peer = Minio::start(minio).await?;
    // SAFETY: geteuid only reads the process's credentials.
    let cold = unsafe { libc::geteuid() } == 0;
    let daemons = embedded.cluster.daemon_pids();
    let meter = CpuMeter::new(vec![
        vec![std::process::id()],
        daemons,
        vec![peer.child.id()],
    ]);
    let stores = Stores {
        library,
        gateway,
        minio: peer.client.clone(),
        cold,
        meter,
    };
    eprintln!(
        "bench --against-minio: RAID-5 over {SERVERS} servers ({} KiB units) against MinIO EC:1 \
         over {SERVERS} drives, {rounds} rounds of one {} MiB object per path",
        STRIPE_UNIT >> 10,
        size >> 20
    );
    let mut data = vec![0u8; size];
    rand::rngs::StdRng::seed_from_u64(0x6d696e696f).fill_bytes(&mut data);
    let data = Bytes::from(data);
    let mut samples = Samples::new();
    for n in 0..rounds {
        stores.round(n, &data, &mut samples).await?;
        eprintln!("bench --against-minio: round {} of {rounds} done", n + 1);
    }
    report(&samples, cold);
    if let Some(path) = json {
        std::fs::write(&path, serde_json::to_string_pretty(&samples)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    drop(peer);
    Ok(())
}

/// Where the library route's read writes: each piece compared with the bytes written at its
/// offset as it arrives, as the S3 routes check their bodies.
struct CheckedSink<'a> {
    expected: &'a [u8],
    at: usize,
}

impl std::io::Write for CheckedSink<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let end = self.at + buf.len();
        if self.expected.get(self.at..end) != Some(buf) {
            let at = self.at;
            return Err(std::io::Error::other(format!(
                "read back wrong within bytes {at}..{end}"
            )));
        }
        self.at = end;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::CheckedSink;
    use std::io::Write;

    #[test]
    fn the_checked_sink_takes_the_bytes_written_and_refuses_any_other() {
        let expected: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        let mut sink = CheckedSink {
            expected: &expected,
            at: 0,
        };
        sink.write_all(&expected[..300]).expect("the first bytes");
        sink.write_all(&expected[300..]).expect("the rest");
        assert_eq!(sink.at, expected.len());
        let mut flipped = expected.clone();
        flipped[700] ^= 1;
        let mut sink = CheckedSink {
            expected: &expected,
            at: 0,
        };
        sink.write_all(&flipped[..500]).expect("the first bytes");
        let error = sink.write_all(&flipped[500..]).expect_err("a flipped byte");
        assert!(error.to_string().contains("500..1000"), "{error}");
        // Nothing past the end either.
        let mut sink = CheckedSink {
            expected: &expected,
            at: 0,
        };
        sink.write_all(&expected).expect("all of it");
        assert!(sink.write_all(&[0]).is_err(), "a byte past the end");
    }
}
