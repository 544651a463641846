//! What the measurement client does: jobs in, reports out, both JSON.
//!
//! The lab runs `tessera lab-client --job JSON` inside the client's namespace (see
//! [`crate::cluster::Cluster::run_job`]); that command connects a
//! [`tessera_client::Client`] with the transport it is told to use and calls [`run`], which
//! does the job and returns the [`ClientReport`] it prints. Timing happens here, inside the
//! client, around the client library's calls only.

use crate::net::HOST_INTERFACE;
use crate::probe::CpuTimes;
use crate::LabError;
use futures::stream::StreamExt;
use rand::{RngCore, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tessera_client::{Client, LayoutRequest, OpenFile, Scheme, ServerState};

/// Largest file a job may make; its bytes are held in the client's memory.
pub const FILE_BYTES_MAX: u64 = 1 << 30;
/// Most timed repetitions of one measurement.
pub const REPETITIONS_MAX: u32 = 1000;
/// Most timed reads of one [`ClientJob::SyncReads`].
pub const SYNC_READS_MAX: u32 = 100_000;
/// How often a wait asks the manager.
const STATUS_POLL: Duration = Duration::from_millis(100);

/// One file a job works on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSpec {
    /// Its path in the cluster.
    pub path: String,
    /// Its scheme.
    pub scheme: Scheme,
    /// Its stripe unit (one "block" in Swift/RAID's terms).
    pub stripe_unit_bytes: u32,
    /// Its size.
    pub bytes: u64,
    /// Seed of its contents.
    pub seed: u64,
    /// Servers it is striped over (all of the cluster's if `None`).
    #[serde(default)]
    pub width: Option<u32>,
}

impl FileSpec {
    /// Its contents: the same bytes for the same seed and size.
    pub fn contents(&self) -> Vec<u8> {
        assert!(self.bytes <= FILE_BYTES_MAX, "file of {} bytes", self.bytes);
        let mut data = vec![0u8; self.bytes as usize];
        rand::rngs::StdRng::seed_from_u64(self.seed).fill_bytes(&mut data);
        data
    }
}

/// A timed operation on a whole file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Overwrite the whole file (it exists, as Swift/RAID's files were preallocated).
    Write,
    /// Read the whole file.
    Read,
}

impl Op {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::Read => "read",
        }
    }
}

/// Work for the measurement client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "job", rename_all = "snake_case")]
pub enum ClientJob {
    /// Wait until the manager reports servers `up` as up and `down` as down.
    WaitServers {
        /// Ids that must be up.
        up: Vec<u32>,
        /// Ids that must be down.
        down: Vec<u32>,
        /// Give up after this long.
        timeout_ms: u64,
    },
    /// Create each file (replacing any of that path) and write its contents.
    Prepare {
        /// The files.
        files: Vec<FileSpec>,
    },
    /// Per repetition, for each file, each op in order, timed; after the last read of each
    /// file, compare its bytes with the contents written.
    Measure {
        /// The files, already prepared.
        files: Vec<FileSpec>,
        /// The ops.
        ops: Vec<Op>,
        /// Repetitions.
        repetitions: u32,
    },
    /// Read the prepared `file` one block of `block_bytes` at a time (a whole stripe: one
    /// request to each of its servers, sent together), block after block, wrapping around
    /// the file: the synchronized reads of TCP incast. With `read_ahead` 1 every block is
    /// awaited whole before the next is asked for, as in the paper; with more, the client's
    /// read-ahead keeps that many blocks in flight (`Client::read_blocks`).
    /// One untimed read of the first block comes first (connections, and a first check of
    /// the bytes); then `reads` timed ones, the last of which is checked too.
    SyncReads {
        /// The file, prepared, a whole number of blocks long.
        file: FileSpec,
        /// Bytes of one block.
        block_bytes: u64,
        /// Timed reads.
        reads: u32,
        /// Blocks in flight at once (1 in jobs written before there was a choice).
        #[serde(default = "one_block")]
        read_ahead: u32,
    },
    /// Create, write, read back and compare, remove: the smoke test.
    Check {
        /// The file.
        file: FileSpec,
    },
    /// Write one rated stream ([`crate::stream`]); the binary runs it with
    /// [`crate::stream::run`], which makes the clients the stream's pacing asks for.
    Stream(crate::stream::StreamJob),
}

fn one_block() -> u32 {
    1
}

