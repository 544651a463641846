//! The explorer: per seed, a random workload on a [`SimCluster`] with faults at random steps,
//! every read checked against a [`FileModel`], then recovery and a check of every file, whole
//! and with each server lost in turn.

use crate::cluster::SimCluster;
use crate::model::{FileModel, Mismatch, TornStripes};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::fmt;
use std::time::Duration;
use tessera_client::{Client, ClientError, File, LayoutRequest, Scheme, Unrebuildable};
use tessera_transport::{MemFaults, MemStats};
use tessera_wire::{ServerId, ServerState};

/// A scrub running beside an operation: its report, or `None` if it was killed.
type ScrubBeside =
    tokio::task::JoinHandle<Option<Result<tessera_client::ScrubReport, ClientError>>>;

/// What a run explores.
#[derive(Debug, Clone)]
pub struct ExploreConfig {
    /// Schemes files are created with.
    pub schemes: Vec<Scheme>,
    /// Storage servers.
    pub servers: usize,
    /// Operations per run.
    pub steps: usize,
    /// Chance per operation that the client is killed at a random request of it.
    pub client_crash: f64,
    /// Chance per operation that a server is killed at a random request of it (then restarted
    /// at once, or after some operations, or with its disk wiped).
    pub server_crash: f64,
    /// Chance that a killed server stays down for some operations (degraded reads and writes,
    /// then it returns stale).
    pub server_loss: f64,
    /// Chance that a killed server comes back on a blank disk.
    pub wipe: f64,
    /// Chance that a killed server (not wiped) lost power rather than only its process: its
    /// in-memory disk keeps, drops or tears each write not synced.
    pub power_loss: f64,
    /// Chance per operation that one bit flips in one of a random server's files.
    pub bit_flip: f64,
    /// Faults of the network while the workload runs.
    pub network: MemFaults,
    /// After recovery, read every redundant file with each server lost in turn.
    pub degraded_check: bool,
    /// Chance per operation that a scrub of every file, by another client, runs beside it
    /// (its repairs race the operation's writes; its errors under faults are only noted).
    pub scrub_beside: f64,
    /// Chance that a scrub beside an operation is killed at a random request of the cluster
    /// (its fences left standing, a repair cut midway).
    pub scrub_kill: f64,
}

impl Default for ExploreConfig {
    fn default() -> Self {
        ExploreConfig {
            schemes: Scheme::ALL.to_vec(),
            servers: 4,
            steps: 24,
            client_crash: 0.0,
            server_crash: 0.0,
            server_loss: 0.0,
            wipe: 0.0,
            power_loss: 0.0,
            bit_flip: 0.0,
            network: MemFaults::default(),
            degraded_check: true,
            scrub_beside: 0.0,
            scrub_kill: 0.0,
        }
    }
}

/// What one run did.
#[derive(Debug, Clone, Default)]
pub struct RunReport {
    /// Writes acknowledged.
    pub writes_acked: u64,
    /// Writes cancelled or failed.
    pub writes_unacked: u64,
    /// Reads compared with the model.
    pub reads_checked: u64,
    /// Reads that failed (tolerated while faults ran, never after recovery).
    pub reads_failed: u64,
    /// Bytes compared with the model.
    pub bytes_checked: u64,
    /// Clients killed.
    pub client_crashes: u64,
    /// Servers killed.
    pub server_crashes: u64,
    /// Servers wiped.
    pub wipes: u64,
    /// Servers that lost power.
    pub power_losses: u64,
    /// Unsynced writes a power loss dropped or tore.
    pub writes_lost: u64,
    /// Bits flipped.
    pub bit_flips: u64,
    /// Scrub repairs past a file's size (damage there a write growing the file would find).
    pub scrub_repairs_past_size: u64,
    /// Scrubs run beside an operation, and the repairs they made.
    pub scrubs_beside: u64,
    /// Repairs made by the scrubs beside operations.
    pub scrub_beside_repairs: u64,
    /// Scrubs beside operations killed midway.
    pub scrubs_killed: u64,
    /// Stores refused at a restart (a flipped `store.toml`) and started blank.
    pub stores_refused: u64,
    /// Blocks, parity, mirrors and overflow records the final scrub repaired.
    pub scrub_repairs: u64,
    /// Rebuilds completed.
    pub rebuilds: u64,
    /// Stripes that read as an error in the final checks because an interrupted full-stripe
    /// write left their parity stale and a column was lost (allowed: see the model).
    pub torn_stripes_unreadable: u64,
    /// What the network did.
    pub network: MemStats,
}

