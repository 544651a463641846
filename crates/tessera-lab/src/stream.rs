//! What the measurement client does for one stream of `lab radon`: a write of its own file
//! at a rate (or, in the mirror case, a read of a file written before), each period's bytes
//! released at the period's start (the CLI's `--rate` ledger,
//! [`tessera_client::stream::StreamClock`]), from an agreed start time, with the completion
//! of every chunk timed.
//!
//! How the stream's datagram sessions pace, and whether it asks the manager to admit it,
//! is the job's [`StreamPacing`]; the binary makes the clients the job asks for (it holds
//! the credentials), through a [`Connect`] function.

use crate::LabError;
use serde::{Deserialize, Serialize};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tessera_client::stream::{Reservation, StreamReport};
use tessera_client::{Client, ClientError, LayoutRequest, Scheme};
use tessera_wire::ManagerError;

/// Stripe unit of a stream's file (one column: the file lives on one server).
pub const STREAM_STRIPE_UNIT_BYTES: u32 = 64 << 10;
/// Most bytes one stream may write.
pub const STREAM_BYTES_MAX: u64 = 4 << 30;
/// Period of the sessions' pacer in [`StreamPacing::Constant`]: the pacer's budget renews
/// every millisecond, so a stream that falls behind does not catch up (no adaptation).
pub const CONSTANT_SESSION_PERIOD_US: u64 = 1_000;

/// How a stream's datagram sessions send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamPacing {
    /// Paced at the target within every millisecond, whatever happens (the paper's
    /// "constant"); no admission.
    Constant,
    /// Radon as the paper has it: the sessions reserved at the target over the stream's
    /// period (percent budget), the endpoint paced by Radon (RFD, median filter); no
    /// admission.
    Radon,
    /// Radon, and the manager's admission first: an admitted stream is reserved as in
    /// [`StreamPacing::Radon`] (and its requests carry deadlines); a refused one runs best
    /// effort, paced by Radon's best-effort controller (it backs off on the queue).
    Admitted,
}

/// One stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamJob {
    /// Its file (created, replacing one of the path).
    pub path: String,
    /// Bytes to write.
    pub bytes: u64,
    /// The target rate and the stream's period (its deadlines).
    pub rate_bytes_per_s: u64,
    /// The period, µs.
    pub period_us: u64,
    /// How its sessions send.
    pub pacing: StreamPacing,
    /// A best-effort transfer (the bulk writer): its sessions are not reserved and it asks
    /// for no admission, whatever the line; the rate only releases its chunks.
    #[serde(default)]
    pub best_effort: bool,
    /// The link rate Radon's pacer is given (bytes/s on the wire).
    pub link_bytes_per_s: u64,
    /// When to ask the manager (with [`StreamPacing::Admitted`]), µs since the Unix epoch:
    /// streams of one run ask one after another, so which do not fit is the same each run.
    pub admit_unix_us: u64,
    /// When to start writing, µs since the Unix epoch (the hosts share the clock).
    pub start_unix_us: u64,
    /// Read the file (written before, by a job that was not) instead of writing it: the
    /// mirror case, where the servers send and the streams meet in the port toward the
    /// readers' host.
    #[serde(default)]
    pub read: bool,
    /// After a write, make it durable and give the manager the file's size (the mirror
    /// case's files, written for readers).
    #[serde(default)]
    pub sync: bool,
}

impl StreamJob {
    /// The stream's reservation.
    pub fn reservation(&self) -> Reservation {
        Reservation {
            rate_bytes_per_s: self.rate_bytes_per_s,
            period_us: self.period_us,
        }
    }

    /// The link rate the measurement client's datagram endpoint paces by (Radon's
    /// `Config::radon`), if its line uses Radon.
    pub fn radon_link_bytes_per_s(&self) -> Option<u64> {
        (self.pacing != StreamPacing::Constant).then_some(self.link_bytes_per_s)
    }
}

/// Makes a client of the cluster whose sessions are reserved at the given rate (none: best
/// effort).
pub type Connect<'a> = &'a (dyn Fn(Option<Reservation>) -> Result<Client, LabError> + Sync);

/// What the manager said to the stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "admission", rename_all = "snake_case")]
pub enum AdmissionOutcome {
    /// The line does not ask.
    NotAsked,
    /// Admitted.
    Admitted,
    /// Refused, with the manager's message; the stream ran best effort.
    Refused {
        /// The message.
        message: String,
    },
}