impl ClientJob {
    /// The job's kind, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            ClientJob::WaitServers { .. } => "wait_servers",
            ClientJob::Prepare { .. } => "prepare",
            ClientJob::Measure { .. } => "measure",
            ClientJob::SyncReads { .. } => "sync_reads",
            ClientJob::Check { .. } => "check",
            ClientJob::Stream(_) => "stream",
        }
    }
}

/// One timed operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// The file.
    pub path: String,
    /// The op.
    pub op: Op,
    /// Bytes of the file moved (user bytes: no parity).
    pub bytes: u64,
    /// How long it took.
    pub seconds: f64,
    /// Share of the machine's CPU time that was busy meanwhile, 0..=1.
    pub cpu_busy: f64,
    /// Bytes of frames the client's interface received meanwhile (as `tbf` counts them:
    /// headers, parity, requests and all), if its counters could be read.
    #[serde(default)]
    pub link_rx_bytes: Option<u64>,
    /// Bytes of frames it sent meanwhile.
    #[serde(default)]
    pub link_tx_bytes: Option<u64>,
}

impl Sample {
    /// User bytes per second.
    pub fn bytes_per_s(&self) -> f64 {
        self.bytes as f64 / self.seconds.max(1e-9)
    }

    /// Bytes of the busier direction of the client's link, if measured.
    pub fn link_bytes(&self) -> Option<u64> {
        Some(self.link_rx_bytes?.max(self.link_tx_bytes?))
    }
}

/// Transport counters by name (the datagram endpoint's statistics).
pub type Counters = BTreeMap<String, u64>;

/// What [`ClientJob::SyncReads`] measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyncReadsSample {
    /// Timed reads.
    pub reads: u32,
    /// Bytes of one block.
    pub block_bytes: u64,
    /// User bytes the timed reads returned.
    pub bytes: u64,
    /// How long the timed reads took.
    pub seconds: f64,
    /// Median time of one read, in microseconds.
    pub read_us_median: f64,
    /// 99th percentile of the time of one read, in microseconds.
    pub read_us_p99: f64,
    /// Longest read, in microseconds.
    pub read_us_max: f64,
    /// Share of the machine's CPU time that was busy meanwhile, 0..=1.
    pub cpu_busy: f64,
    /// The part of it spent in the kernel, 0..=1 of all CPU time.
    #[serde(default)]
    pub cpu_kernel: f64,
    /// Bytes of frames the client's interface received meanwhile, if readable.
    pub link_rx_bytes: Option<u64>,
    /// Bytes of frames it sent meanwhile.
    pub link_tx_bytes: Option<u64>,
    /// Blocks whose bytes were compared with the file's contents (and matched).
    pub verified_blocks: u32,
    /// Each server's transport counters before the first (untimed) read.
    pub server_counters_before: Vec<(u32, Counters)>,
    /// And after the last.
    pub server_counters_after: Vec<(u32, Counters)>,
    /// The client's own transport counters before the first read.
    pub client_counters_before: Counters,
    /// And after the last.
    pub client_counters_after: Counters,
}

impl SyncReadsSample {
    /// User bytes per second.
    pub fn bytes_per_s(&self) -> f64 {
        self.bytes as f64 / self.seconds.max(1e-9)
    }
}

/// Bytes received and sent so far by the interface of the namespace this runs in
/// (`ip netns exec` shows the namespace's own `/sys/class/net`).
fn link_counters() -> Option<(u64, u64)> {
    let read = |name: &str| -> Option<u64> {
        let path = format!("/sys/class/net/{HOST_INTERFACE}/statistics/{name}");
        std::fs::read_to_string(path).ok()?.trim().parse().ok()
    };
    Some((read("rx_bytes")?, read("tx_bytes")?))
}

/// A prepared file and where its columns are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedFile {
    /// The file.
    pub path: String,
    /// The server of each column, in column order (RAID-4's parity is the last).
    pub columns: Vec<u32>,
}