/// A run that found a wrong answer (or could not recover): everything needed to replay it.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The seed: `replay(seed, &config)` runs it again.
    pub seed: u64,
    /// Where: the operation's number, or the recovery phase.
    pub phase: String,
    /// What went wrong.
    pub detail: String,
    /// The wrong byte, if the failure is one.
    pub mismatch: Option<Box<Mismatch>>,
    /// The last operations and faults of the run.
    pub trace: Vec<String>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed {} failed at {}: {} (replay: TESSERA_SIM_SEED={} or tessera_sim::replay)",
            self.seed, self.phase, self.detail, self.seed
        )?;
        let skip = self.trace.len().saturating_sub(200);
        for line in &self.trace[skip..] {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

/// Virtual time a run may take: far more than any run without a hang needs (a run's timeouts
/// are seconds each).
const RUN_VIRTUAL_MAX: Duration = Duration::from_secs(3600);

/// How long requests may stay at servers after their operation ended (only a wait for a
/// parity lock lasts longer than the disk calls, which take no virtual time).
const QUIESCE_MAX: Duration = Duration::from_secs(60);

/// Run one seed on a fresh current-thread runtime whose clock starts paused (virtual time).
pub fn replay(seed: u64, config: &ExploreConfig) -> Result<RunReport, Failure> {
    crate::run_virtual(async {
        let cluster = SimCluster::start(seed, config.servers).await;
        let mut explorer = Explorer::new(seed, config.clone(), cluster);
        let ran = tokio::time::timeout(RUN_VIRTUAL_MAX, explorer.run()).await;
        let Ok(ran) = ran else {
            let detail = format!("not done after {RUN_VIRTUAL_MAX:?} of virtual time: a hang");
            return Err(explorer.fail("the deadline".into(), detail, None));
        };
        ran?;
        explorer.report.network = explorer.cluster.network.stats();
        Ok(explorer.report)
    })
}

/// A file of the run.
struct SimFile {
    file: File,
    scheme: Scheme,
    stripe_bytes: u64,
    model: FileModel,
    /// Without redundancy and on a wiped server: may no longer be read, never read wrong.
    lost: bool,
    /// The servers of its columns.
    servers: Vec<ServerId>,
}

/// One operation of the workload.
#[derive(Debug, Clone)]
enum Op {
    Create {
        path: String,
        scheme: Scheme,
        unit: u32,
    },
    Write {
        file: usize,
        offset: u64,
        data: Vec<u8>,
    },
    Read {
        file: usize,
        offset: u64,
        len: u64,
    },
    Sync {
        file: usize,
    },
    Truncate {
        file: usize,
        size: u64,
    },
}

/// How an operation ended.
enum Outcome {
    Created(File),
    Wrote,
    Read(Vec<u8>),
    Synced,
    Truncated,
    Failed(ClientError),
    /// The client was killed during it.
    Killed,
}

/// A server killed during the next operation, and what happens to it afterwards.
struct ServerKill {
    index: usize,
    /// Operations it stays down for (0: restarted right after).
    down_for: usize,
    wipe: bool,
    /// The power went too: unsynced writes may be lost or torn.
    power: bool,
}

struct Explorer {
    seed: u64,
    config: ExploreConfig,
    rng: StdRng,
    cluster: SimCluster,
    client: Client,
    files: Vec<SimFile>,
    /// A server that is down: its index and the operations left before it restarts.
    down: Option<(usize, usize)>,
    /// Servers that lost power during the operation running, folded into the model after
    /// its outcome (a write it answered before the power went may be lost with it).
    powered_off: Vec<ServerId>,
    report: RunReport,
    trace: Vec<String>,
    /// What servers owed after the last operation, to trace changes.
    debts: String,
    /// Files created so far (each gets a new path).
    paths: usize,
    /// A flipped bit since the last scrub.
    scrub_due: bool,
    /// A server a bit flipped in, to restart before the next scrub.
    restart_due: Option<usize>,
}

impl Explorer {
    fn new(seed: u64, config: ExploreConfig, cluster: SimCluster) -> Explorer {
        assert!(!config.schemes.is_empty(), "at least one scheme to explore");
        cluster.network.set_faults(config.network);
        Explorer {
            seed,
            // The workload's generator is apart from the network's, so that changing the
            // faults' draws does not change the workload.
            rng: StdRng::seed_from_u64(seed ^ 0x5eed_f0e5_5e7a),
            client: cluster.client(),
            cluster,
            config,
            files: Vec::new(),
            down: None,
            powered_off: Vec::new(),
            report: RunReport::default(),
            trace: Vec::new(),
            debts: String::new(),
            paths: 0,
            scrub_due: false,
            restart_due: None,
        }
    }

    /// A line of the run's trace, also logged as it happens (interleaved with the cluster's
    /// log when `RUST_LOG` asks for it).
    fn note(&mut self, line: String) {
        tracing::debug!("explorer: {line}");
        self.trace.push(line);
    }

    fn fail(&self, phase: String, detail: String, mismatch: Option<Mismatch>) -> Failure {
        Failure {
            seed: self.seed,
            phase,
            detail,
            mismatch: mismatch.map(Box::new),
            trace: self.trace.clone(),
        }
    }

    async fn run(&mut self) -> Result<(), Failure> {
        for step in 0..self.config.steps {
            self.restart_if_due(step).await;
            self.maybe_flip_bit(step).await?;
            let op = self.pick_op();
            let kill_client = self.rng.gen_bool(self.config.client_crash);
            let kill_server = self.down.is_none() && self.rng.gen_bool(self.config.server_crash);
            // One failure at a time: a server made stale by a lost request is rebuilt before
            // another is killed (a stale server and a lost one are two lost columns).
            let kill_server = kill_server && self.single_failure_ready(step).await?;
            let client_at = kill_client.then(|| self.rng.gen_range(1..=16u64));
            let server_kill = kill_server.then(|| self.pick_server_kill());
            let server_at = self.rng.gen_range(1..=16u64);
            // Lost messages only while every server is up and none is being killed: one that
            // made a second server stale would be a second failure (see the crate docs).
            let calm = self.down.is_none() && server_kill.is_none() && self.all_up().await;
            let faults = if calm {
                self.config.network
            } else {
                MemFaults::default()
            };
            self.cluster.network.set_faults(faults);
            self.note(format!(
                "{step}: {} {}{}",
                describe(&op),
                client_at.map_or(String::new(), |k| format!(" [client killed at call {k}]")),
                server_kill.as_ref().map_or(String::new(), |s| format!(
                    " [server {} killed at call {server_at}, down for {}{}{}]",
                    s.index + 1,
                    s.down_for,
                    if s.wipe { ", wiped" } else { "" },
                    if s.power { ", power lost" } else { "" }
                )),
            ));
            let outcome = self
                .execute(op.clone(), client_at, server_kill, server_at, step)
                .await?;
            self.apply(step, op, outcome).await?;
            self.fold_power_losses();
            let debts = self.cluster.debts();
            if debts != self.debts {
                self.note(format!("{step}: owed now: {debts}"));
                self.debts = debts;
            }
        }
        self.recover().await?;
        self.check_all("after recovery", false).await?;
        if self.report.bit_flips > 0 {
            self.scrub("scrub").await?;
        }
        if self.config.degraded_check {
            for index in 0..self.cluster.servers() {
                self.cluster.crash_server(index);
                let phase = format!("after recovery, server {} lost", index + 1);
                self.check_all(&phase, true).await?;
                self.start_server(index, "after recovery").await;
            }
        }
        Ok(())
    }

    /// Rebuild stale servers; whether all are up now.
    async fn single_failure_ready(&mut self, step: usize) -> Result<bool, Failure> {
        // Servers reported down by a lost message heartbeat back meanwhile.
        tokio::time::sleep(Duration::from_secs(1)).await;
        if self.all_up().await {
            self.scrub_if_due(step).await?;
            return Ok(true);
        }
        let network = self.cluster.network.clone();
        network.set_faults(MemFaults::default());
        let phase = format!("operation {step}, before a kill");
        let rebuilt = self.rebuild_stale(&phase).await;
        network.set_faults(self.config.network);
        rebuilt?;
        if !self.all_up().await {
            return Ok(false);
        }
        self.scrub_if_due(step).await?;
        Ok(true)
    }

    /// Damage a flipped bit left is repaired before the next fault, as an operator scrubs
    /// when a disk reports errors: else it would be a second failure in the same stripe. (A
    /// power loss needs no scrub: a store that lost answered writes comes back empty as a new
    /// incarnation and is rebuilt.)
    async fn scrub_if_due(&mut self, step: usize) -> Result<(), Failure> {
        if !self.scrub_due {
            return Ok(());
        }
        self.scrub_due = false;
        let network = self.cluster.network.clone();
        network.set_faults(MemFaults::default());
        let phase = format!("operation {step}, before a fault");
        let mut scrubbed = Ok(());
        if let Some(index) = self.restart_due.take() {
            // A flipped bit in what is read only at start (store.toml, the overflow log, the
            // intent records) is found by a restart, never by a scrub of a running server.
            self.cluster.crash_server(index);
            self.start_server(index, &phase).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            scrubbed = self.rebuild_stale(&phase).await.map(drop);
        }
        if scrubbed.is_ok() {
            scrubbed = self.scrub(&phase).await;
        }
        network.set_faults(self.config.network);
        scrubbed
    }

    fn pick_server_kill(&mut self) -> ServerKill {
        let index = self.rng.gen_range(0..self.cluster.servers());
        let lost = self.rng.gen_bool(self.config.server_loss);
        let wipe = self.rng.gen_bool(self.config.wipe);
        ServerKill {
            index,
            down_for: if lost { self.rng.gen_range(1..=6) } else { 0 },
            wipe,
            power: !wipe && self.rng.gen_bool(self.config.power_loss),
        }
    }

    /// At random operations, one bit of a random server's files flips (one fault at a time,
    /// as for kills).
    async fn maybe_flip_bit(&mut self, step: usize) -> Result<(), Failure> {
        if !self.rng.gen_bool(self.config.bit_flip)
            || self.down.is_some()
            || !self.single_failure_ready(step).await?
        {
            return Ok(());
        }
        let index = self.rng.gen_range(0..self.cluster.servers());
        let seed = self.rng.gen();
        if let Some(flip) = self.cluster.flip_bit(index, seed) {
            self.report.bit_flips += 1;
            self.note(format!(
                "{step}: bit {} of byte {} of server {}'s {} flipped",
                flip.bit,
                flip.offset,
                index + 1,
                flip.path.display()
            ));
            self.scrub_due = true;
            self.restart_due = Some(index);
        }
        Ok(())
    }

    /// Start server `index`; a store refused (damaged `store.toml`) starts blank, as if wiped.
    async fn start_server(&mut self, index: usize, phase: &str) {
        if let Some(why) = self.cluster.start_server(index).await {
            self.report.stores_refused += 1;
            self.note(format!(
                "{phase}: server {} refused its store and starts blank: {why}",
                index + 1
            ));
            self.lose_raid0();
        }
    }

    /// Servers that lost power: the bytes of RAID-0 files on them not synced may be lost (a
    /// rebuild puts back what they kept: nothing else holds those files' bytes).
    fn fold_power_losses(&mut self) {
        for server in std::mem::take(&mut self.powered_off) {
            for file in &mut self.files {
                if file.scheme == Scheme::Raid0 && file.servers.contains(&server) {
                    file.model.unsynced_may_be_lost();
                }
            }
        }
    }

    /// A server's disk lost bytes RAID-0 files cannot get back: they may no longer be read.
    fn lose_raid0(&mut self) {
        for file in &mut self.files {
            file.lost |= file.scheme == Scheme::Raid0;
        }
    }

    fn pick_op(&mut self) -> Op {
        let rng = &mut self.rng;
        if self.files.is_empty() || (self.files.len() < 4 && rng.gen_bool(0.15)) {
            let scheme = self.config.schemes[rng.gen_range(0..self.config.schemes.len())];
            let unit = [4096, 8192][rng.gen_range(0..2)];
            self.paths += 1;
            let path = format!("/f{}", self.paths);
            return Op::Create { path, scheme, unit };
        }
        let file = rng.gen_range(0..self.files.len());
        let stripe = self.files[file].stripe_bytes;
        match rng.gen_range(0..11) {
            0..=5 => {
                let offset = rng.gen_range(0..=stripe * 4);
                // Partial stripes, whole ones and both, starting and ending anywhere.
                let len = rng.gen_range(1..=stripe * 5 / 2) as usize;
                let mut data = vec![0u8; len];
                rng.fill(&mut data[..]);
                Op::Write { file, offset, data }
            }
            6..=8 => {
                let size = self.files[file].model.size();
                let offset = rng.gen_range(0..=size);
                let len = rng.gen_range(0..=size - offset);
                Op::Read { file, offset, len }
            }
            9 => Op::Sync { file },
            _ => {
                // Mostly cuts, at and off stripe boundaries; sometimes a grow.
                let size = self.files[file].model.size();
                let size = rng.gen_range(0..=size + stripe);
                Op::Truncate { file, size }
            }
        }
    }

    /// Run `op`, killing the client at its `client_at`-th request and a server at its
    /// `server_at`-th, if asked.
    async fn execute(
        &mut self,
        op: Op,
        client_at: Option<u64>,
        server_kill: Option<ServerKill>,
        server_at: u64,
        step: usize,
    ) -> Result<Outcome, Failure> {
        let network = self.cluster.network.clone();
        let start = network.stats().calls;
        let killer = server_kill.as_ref().map(|kill| {
            let network = network.clone();
            let addr = self.cluster.server_addr(kill.index);
            tokio::spawn(async move {
                network.calls_reached(start + server_at).await;
                network.crash(addr);
            })
        });
        // Drawn only when asked for, so that other configurations replay as before.
        let scrubbing = (self.config.scrub_beside > 0.0
            && self.rng.gen_bool(self.config.scrub_beside))
        .then(|| self.spawn_scrub(start, step));
        let work = run_op(self.client.clone(), self.files_of(&op), op);
        let outcome = match client_at {
            None => work.await,
            Some(k) => tokio::select! {
                biased;
                _ = network.calls_reached(start + k) => Outcome::Killed,
                outcome = work => outcome,
            },
        };
        if let Some(scrubbing) = scrubbing {
            self.finish_scrub_beside(scrubbing, step).await?;
        }
        if matches!(outcome, Outcome::Killed) {
            // The process is gone: its connections close (the old client's transport drops)
            // and a new client starts.
            self.client = self.cluster.client();
            self.report.client_crashes += 1;
        }
        if tokio::time::timeout(QUIESCE_MAX, network.quiesce())
            .await
            .is_err()
        {
            let detail = format!(
                "requests still waiting at servers {QUIESCE_MAX:?} after their operation \
                 ended (a parity lock never released?): (server, connection, bytes) {:?}",
                network.waiting()
            );
            return Err(self.fail(format!("operation {step}"), detail, None));
        }
        if let Some(killer) = killer {
            killer.abort();
        }
        if let Some(kill) = server_kill {
            self.finish_server_kill(kill).await;
        }
        Ok(outcome)
    }

    /// A scrub of every file by a client of its own, beside operation `step`, killed at the
    /// cluster's `start + k`-th request if `scrub_kill` draws it (the draws are made only when
    /// it is asked for, so that other configurations replay as before).
    fn spawn_scrub(&mut self, start: u64, step: usize) -> ScrubBeside {
        let scrubber = self.cluster.client();
        let kill_at = (self.config.scrub_kill > 0.0 && self.rng.gen_bool(self.config.scrub_kill))
            .then(|| self.rng.gen_range(1..=48u64));
        if let Some(k) = kill_at {
            self.trace
                .push(format!("{step}: scrub beside, killed at call {k}"));
        }
        let network = self.cluster.network.clone();
        tokio::spawn(async move {
            let Some(k) = kill_at else {
                return Some(scrubber.scrub(None).await);
            };
            tokio::select! {
                biased;
                _ = network.calls_reached(start + k) => None,
                report = scrubber.scrub(None) => Some(report),
            }
            // The scrubber (its process) is gone here: its connections close.
        })
    }

    /// Waits for the scrub that ran beside operation `step`; its repairs are counted, its
    /// failures (a server killed under it) noted.
    async fn finish_scrub_beside(
        &mut self,
        scrubbing: ScrubBeside,
        step: usize,
    ) -> Result<(), Failure> {
        self.report.scrubs_beside += 1;
        match scrubbing.await {
            Ok(None) => {
                self.report.scrubs_killed += 1;
                self.note(format!("{step}: scrub beside killed"));
                Ok(())
            }
            Ok(Some(Ok(report))) => {
                self.report.scrub_beside_repairs +=
                    report.corrupt_repaired + report.parity_repaired + report.mirrors_repaired;
                self.note(format!("{step}: scrub beside: {report:?}"));
                Ok(())
            }
            Ok(Some(Err(e))) => {
                self.note(format!("{step}: scrub beside failed: {e}"));
                Ok(())
            }
            Err(e) => Err(self.fail(
                format!("operation {step}"),
                format!("the scrub beside it panicked: {e}"),
                None,
            )),
        }
    }

    async fn finish_server_kill(&mut self, kill: ServerKill) {
        self.cluster.crash_server(kill.index);
        self.report.server_crashes += 1;
        if kill.wipe {
            self.cluster.wipe_server(kill.index).await;
            self.report.wipes += 1;
            self.lose_raid0();
        }
        if kill.power {
            let lost = self.cluster.power_loss(kill.index, self.rng.gen());
            self.report.power_losses += 1;
            self.report.writes_lost += lost.writes_dropped + lost.writes_torn;
            self.note(format!("  power lost: {lost:?}"));
            // The store renews its incarnation if it lost answered writes. A rebuild puts
            // back what it kept of RAID-0 files on it (nothing else holds their bytes): their
            // bytes not synced may be lost, or they may not be read at all (a later wipe).
            self.lose_raid0();
            self.powered_off.push(self.cluster.server_id(kill.index));
        }
        if kill.down_for == 0 {
            self.start_server(kill.index, "restart").await;
        } else {
            self.down = Some((kill.index, kill.down_for));
        }
    }

    async fn restart_if_due(&mut self, step: usize) {
        let Some((index, left)) = self.down else {
            return;
        };
        if left > 0 {
            self.down = Some((index, left - 1));
            return;
        }
        self.down = None;
        self.trace
            .push(format!("{step}: server {} restarts", index + 1));
        self.start_server(index, &format!("{step}")).await;
    }

    fn files_of(&self, op: &Op) -> Option<File> {
        match op {
            Op::Create { .. } => None,
            Op::Write { file, .. }
            | Op::Read { file, .. }
            | Op::Sync { file }
            | Op::Truncate { file, .. } => Some(self.files[*file].file.clone()),
        }
    }

    /// Fold an operation's outcome into the model, checking what it read.
    async fn apply(&mut self, step: usize, op: Op, outcome: Outcome) -> Result<(), Failure> {
        if let Outcome::Failed(e) = &outcome {
            self.note(format!("{step}: failed: {e}"));
        }
        match (op, outcome) {
            (Op::Create { path, .. }, outcome) => {
                let file = match outcome {
                    Outcome::Created(file) => Some(file),
                    // It may have been created before the answer was lost.
                    _ => self.client.open(&path).await.ok(),
                };
                if let Some(file) = file {
                    self.add_file(file).await;
                }
            }
            (Op::Write { file, offset, data }, Outcome::Wrote) => {
                self.files[file].model.write(offset, &data);
                self.report.writes_acked += 1;
            }
            (Op::Write { file, offset, data }, _) => {
                self.files[file].model.write_unacknowledged(offset, &data);
                self.report.writes_unacked += 1;
            }
            (Op::Read { file, offset, .. }, Outcome::Read(bytes)) => {
                let f = &self.files[file];
                if let Err(m) = f.model.check(offset, &bytes) {
                    let detail = describe_mismatch(f, &m);
                    return Err(self.fail(format!("operation {step}"), detail, Some(m)));
                }
                self.report.reads_checked += 1;
                self.report.bytes_checked += bytes.len() as u64;
            }
            (Op::Read { .. }, _) => self.report.reads_failed += 1,
            (Op::Sync { file }, Outcome::Synced) => self.files[file].model.synced(),
            (Op::Sync { .. }, _) => {}
            (Op::Truncate { file, size }, Outcome::Truncated) => {
                self.files[file].model.truncate(size);
            }
            (Op::Truncate { file, size }, _) => {
                self.files[file].model.truncate_unacknowledged(size);
            }
        }
        Ok(())
    }

    /// Track a file the manager has (its layout as the manager says, asked with faults off).
    async fn add_file(&mut self, file: File) {
        let network = self.cluster.network.clone();
        network.set_faults(MemFaults::default());
        let stat = self.client.stat(&file.path).await;
        network.set_faults(self.config.network);
        let stat = stat.expect("the manager answers a stat with no faults");
        if self.files.iter().any(|f| f.file.id == file.id) {
            return;
        }
        self.files.push(SimFile {
            file,
            scheme: stat.meta.layout.scheme,
            stripe_bytes: stat.meta.layout.stripe_bytes(),
            model: match stat.meta.layout.scheme {
                Scheme::Raid4 | Scheme::Raid5 | Scheme::Hybrid => {
                    FileModel::with_torn_stripes(TornStripes {
                        stripe_bytes: stat.meta.layout.stripe_bytes(),
                        resolved_by_partial_writes: stat.meta.layout.scheme != Scheme::Hybrid,
                    })
                }
                Scheme::Raid0 | Scheme::Raid1 => FileModel::default(),
            },
            lost: false,
            servers: stat.meta.servers.clone(),
        });
    }

    /// Heal the network, restart every server, rebuild what is owed.
    async fn recover(&mut self) -> Result<(), Failure> {
        let network = &self.cluster.network;
        network.set_faults(MemFaults::default());
        network.heal();
        self.down = None;
        for index in 0..self.cluster.servers() {
            // Restarted, so that a store a flipped bit made unopenable is found now and
            // rebuilt, not at the checks with another server lost.
            self.cluster.crash_server(index);
            self.start_server(index, "recovery").await;
        }
        self.note("recovery: every server started".into());
        // A heartbeat from each, so that none still counts as down.
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Rebuilding one server may need another rebuilt first: passes until none is owed.
        for _ in 0..self.cluster.servers() {
            if self.rebuild_stale("recovery").await? == 0 {
                return Ok(());
            }
        }
        match self.rebuild_stale("recovery").await? {
            0 => Ok(()),
            n => Err(self.fail("recovery".into(), format!("{n} servers still stale"), None)),
        }
    }

    /// Scrub every file (as an operator does after a power loss or when bits rot): parity a
    /// power loss left behind its data and blocks that fail their checksums are repaired, so
    /// that the reads with each server lost that follow are exact.
    async fn scrub(&mut self, phase: &str) -> Result<(), Failure> {
        let report = self
            .client
            .scrub(None)
            .await
            .map_err(|e| self.fail(phase.into(), format!("scrub: {e}"), None))?;
        self.report.scrub_repairs +=
            report.corrupt_repaired + report.parity_repaired + report.mirrors_repaired;
        self.report.scrub_repairs_past_size += report.past_size_repaired;
        self.note(format!("{phase}: scrub: {report:?}"));
        Ok(())
    }

    /// Rebuild every stale server (as an operator would), tolerating failures; returns how
    /// many are still stale.
    async fn rebuild_stale(&mut self, phase: &str) -> Result<usize, Failure> {
        let status = self
            .client
            .status()
            .await
            .map_err(|e| self.fail(phase.into(), format!("status: {e}"), None))?;
        let mut left = 0;
        for server in status {
            if server.state != ServerState::Stale {
                continue;
            }
            let rebuilt = self.client.rebuild(server.id, |_| {}).await;
            let redundant_failed = match &rebuilt {
                Err(ClientError::Unrebuildable { failed, .. }) => failed
                    .iter()
                    .filter(|(path, why)| {
                        let raid0 = self
                            .files
                            .iter()
                            .any(|f| f.file.path == *path && f.scheme == Scheme::Raid0);
                        // A torn stripe stays owed by design: the model lets exactly those
                        // stripes read as an error.
                        let torn = matches!(why, Unrebuildable::TornStripes(_));
                        !raid0 && !torn
                    })
                    .map(|(path, why)| format!("{path}: {why}"))
                    .collect::<Vec<_>>(),
                _ => Vec::new(),
            };
            if !redundant_failed.is_empty() {
                // A file with redundancy left owed: traced, and tried again by the next pass.
                self.note(format!(
                    "{phase}: rebuild of server {} left {}",
                    server.id,
                    redundant_failed.join("; ")
                ));
                left += 1;
                continue;
            }
            match rebuilt {
                Ok(_) | Err(ClientError::Unrebuildable { .. }) => {
                    // RAID-0 files it owes stay owed: unreadable from now on, never wrong.
                    for file in &mut self.files {
                        file.lost |= file.scheme == Scheme::Raid0;
                    }
                    self.report.rebuilds += 1;
                    self.trace
                        .push(format!("{phase}: server {} rebuilt", server.id));
                }
                Err(e) => {
                    self.trace
                        .push(format!("{phase}: rebuild of server {}: {e}", server.id));
                    left += 1;
                }
            }
        }
        Ok(left)
    }

    /// Whether every server is up and owes nothing (asked with faults off).
    async fn all_up(&mut self) -> bool {
        let network = self.cluster.network.clone();
        network.set_faults(MemFaults::default());
        let up = match self.client.status().await {
            Ok(status) => status.iter().all(|s| s.state == ServerState::Up),
            Err(_) => false,
        };
        network.set_faults(self.config.network);
        up
    }

    /// Read every file whole and compare with the model; `redundant_only` skips RAID-0 files
    /// (a lost server makes them unavailable, rightly).
    async fn check_all(&mut self, phase: &str, redundant_only: bool) -> Result<(), Failure> {
        for index in 0..self.files.len() {
            let f = &self.files[index];
            if redundant_only && f.scheme == Scheme::Raid0 {
                continue;
            }
            let (size, read) = match self.client.size(&f.file).await {
                Ok(size) => (size, self.client.read_at(&f.file, 0, size).await),
                Err(e) => (0, Err(e)),
            };
            let f = &self.files[index];
            let bytes = match read {
                Ok(bytes) => bytes,
                Err(_) if f.lost => continue,
                Err(_) if f.model.torn_stripes() > 0 => {
                    self.check_by_stripe(phase, index, size).await?;
                    continue;
                }
                Err(e) => {
                    let detail = format!("{} ({}): read failed: {e}", f.file.path, f.scheme);
                    return Err(self.fail(phase.into(), detail, None));
                }
            };
            if size < f.model.size_min() || size > f.model.size_max() || bytes.len() as u64 != size
            {
                let detail = format!(
                    "{} ({}): size {size} (read {}), model allows {}..={}",
                    f.file.path,
                    f.scheme,
                    bytes.len(),
                    f.model.size_min(),
                    f.model.size_max()
                );
                return Err(self.fail(phase.into(), detail, None));
            }
            if let Err(m) = f.model.check(0, &bytes) {
                let detail = describe_mismatch(f, &m);
                return Err(self.fail(phase.into(), detail, Some(m)));
            }
            self.report.bytes_checked += size;
        }
        Ok(())
    }
}

impl Explorer {
    /// Read a file stripe by stripe and compare with the model: a stripe the model allows to
    /// be torn may fail to read (an interrupted full-stripe write under a lost column), every
    /// other one must read, and every byte read must be allowed.
    async fn check_by_stripe(
        &mut self,
        phase: &str,
        index: usize,
        size: u64,
    ) -> Result<(), Failure> {
        let f = &self.files[index];
        let (file, stripe_bytes) = (f.file.clone(), f.stripe_bytes);
        if size < f.model.size_min() || size > f.model.size_max() {
            let detail = format!(
                "{} ({}): size {size}, model allows {}..={}",
                f.file.path,
                f.scheme,
                f.model.size_min(),
                f.model.size_max()
            );
            return Err(self.fail(phase.into(), detail, None));
        }
        for stripe in 0..size.div_ceil(stripe_bytes) {
            let offset = stripe * stripe_bytes;
            let len = stripe_bytes.min(size - offset);
            let read = self.client.read_at(&file, offset, len).await;
            let f = &self.files[index];
            match read {
                Ok(bytes) if bytes.len() as u64 == len => {
                    if let Err(m) = f.model.check(offset, &bytes) {
                        let detail = describe_mismatch(f, &m);
                        return Err(self.fail(phase.into(), detail, Some(m)));
                    }
                    self.report.bytes_checked += len;
                }
                Ok(bytes) => {
                    let detail = format!(
                        "{} ({}): stripe {stripe} read {} bytes of {len}",
                        f.file.path,
                        f.scheme,
                        bytes.len()
                    );
                    return Err(self.fail(phase.into(), detail, None));
                }
                Err(_) if f.model.may_be_torn(stripe) => {
                    self.report.torn_stripes_unreadable += 1;
                    self.note(format!(
                        "{phase}: {} stripe {stripe} unreadable (torn full-stripe write)",
                        f.file.path
                    ));
                }
                Err(e) => {
                    let detail = format!(
                        "{} ({}): stripe {stripe} read failed: {e}",
                        f.file.path, f.scheme
                    );
                    return Err(self.fail(phase.into(), detail, None));
                }
            }
        }
        Ok(())
    }
}

/// Run one operation on `client`.
async fn run_op(client: Client, file: Option<File>, op: Op) -> Outcome {
    let result = match (op, file) {
        (Op::Create { path, scheme, unit }, _) => {
            let layout = LayoutRequest {
                scheme,
                stripe_unit: unit,
                width: None,
            };
            client.create(&path, layout).await.map(Outcome::Created)
        }
        (Op::Write { offset, data, .. }, Some(file)) => client
            .write_at(&file, offset, &data)
            .await
            .map(|()| Outcome::Wrote),
        (Op::Read { offset, len, .. }, Some(file)) => {
            client.read_at(&file, offset, len).await.map(Outcome::Read)
        }
        (Op::Sync { .. }, Some(file)) => client.sync(&file).await.map(|()| Outcome::Synced),
        (Op::Truncate { size, .. }, Some(file)) => client
            .truncate(&file, size)
            .await
            .map(|_| Outcome::Truncated),
        (op, None) => unreachable!("{op:?} names a file"),
    };
    result.unwrap_or_else(Outcome::Failed)
}

fn describe(op: &Op) -> String {
    match op {
        Op::Create { path, scheme, unit } => format!("create {path} {scheme} unit {unit}"),
        Op::Write { file, offset, data } => {
            format!("write file#{file} {offset}+{}", data.len())
        }
        Op::Read { file, offset, len } => format!("read file#{file} {offset}+{len}"),
        Op::Sync { file } => format!("sync file#{file}"),
        Op::Truncate { file, size } => format!("truncate file#{file} to {size}"),
    }
}

fn describe_mismatch(f: &SimFile, m: &Mismatch) -> String {
    format!(
        "{} ({}, stripe {} bytes): byte {} read {:#04x}, acknowledged {:#04x}{}; {} wrong bytes, \
         {} of them acknowledged; the bytes read there are those of {}",
        f.file.path,
        f.scheme,
        f.stripe_bytes,
        m.offset,
        m.got,
        m.acked,
        if m.acknowledged {
            ""
        } else {
            " (or an unacknowledged write's)"
        },
        m.wrong_bytes,
        m.wrong_acknowledged,
        if m.origin.is_empty() {
            "no write of this file"
        } else {
            &m.origin
        }
    )
}

/// A number from the environment variable `name`, if it is set; a value that is not a number
/// is a mistake of whoever runs the tests, so it panics with the name.
fn env_number(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value} is not a number")),
    )
}

/// The seeds a seeded test runs, `(first, count)`: one to replay (`TESSERA_SIM_SEED`), or
/// `seeds` of them unless the environment asks for more or others (`TESSERA_SIM_SEEDS`,
/// `TESSERA_SIM_SEED_BASE`).
pub fn seed_range(seeds: u64) -> (u64, u64) {
    match env_number("TESSERA_SIM_SEED") {
        Some(seed) => (seed, 1),
        None => (
            env_number("TESSERA_SIM_SEED_BASE").unwrap_or(0),
            env_number("TESSERA_SIM_SEEDS").unwrap_or(seeds),
        ),
    }
}