/// What one stream did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamSample {
    /// The manager's answer.
    pub admission: AdmissionOutcome,
    /// How late after the agreed start the first chunk could go, µs (setup overran).
    pub start_late_us: u64,
    /// Every chunk done: µs since the agreed start, and its bytes.
    pub done: Vec<(u64, u64)>,
    /// The stream's ledger: periods and deadlines, as `tessera put --rate` reports them.
    pub ledger: StreamReport,
    /// DATA packets the client's datagram endpoint sent during the stream.
    pub data_packets_sent: u64,
    /// Of them, retransmissions (losses, and resends after reordering or a late ACK).
    pub retransmissions: u64,
    /// Of the retransmissions, those its retransmission timeouts sent (the rest the server
    /// asked for, having seen a gap: losses at the port or reordering).
    #[serde(default)]
    pub timeout_retransmissions: u64,
    /// Retransmission timeouts.
    pub timeouts: u64,
    /// Of them, those found spurious (the ACK was late, not the packet lost) and those
    /// that resent nothing (the sender kept sending; the server would have asked).
    #[serde(default)]
    pub spurious_timeouts: u64,
    /// See `spurious_timeouts`.
    #[serde(default)]
    pub timeouts_without_resend: u64,
    /// The client's pacers: periods and deadlines missed as they count them (the budget
    /// not sent by the end of a period of the session), and packets sent late (more than a
    /// wait after the pacer let them: the host did not run the sender in time).
    #[serde(default)]
    pub pacer_periods: u64,
    /// See `pacer_periods`.
    #[serde(default)]
    pub pacer_deadlines_missed: u64,
    /// See `pacer_periods`.
    #[serde(default)]
    pub pacer_late_sends: u64,
    /// The queue toward the server that the server reports (its RFD estimate through the
    /// median filter), sampled: µs since the agreed start, µs of queue. For a read, the
    /// queue toward this client as it reports it to the file's server (the server's counter).
    #[serde(default)]
    pub queue_us: Vec<(u64, u64)>,
    /// A read: the server holding the file, whose counters the packet counts above are (the
    /// server sends a read's DATA; in the mirror case each server holds one stream's file).
    #[serde(default)]
    pub server: Option<u32>,
    /// The sender's pacing, sampled with `queue_us`: µs since the agreed start, the shortest
    /// wait of a paced best-effort session, ns (0: none; a full-size frame per wait is its
    /// controller's rate), and the bytes its sessions held queued.
    #[serde(default)]
    pub pacing: Vec<(u64, u64, u64)>,
    /// A read, from the reader's own endpoint every [`QUEUE_SAMPLE_EVERY`] (the server's
    /// counters above answer only after the answers queued before them): µs since the
    /// agreed start, datagrams received, the best-effort grants' rate (bytes/s on the wire,
    /// 0: none), and the reader's own estimate of the queue in front of it, µs.
    #[serde(default)]
    pub reader: Vec<(u64, u64, u64, u64)>,
}

/// How often a stream samples the queue its server reports.
pub const QUEUE_SAMPLE_EVERY: Duration = Duration::from_millis(10);

/// Where a stream's counters come from: the client's own endpoint (a write: it sends the
/// DATA), or the one server holding the file (a read).
#[derive(Clone)]
enum CounterSource {
    Client(Client),
    Server(Client, tessera_wire::ServerStatus),
}

impl CounterSource {
    async fn counters(&self) -> std::collections::BTreeMap<String, u64> {
        match self {
            CounterSource::Client(client) => client.transport_counters().await,
            CounterSource::Server(client, server) => client
                .counters_of(vec![server.clone()])
                .await
                .pop()
                .map(|(_, counters)| counters)
                .unwrap_or_default(),
        }
    }
}

/// What one sample of counters adds to [`Samples`]: µs since the agreed start, and the
/// counters by name.
type Record = fn(&mut Samples, u64, &dyn Fn(&str) -> u64);

/// Samples `source`'s counters every [`QUEUE_SAMPLE_EVERY`] from the agreed start until
/// aborted, into `into` as `record` says.
fn sample_counters(
    source: CounterSource,
    start_unix_us: u64,
    into: std::sync::Arc<std::sync::Mutex<Samples>>,
    record: Record,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        sleep_until_unix_us(start_unix_us).await;
        loop {
            let counters = source.counters().await;
            let get = |name: &str| counters.get(name).copied().unwrap_or(0);
            let at = unix_us().saturating_sub(start_unix_us);
            if let Ok(mut samples) = into.lock() {
                record(&mut samples, at, &get);
            }
            tokio::time::sleep(QUEUE_SAMPLE_EVERY).await;
        }
    })
}

/// The queue the stream's receiver reports to its sender, and the sender's pacing.
fn record_queue(samples: &mut Samples, at: u64, get: &dyn Fn(&str) -> u64) {
    samples.queue_us.push((at, get("peer_queue_delay_us_max")));
    samples
        .pacing
        .push((at, get("best_effort_wait_ns"), get("queued_bytes")));
}