/// What the measurement client answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "report", rename_all = "snake_case")]
pub enum ClientReport {
    /// To [`ClientJob::WaitServers`]: the servers as the manager last reported them.
    Servers {
        /// Ids up.
        up: Vec<u32>,
        /// Ids down or stale.
        down: Vec<u32>,
    },
    /// To [`ClientJob::Prepare`].
    Prepared {
        /// The files.
        files: Vec<PreparedFile>,
    },
    /// To [`ClientJob::Measure`].
    Measured {
        /// Every timed op, in the order done.
        samples: Vec<Sample>,
    },
    /// To [`ClientJob::SyncReads`].
    SyncReads(SyncReadsSample),
    /// To [`ClientJob::Check`].
    Checked {
        /// The write.
        write: Sample,
        /// The read back.
        read: Sample,
    },
    /// To [`ClientJob::Stream`].
    Stream(crate::stream::StreamSample),
}

/// Do `job` with `client`; a [`ClientJob::Stream`] makes its own clients
/// ([`crate::stream::run`]) and is refused here.
pub async fn run(client: &Client, job: &ClientJob) -> Result<ClientReport, LabError> {
    match job {
        ClientJob::Stream(_) => Err(LabError::Connect(
            "a stream job makes its own clients (tessera_lab::stream::run)".into(),
        )),
        ClientJob::WaitServers {
            up,
            down,
            timeout_ms,
        } => wait_servers(client, up, down, Duration::from_millis(*timeout_ms)).await,
        ClientJob::Prepare { files } => {
            let mut prepared = Vec::with_capacity(files.len());
            for spec in files {
                let mut open = create(client, spec).await?;
                write_file(client, &mut open, &spec.contents()).await?;
                // Its size told to the manager once, and everything durable.
                client.sync_open(&mut open).await?;
                prepared.push(PreparedFile {
                    path: spec.path.clone(),
                    columns: open.meta().servers.clone(),
                });
            }
            Ok(ClientReport::Prepared { files: prepared })
        }
        ClientJob::Measure {
            files,
            ops,
            repetitions,
        } => {
            assert!(*repetitions <= REPETITIONS_MAX, "{repetitions} repetitions");
            let mut opened = Vec::with_capacity(files.len());
            for spec in files {
                let data = spec.contents();
                let back = vec![0u8; data.len()];
                opened.push((spec, client.open_file(&spec.path).await?, data, back));
            }
            let mut samples = Vec::new();
            for _ in 0..*repetitions {
                for (spec, open, data, back) in &mut opened {
                    for op in ops {
                        samples.push(timed(client, spec, open, *op, data, back).await?);
                    }
                }
            }
            for (spec, _, data, back) in &opened {
                if ops.contains(&Op::Read) && *repetitions > 0 && back != data {
                    return Err(LabError::Corrupt {
                        path: spec.path.clone(),
                    });
                }
            }
            Ok(ClientReport::Measured { samples })
        }
        ClientJob::SyncReads {
            file,
            block_bytes,
            reads,
            read_ahead,
        } => sync_reads(client, file, *block_bytes, *reads, *read_ahead).await,
        ClientJob::Check { file: spec } => {
            let mut open = create(client, spec).await?;
            let data = spec.contents();
            let mut back = vec![0u8; data.len()];
            let write = timed(client, spec, &mut open, Op::Write, &data, &mut back).await?;
            client.sync_open(&mut open).await?;
            let read = timed(client, spec, &mut open, Op::Read, &data, &mut back).await?;
            if back != data {
                return Err(LabError::Corrupt {
                    path: spec.path.clone(),
                });
            }
            client.remove(&spec.path).await?;
            Ok(ClientReport::Checked { write, read })
        }
    }
}

/// A new file for `spec` (replacing one of its path), open for transfers.
async fn create(client: &Client, spec: &FileSpec) -> Result<OpenFile, LabError> {
    let file = client
        .create_replacing(
            &spec.path,
            LayoutRequest {
                scheme: spec.scheme,
                stripe_unit: spec.stripe_unit_bytes,
                width: spec.width,
            },
        )
        .await?;
    Ok(client.open_id(&file).await?)
}

async fn timed(
    client: &Client,
    spec: &FileSpec,
    open: &mut OpenFile,
    op: Op,
    data: &[u8],
    back: &mut [u8],
) -> Result<Sample, LabError> {
    let link = link_counters();
    let cpu = CpuTimes::now()?;
    let start = Instant::now();
    match op {
        Op::Write => write_file(client, open, data).await?,
        Op::Read => read_file(client, open, spec, back).await?,
    }
    let seconds = start.elapsed().as_secs_f64();
    let cpu_busy = CpuTimes::now()?.busy_since(&cpu);
    let moved = link
        .zip(link_counters())
        .map(|((rx0, tx0), (rx1, tx1))| (rx1 - rx0, tx1 - tx0));
    Ok(Sample {
        path: spec.path.clone(),
        op,
        bytes: data.len() as u64,
        seconds,
        cpu_busy,
        link_rx_bytes: moved.map(|m| m.0),
        link_tx_bytes: moved.map(|m| m.1),
    })
}

/// A whole file written with the client's transfer API, as `tessera put` writes (chunks of
/// whole stripes, several in flight, no manager request per chunk).
async fn write_file(client: &Client, open: &mut OpenFile, data: &[u8]) -> Result<(), LabError> {
    Ok(client.upload_bytes(open, 0, data).await?)
}

/// A whole file read with the client's transfer API, as `tessera get` reads.
async fn read_file(
    client: &Client,
    open: &OpenFile,
    spec: &FileSpec,
    out: &mut [u8],
) -> Result<(), LabError> {
    if client.download_into(open, 0, out).await? != out.len() {
        return Err(LabError::Corrupt {
            path: spec.path.clone(),
        });
    }
    Ok(())
}

async fn sync_reads(
    client: &Client,
    spec: &FileSpec,
    block_bytes: u64,
    reads: u32,
    read_ahead: u32,
) -> Result<ClientReport, LabError> {
    assert!(reads <= SYNC_READS_MAX, "{reads} reads");
    assert!(
        block_bytes > 0 && spec.bytes >= block_bytes && spec.bytes.is_multiple_of(block_bytes),
        "a file of {} bytes is no whole number of {block_bytes}-byte blocks",
        spec.bytes
    );
    let file = client.open(&spec.path).await?;
    let data = spec.contents();
    let blocks = spec.bytes / block_bytes;
    let block = |index: u64| {
        let start = (index % blocks * block_bytes) as usize;
        &data[start..start + block_bytes as usize]
    };
    let mut back = vec![0u8; block_bytes as usize];
    let corrupt = || LabError::Corrupt {
        path: spec.path.clone(),
    };

    let server_counters_before = client.server_counters().await?;
    let client_counters_before = client.transport_counters().await;
    let got = client.read_into(&file, 0, &mut back).await?;
    if got != back.len() || back != block(0) {
        return Err(corrupt());
    }
    let link = link_counters();
    let cpu = CpuTimes::now()?;
    let mut read_us = Vec::with_capacity(reads as usize);
    let offsets = (1..=u64::from(reads)).map(move |index| index % blocks * block_bytes);
    let start = Instant::now();
    let mut timed = Box::pin(
        client
            .read_blocks(&file, offsets, block_bytes as usize, read_ahead as usize)
            .await?,
    );
    while let Some(read) = timed.next().await {
        let (bytes, took) = read?;
        read_us.push(took.as_secs_f64() * 1e6);
        if bytes.len() != back.len() {
            return Err(corrupt());
        }
        back = bytes;
    }
    let seconds = start.elapsed().as_secs_f64();
    let cpu_after = CpuTimes::now()?;
    let (cpu_busy, cpu_kernel) = (cpu_after.busy_since(&cpu), cpu_after.kernel_since(&cpu));
    let moved = link
        .zip(link_counters())
        .map(|((rx0, tx0), (rx1, tx1))| (rx1 - rx0, tx1 - tx0));
    let mut verified_blocks = 1;
    if reads > 0 {
        if back != block(u64::from(reads)) {
            return Err(corrupt());
        }
        verified_blocks += 1;
    }
    let server_counters_after = client.server_counters().await?;
    let client_counters_after = client.transport_counters().await;
    read_us.sort_by(f64::total_cmp);
    let quantile = |q: f64| {
        let last = read_us.len().saturating_sub(1);
        read_us
            .get((last as f64 * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    Ok(ClientReport::SyncReads(SyncReadsSample {
        reads,
        block_bytes,
        bytes: u64::from(reads) * block_bytes,
        seconds,
        read_us_median: quantile(0.5),
        read_us_p99: quantile(0.99),
        read_us_max: quantile(1.0),
        cpu_busy,
        cpu_kernel,
        link_rx_bytes: moved.map(|m| m.0),
        link_tx_bytes: moved.map(|m| m.1),
        verified_blocks,
        server_counters_before,
        server_counters_after,
        client_counters_before,
        client_counters_after,
    }))
}

async fn wait_servers(
    client: &Client,
    up: &[u32],
    down: &[u32],
    timeout: Duration,
) -> Result<ClientReport, LabError> {
    let start = Instant::now();
    loop {
        let servers = client.status().await?;
        let ids = |want: fn(ServerState) -> bool| -> Vec<u32> {
            servers
                .iter()
                .filter(|s| want(s.state))
                .map(|s| s.id)
                .collect()
        };
        let now_up = ids(|s| s == ServerState::Up);
        let now_down = ids(|s| s != ServerState::Up);
        // A server the manager does not list at all counts as down.
        if up.iter().all(|id| now_up.contains(id)) && !down.iter().any(|id| now_up.contains(id)) {
            return Ok(ClientReport::Servers {
                up: now_up,
                down: now_down,
            });
        }
        if start.elapsed() >= timeout {
            return Err(LabError::Timeout {
                what: format!("servers {up:?} up and {down:?} down (up now: {now_up:?})"),
                seconds: timeout.as_secs_f64(),
            });
        }
        tokio::time::sleep(STATUS_POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_round_trip_as_json() {
        let job = ClientJob::Measure {
            files: vec![FileSpec {
                path: "lab/raid5-40".into(),
                scheme: Scheme::Raid5,
                stripe_unit_bytes: 65536,
                bytes: 40 * 65536,
                seed: 7,
                width: None,
            }],
            ops: vec![Op::Write, Op::Read],
            repetitions: 3,
        };
        let text = serde_json::to_string(&job).unwrap();
        assert!(text.contains("\"job\":\"measure\""), "{text}");
        assert_eq!(serde_json::from_str::<ClientJob>(&text).unwrap(), job);
        let report = ClientReport::Servers {
            up: vec![1, 2],
            down: vec![3],
        };
        let text = serde_json::to_string(&report).unwrap();
        assert_eq!(serde_json::from_str::<ClientReport>(&text).unwrap(), report);
    }

    #[test]
    fn sync_reads_round_trip_as_json() {
        let job = ClientJob::SyncReads {
            file: FileSpec {
                path: "lab/incast-32k".into(),
                scheme: Scheme::Raid0,
                stripe_unit_bytes: 32768,
                bytes: 8 * 4 * 32768,
                seed: 3,
                width: Some(4),
            },
            block_bytes: 4 * 32768,
            reads: 100,
            read_ahead: 2,
        };
        let text = serde_json::to_string(&job).unwrap();
        assert!(text.contains("\"job\":\"sync_reads\""), "{text}");
        assert_eq!(serde_json::from_str::<ClientJob>(&text).unwrap(), job);
        let counters = Counters::from([("timeouts".to_string(), 2)]);
        let report = ClientReport::SyncReads(SyncReadsSample {
            reads: 100,
            block_bytes: 131072,
            bytes: 13_107_200,
            seconds: 0.5,
            read_us_median: 1000.0,
            read_us_p99: 2000.0,
            read_us_max: 3000.0,
            cpu_busy: 0.5,
            cpu_kernel: 0.25,
            link_rx_bytes: Some(14_000_000),
            link_tx_bytes: None,
            verified_blocks: 2,
            server_counters_before: vec![(1, Counters::new())],
            server_counters_after: vec![(1, counters.clone())],
            client_counters_before: Counters::new(),
            client_counters_after: counters,
        });
        let text = serde_json::to_string(&report).unwrap();
        assert!(text.contains("\"report\":\"sync_reads\""), "{text}");
        assert_eq!(serde_json::from_str::<ClientReport>(&text).unwrap(), report);
        // A job without a width (written before there was one) still parses.
        let old = text_without_width();
        assert!(serde_json::from_str::<FileSpec>(&old)
            .unwrap()
            .width
            .is_none());
    }

    fn text_without_width() -> String {
        r#"{"path":"f","scheme":"Raid0","stripe_unit_bytes":4096,"bytes":1,"seed":1}"#.into()
    }

    #[test]
    fn contents_depend_on_seed_only() {
        let spec = |seed| FileSpec {
            path: "x".into(),
            scheme: Scheme::Raid0,
            stripe_unit_bytes: 4096,
            bytes: 1000,
            seed,
            width: None,
        };
        assert_eq!(spec(1).contents(), spec(1).contents());
        assert_ne!(spec(1).contents(), spec(2).contents());
        assert_eq!(spec(1).contents().len(), 1000);
    }
}