/// A reader's own endpoint (see [`StreamSample::reader`]).
fn record_reader(samples: &mut Samples, at: u64, get: &dyn Fn(&str) -> u64) {
    samples.reader.push((
        at,
        get("datagrams_received"),
        get("best_effort_grant_rate"),
        get("queue_delay_us_max"),
    ));
}

/// What [`sample_counters`] collects.
#[derive(Default)]
struct Samples {
    queue_us: Vec<(u64, u64)>,
    pacing: Vec<(u64, u64, u64)>,
    reader: Vec<(u64, u64, u64, u64)>,
}

/// Asks the manager to admit `job`'s stream of `file` at the job's admission time.
async fn admit_at(
    client: &Client,
    file: &tessera_client::File,
    job: &StreamJob,
) -> Result<tessera_client::stream::Admission, ClientError> {
    sleep_until_unix_us(job.admit_unix_us).await;
    client.admit_stream(file, job.reservation()).await
}

async fn sleep_until_unix_us(at: u64) {
    tokio::time::sleep(Duration::from_micros(at.saturating_sub(unix_us()))).await;
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The stream's file: created (replacing one of its path) for a write, looked up for a
/// read.
async fn stream_file(setup: &Client, job: &StreamJob) -> Result<tessera_client::File, LabError> {
    if job.read {
        return Ok(setup.open(&job.path).await?);
    }
    let layout = LayoutRequest {
        scheme: Scheme::Raid0,
        stripe_unit: STREAM_STRIPE_UNIT_BYTES,
        width: Some(1),
    };
    Ok(setup.create_replacing(&job.path, layout).await?)
}

/// Asks the manager if the job's line does; the reservation held while the stream runs.
async fn admission(
    setup: &Client,
    file: &tessera_client::File,
    job: &StreamJob,
) -> Result<(AdmissionOutcome, Option<tessera_client::stream::Admission>), LabError> {
    Ok(match job.pacing {
        _ if job.best_effort => (AdmissionOutcome::NotAsked, None),
        StreamPacing::Constant | StreamPacing::Radon => (AdmissionOutcome::NotAsked, None),
        StreamPacing::Admitted => match admit_at(setup, file, job).await {
            Ok(held) => (AdmissionOutcome::Admitted, Some(held)),
            Err(ClientError::Metadata(refused @ ManagerError::ReservationRefused { .. })) => (
                AdmissionOutcome::Refused {
                    message: refused.to_string(),
                },
                None,
            ),
            Err(e) => return Err(e.into()),
        },
    })
}

/// The reservation the stream's sessions get.
fn session_reservation(job: &StreamJob, admission: &AdmissionOutcome) -> Option<Reservation> {
    match (job.pacing, admission) {
        _ if job.best_effort => None,
        (StreamPacing::Constant, _) => Some(Reservation {
            period_us: CONSTANT_SESSION_PERIOD_US,
            ..job.reservation()
        }),
        (_, AdmissionOutcome::Refused { .. }) => None,
        _ => Some(job.reservation()),
    }
}

/// Where the stream's packet counts come from: the client for a write, the file's server
/// for a read.
async fn counter_source(
    client: &Client,
    open: &tessera_client::OpenFile,
    job: &StreamJob,
) -> Result<CounterSource, LabError> {
    if !job.read {
        return Ok(CounterSource::Client(client.clone()));
    }
    let id = open.meta().servers.first().copied();
    let server = client
        .status()
        .await?
        .into_iter()
        .find(|s| Some(s.id) == id)
        .ok_or_else(|| LabError::Connect(format!("the server of {} is not up", job.path)))?;
    Ok(CounterSource::Server(client.clone(), server))
}

/// Run `job`, making clients with `connect`.
pub async fn run(job: &StreamJob, connect: Connect<'_>) -> Result<StreamSample, LabError> {
    assert!(
        job.bytes <= STREAM_BYTES_MAX,
        "a stream of {} bytes",
        job.bytes
    );
    let reservation = job.reservation();
    reservation
        .validate()
        .map_err(|e| LabError::Connect(e.to_string()))?;
    let setup = connect(None)?;
    let file = stream_file(&setup, job).await?;
    let (admission, held) = admission(&setup, &file, job).await?;
    let client = connect(session_reservation(job, &admission))?;
    let mut open = client.open_id(&file).await?;
    // Open the client's session to the server before the start (one request), so that the
    // stream's first period does not pay for the handshake (15-20 ms on the busy testbed,
    // which every period after it then lagged by).
    client.server_counters().await?;
    let source = counter_source(&client, &open, job).await?;
    let before = Grown {
        packets: source.counters().await,
        pacer: client.transport_counters().await,
    };

    let queue = std::sync::Arc::new(std::sync::Mutex::new(Samples::default()));
    let sampler = sample_counters(
        source.clone(),
        job.start_unix_us,
        queue.clone(),
        record_queue,
    );
    // A read's server answers its counters only after the stream's answers queued before
    // them: the reader's own endpoint shows the read's progress meanwhile.
    let reader_sampler = job.read.then(|| {
        let own = CounterSource::Client(client.clone());
        sample_counters(own, job.start_unix_us, queue.clone(), record_reader)
    });
    sleep_until_unix_us(job.start_unix_us).await;
    let started = tokio::time::Instant::now();
    let start_late_us = unix_us().saturating_sub(job.start_unix_us);
    let mut clock = client.start_stream(reservation);
    let mut done = Vec::new();
    let mut progress = |bytes: u64| {
        let at = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        done.push((at + start_late_us, bytes));
    };
    if job.read {
        let mut sink = std::io::sink();
        client
            .download(
                &open,
                0,
                job.bytes,
                &mut sink,
                Some(&mut clock),
                &mut progress,
            )
            .await?;
    } else {
        let mut source = std::io::Read::take(std::io::repeat(0), job.bytes);
        client
            .upload(&mut open, 0, &mut source, Some(&mut clock), &mut progress)
            .await?;
    }
    let report = clock.finish();
    if job.sync {
        client.sync_open(&mut open).await?;
    }
    sampler.abort();
    if let Some(reader_sampler) = reader_sampler {
        reader_sampler.abort();
    }
    let samples = std::mem::take(&mut *queue.lock().unwrap_or_else(|e| e.into_inner()));
    if let Some(held) = held {
        // A release that fails only leaves the reservation to lapse with its lease.
        let _ = held.release().await;
    }
    let after = Grown {
        packets: source.counters().await,
        pacer: client.transport_counters().await,
    };
    let mut sample = after.since(&before);
    sample.admission = admission;
    sample.start_late_us = start_late_us;
    sample.done = done;
    sample.ledger = report;
    sample.queue_us = samples.queue_us;
    sample.pacing = samples.pacing;
    sample.reader = samples.reader;
    sample.server = match source {
        CounterSource::Client(_) => None,
        CounterSource::Server(_, status) => Some(status.id),
    };
    Ok(sample)
}

/// Counters at one moment: the stream's packets (the client's for a write, the file's
/// server's for a read) and the client's pacers.
struct Grown {
    packets: std::collections::BTreeMap<String, u64>,
    pacer: std::collections::BTreeMap<String, u64>,
}

impl Grown {
    /// What grew since `before`, as a sample with nothing else filled in.
    fn since(&self, before: &Grown) -> StreamSample {
        let at = |c: &std::collections::BTreeMap<String, u64>, name: &str| {
            c.get(name).copied().unwrap_or(0)
        };
        let packets =
            |name: &str| at(&self.packets, name).saturating_sub(at(&before.packets, name));
        let pacer = |name: &str| at(&self.pacer, name).saturating_sub(at(&before.pacer, name));
        StreamSample {
            admission: AdmissionOutcome::NotAsked,
            start_late_us: 0,
            done: Vec::new(),
            ledger: StreamReport::default(),
            data_packets_sent: packets("data_packets_sent"),
            retransmissions: packets("retransmissions"),
            timeout_retransmissions: packets("timeout_retransmissions"),
            timeouts: packets("timeouts"),
            spurious_timeouts: packets("spurious_timeouts"),
            timeouts_without_resend: packets("timeouts_without_resend"),
            pacer_periods: pacer("pacer_periods"),
            pacer_deadlines_missed: pacer("pacer_deadlines_missed"),
            pacer_late_sends: pacer("pacer_late_sends"),
            queue_us: Vec::new(),
            server: None,
            pacing: Vec::new(),
            reader: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_jobs_round_trip_as_json_and_say_their_pacing() {
        let job = StreamJob {
            path: "lab/radon-1".into(),
            bytes: 1 << 20,
            rate_bytes_per_s: 4_000_000,
            period_us: 1_000_000,
            pacing: StreamPacing::Admitted,
            best_effort: false,
            link_bytes_per_s: 25_000_000,
            admit_unix_us: 1,
            start_unix_us: 2,
            read: false,
            sync: false,
        };
        let text = serde_json::to_string(&job).unwrap();
        assert!(text.contains("\"pacing\":\"admitted\""), "{text}");
        assert_eq!(serde_json::from_str::<StreamJob>(&text).unwrap(), job);
        assert_eq!(job.radon_link_bytes_per_s(), Some(25_000_000));
        let constant = StreamJob {
            pacing: StreamPacing::Constant,
            ..job
        };
        assert_eq!(constant.radon_link_bytes_per_s(), None);
        let refused = AdmissionOutcome::Refused {
            message: "no room".into(),
        };
        let text = serde_json::to_string(&refused).unwrap();
        assert_eq!(
            serde_json::from_str::<AdmissionOutcome>(&text).unwrap(),
            refused
        );
    }
}
