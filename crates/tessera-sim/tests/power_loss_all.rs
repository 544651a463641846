//! Every server of a cluster loses power at once (one machine, one rack) while writes are
//! in flight, after other writes were synced: the synced bytes must survive it.
//!
//! Each store finds its `unsynced` mark after the reboot and renews itself (a new
//! incarnation, owing every file it held), and every other server did the same, so there is
//! nothing to rebuild from. Until session 25 that lost every synced file (found in session
//! 24). Now each store keeps its old bytes aside (`tessera-store`'s `kept` module) and the
//! rebuild puts them back where no other server can rebuild a file, resyncing parity from
//! them (`tessera-client`'s `restore` module). The same holds for a RAID-0 file on one
//! server that lost power: nothing else holds its bytes either.

use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tessera_client::{Client, LayoutRequest, Scheme};
use tessera_sim::explore::seed_range;
use tessera_sim::BeforeCall;
use tessera_sim::{log_if_asked, run_virtual, SimCluster};
use tessera_transport::BoxFuture;
use tessera_wire::{KeptAction, StorageRequest};

/// A file of `scheme` over every server, written and synced: its bytes.
async fn synced_file(client: &Client, path: &str, scheme: Scheme, rng: &mut impl Rng) -> Vec<u8> {
    let layout = LayoutRequest {
        scheme,
        stripe_unit: 4096,
        width: Some(5),
    };
    let len = rng.gen_range(1..4 * 5 * 4096);
    let bytes: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
    let file = client.create(path, layout).await.expect("create");
    client.write_at(&file, 0, &bytes).await.expect("write");
    client.sync(&file).await.expect("sync");
    bytes
}

/// Writes answered and never synced, over every server: what a power loss may take.
async fn unsynced_writes(client: &Client, rng: &mut impl Rng) {
    let layout = LayoutRequest {
        scheme: Scheme::Raid5,
        stripe_unit: 4096,
        width: Some(5),
    };
    let other = client.create("/other", layout).await.expect("create");
    let bytes: Vec<u8> = (0..2 * 4 * 4096).map(|_| rng.gen()).collect();
    client.write_at(&other, 0, &bytes).await.expect("write");
}

/// Rebuilds every server, as an operator would after the reboot; every file must end up
/// owed by none.
async fn rebuild_all(cluster: &SimCluster, seed: u64) {
    let admin = cluster.client();
    for index in 0..cluster.servers() {
        let id = cluster.server_id(index);
        if let Err(e) = admin.rebuild(id, |_| {}).await {
            panic!("seed {seed}: rebuild of server {id}: {e}");
        }
    }
    assert_eq!(cluster.debts(), "", "seed {seed}: debts left");
}

/// A synced file, then an overwrite of part of it answered and never synced.
struct Overwritten {
    path: String,
    /// A bit flipped in this file's kept bytes: any block may read as an error (never wrong).
    flipped: bool,
    /// Data bytes per stripe.
    stripe_bytes: usize,
    synced: Vec<u8>,
    at: usize,
    late: Vec<u8>,
}

impl Overwritten {
    /// Checks one 4 KiB block read back (`None`: an error): synced bytes exact, those of the
    /// overwrite old or new; an error only in a block the overwrite touched (a torn block
    /// whose stripe's parity may predate the overwrite is not rebuilt from it), or with a
    /// server down (`degraded`) in a stripe it touched (the torn block is needed to rebuild
    /// the others).
    fn check(&self, block: usize, got: Option<&[u8]>, what: &str, degraded: bool) {
        let start = block * 4096;
        let end = (start + 4096).min(self.synced.len());
        let (from, to) = match degraded {
            false => (start, end),
            true => {
                let stripe = start / self.stripe_bytes * self.stripe_bytes;
                (stripe, stripe + self.stripe_bytes)
            }
        };
        let touched = from < self.at + self.late.len() && self.at < to;
        let Some(got) = got else {
            assert!(
                touched || self.flipped,
                "{what}: block {block} of {} unreadable",
                self.path
            );
            return;
        };
        assert_eq!(
            got.len(),
            end - start,
            "{what}: block {block} of {}",
            self.path
        );
        for (i, &byte) in got.iter().enumerate() {
            let at = start + i;
            let old = self.synced[at];
            let new = (self.at..self.at + self.late.len())
                .contains(&at)
                .then(|| self.late[at - self.at]);
            assert!(
                byte == old || Some(byte) == new,
                "{what}: byte {at} of {} is {byte:#04x}: synced {old:#04x}, overwrite {new:?} \
                 (the overwrite: {}+{}, the file {} bytes)",
                self.path,
                self.at,
                self.late.len(),
                self.synced.len()
            );
        }
    }

    /// Every block as `reader` reads it now, each checked.
    async fn read_blocks(
        &self,
        reader: &Client,
        what: &str,
        degraded: bool,
    ) -> Vec<Option<Vec<u8>>> {
        let file = reader.open(&self.path).await.expect("open");
        let mut blocks = Vec::new();
        for block in 0..self.synced.len().div_ceil(4096) {
            let start = block * 4096;
            let len = (self.synced.len() - start).min(4096) as u64;
            let got = reader.read_at(&file, start as u64, len).await.ok();
            self.check(block, got.as_deref(), what, degraded);
            blocks.push(got);
        }
        blocks
    }
}

/// Every server loses power at once; with `flip`, one bit then flips in one server's kept
/// bytes before the rebuild.
async fn all_lose_power(seed: u64, flip: bool) {
    let mut cluster = SimCluster::start(seed, 5).await;
    let client = cluster.client();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let schemes = [
        Scheme::Raid5,
        Scheme::Raid4,
        Scheme::Hybrid,
        Scheme::Raid1,
        Scheme::Raid0,
    ];
    let mut files = Vec::new();
    for (i, scheme) in schemes.into_iter().enumerate() {
        let path = format!("/kept{i}");
        let synced = synced_file(&client, &path, scheme, &mut rng).await;
        let columns = match scheme {
            Scheme::Raid0 | Scheme::Raid1 => 5,
            _ => 4,
        };
        files.push(Overwritten {
            path,
            flipped: false,
            stripe_bytes: columns * 4096,
            synced,
            at: 0,
            late: Vec::new(),
        });
    }
    for file in &mut files {
        let handle = client.open(&file.path).await.expect("open");
        file.at = rng.gen_range(0..file.synced.len());
        let len = rng.gen_range(1..=(file.synced.len() - file.at).min(3 * 4096));
        file.late = (0..len).map(|_| rng.gen()).collect();
        client
            .write_at(&handle, file.at as u64, &file.late)
            .await
            .expect("overwrite");
    }
    unsynced_writes(&client, &mut rng).await;
    for index in 0..cluster.servers() {
        cluster.power_loss(index, seed * 10 + index as u64);
    }
    for index in 0..cluster.servers() {
        assert!(cluster.start_server(index).await.is_none());
    }
    if flip {
        flip_a_kept_bit(&cluster, &client, &mut files, seed).await;
    }
    rebuild_all(&cluster, seed).await;
    let reader = cluster.client();
    let mut read = Vec::new();
    for file in &files {
        read.push(
            file.read_blocks(&reader, &format!("seed {seed}"), false)
                .await,
        );
    }
    // Every server down in turn: the resync left redundancy whole, so a degraded read gives
    // what the read above gave (or an error, in a stripe holding a torn block).
    for index in 0..cluster.servers() {
        cluster.crash_server(index);
        let what = format!("seed {seed}, server {index} down");
        for (file, before) in files.iter().zip(&read).filter(|(f, _)| f.path != "/kept4") {
            let now = file.read_blocks(&reader, &what, true).await;
            for (block, (a, b)) in before.iter().zip(&now).enumerate() {
                if let (Some(a), Some(b)) = (a, b) {
                    assert!(
                        a == b,
                        "{what}: block {block} of {} read otherwise",
                        file.path
                    );
                }
            }
        }
        assert!(cluster.start_server(index).await.is_none());
    }
}

/// One bit flips in a file of server `seed % 5`'s kept bytes (data, checksums, overflow
/// bytes or log, records): the file it hit is marked `flipped`.
async fn flip_a_kept_bit(
    cluster: &SimCluster,
    client: &Client,
    files: &mut [Overwritten],
    seed: u64,
) {
    let index = seed as usize % cluster.servers();
    let flip = cluster
        .flip_bit_under(index, "kept", seed)
        .unwrap_or_else(|| panic!("seed {seed}: server {index} kept nothing"));
    eprintln!(
        "seed {seed}: bit {} of byte {} of server {index}'s {} flipped",
        flip.bit,
        flip.offset,
        flip.path.display()
    );
    let kept = flip.path.to_str().expect("a UTF-8 path");
    let id = kept
        .split("kept/")
        .nth(1)
        .and_then(|rest| rest.split('/').next());
    for file in files.iter_mut() {
        let meta = client.stat(&file.path).await.expect("stat").meta;
        file.flipped = id == Some(meta.id.to_string().as_str());
    }
}

#[test]
fn synced_bytes_survive_every_server_losing_power_at_once() {
    log_if_asked();
    let (base, count) = seed_range(8);
    for seed in base..base + count {
        run_virtual(all_lose_power(seed, false));
    }
}

/// A bit flipped in kept bytes before they are put back is found, never served: the file
/// it hit reads exact or fails block by block, every other file reads as without the flip.
#[test]
fn a_bit_flipped_in_kept_bytes_is_never_served() {
    log_if_asked();
    let (base, count) = seed_range(8);
    for seed in base..base + count {
        run_virtual(all_lose_power(seed, true));
    }
}

/// A RAID-0 file has no other copy: one server losing power with writes owed must not lose
/// its synced bytes either, nor may the bytes other files' rebuilds got from the others be
/// replaced by what that server kept.
async fn one_loses_power(seed: u64) {
    let mut cluster = SimCluster::start(seed, 5).await;
    let client = cluster.client();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let striped = synced_file(&client, "/striped", Scheme::Raid0, &mut rng).await;
    let parity = synced_file(&client, "/parity", Scheme::Raid5, &mut rng).await;
    // Acknowledged, never synced: must survive one server's power loss (the others hold it).
    let file = client.open("/parity").await.expect("open");
    let late: Vec<u8> = (0..3 * 4096).map(|_| rng.gen()).collect();
    client.write_at(&file, 100, &late).await.expect("write");
    let mut parity_now = parity.clone();
    let end = (100 + late.len()).max(parity_now.len());
    parity_now.resize(end, 0);
    parity_now[100..100 + late.len()].copy_from_slice(&late);
    let index = (seed as usize) % cluster.servers();
    cluster.power_loss(index, seed);
    assert!(cluster.start_server(index).await.is_none());
    rebuild_all(&cluster, seed).await;
    let reader = cluster.client();
    for (path, bytes) in [("/striped", &striped), ("/parity", &parity_now)] {
        let file = reader.open(path).await.expect("open");
        let read = reader.read_at(&file, 0, bytes.len() as u64).await;
        assert_eq!(
            read.ok().as_deref(),
            Some(&bytes[..]),
            "seed {seed}: {path} after server {index} lost power"
        );
    }
}

#[test]
fn a_raid0_file_survives_its_server_losing_power() {
    let (base, count) = seed_range(5);
    for seed in base..base + count {
        run_virtual(one_loses_power(seed));
    }
}

/// The rebuild that puts kept bytes back dies at its `kill_at`-th request from the first
/// one putting bytes back (it waits forever there and is dropped); a rebuild run after it
/// finishes the work, and the synced bytes read exactly, with every server down in turn.
async fn killed_while_putting_back(seed: u64, kill_at: usize) {
    let mut cluster = SimCluster::start(seed, 5).await;
    let client = cluster.client();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let synced = synced_file(&client, "/kept", Scheme::Raid5, &mut rng).await;
    unsynced_writes(&client, &mut rng).await;
    for index in 0..cluster.servers() {
        cluster.power_loss(index, seed * 10 + index as u64);
    }
    for index in 0..cluster.servers() {
        assert!(cluster.start_server(index).await.is_none());
    }
    let started = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let dying = BeforeCall::new(
        Arc::new(cluster.network.transport(Duration::from_secs(1))),
        move |_, request: Option<&StorageRequest>| {
            if let Some(StorageRequest::KeptBytes {
                action: KeptAction::Restore,
                ..
            }) = request
            {
                started.store(true, Ordering::SeqCst);
            }
            if started.load(Ordering::SeqCst) && calls.fetch_add(1, Ordering::SeqCst) >= kill_at {
                return Box::pin(std::future::pending()) as BoxFuture<'static, ()>;
            }
            Box::pin(async {}) as BoxFuture<'static, ()>
        },
    );
    let doomed = Client::with_transport(cluster.manager_addr, Arc::new(dying));
    let first = cluster.server_id(0);
    let ran = tokio::time::timeout(Duration::from_secs(60), doomed.rebuild(first, |_| {})).await;
    assert!(
        ran.is_err(),
        "seed {seed}: the rebuild was to die at request {kill_at}"
    );
    drop(doomed);
    rebuild_all(&cluster, seed).await;
    let reader = cluster.client();
    for down in [None, Some(0), Some(1), Some(2), Some(3), Some(4)] {
        if let Some(index) = down {
            cluster.crash_server(index);
        }
        let file = reader.open("/kept").await.expect("open");
        let read = reader.read_at(&file, 0, synced.len() as u64).await;
        assert!(
            read.ok().as_deref() == Some(&synced[..]),
            "seed {seed}, killed at request {kill_at}: synced bytes with server {down:?} down"
        );
        if let Some(index) = down {
            assert!(cluster.start_server(index).await.is_none());
        }
    }
}

#[test]
fn a_rebuild_killed_while_putting_kept_bytes_back_is_finished_by_the_next() {
    for (seed, kill_at) in [0, 1, 2, 4, 5, 6, 8, 11, 16, 24, 40]
        .into_iter()
        .enumerate()
    {
        run_virtual(killed_while_putting_back(seed as u64, kill_at));
    }
}

/// A server wiped (its disk replaced: nothing kept) owes every file it held a column of. A
/// RAID-0 file that has bytes there cannot be rebuilt and says so; one too small to have
/// any there owes it nothing, and its rebuild clears the debt.
async fn wiped_under_raid0(seed: u64) {
    let mut cluster = SimCluster::start(seed, 5).await;
    let client = cluster.client();
    let layout = LayoutRequest {
        scheme: Scheme::Raid0,
        stripe_unit: 4096,
        width: Some(5),
    };
    let small = client
        .create("/small", layout.clone())
        .await
        .expect("create");
    client.write_at(&small, 0, &[7; 100]).await.expect("write");
    let big = client.create("/big", layout).await.expect("create");
    client
        .write_at(&big, 0, &[9; 5 * 4096])
        .await
        .expect("write");
    client.sync(&big).await.expect("sync");
    // The server of the small file's last column: the file's one block is on its first.
    let servers = client.stat("/small").await.expect("stat").meta.servers;
    let index = cluster.index_of(servers[4]);
    cluster.wipe_server(index).await;
    assert!(cluster.start_server(index).await.is_none());
    let failed = match client.rebuild(servers[4], |_| {}).await {
        Err(tessera_client::ClientError::Unrebuildable { failed, .. }) => failed,
        other => panic!("seed {seed}: the rebuild was to fail on /big: {other:?}"),
    };
    let paths: Vec<&str> = failed.iter().map(|(path, _)| path.as_str()).collect();
    assert_eq!(paths, ["/big"], "seed {seed}");
    let got = client.read_at(&small, 0, 100).await.expect("read");
    assert_eq!(got, [7; 100], "seed {seed}");
}

#[test]
fn a_server_holding_none_of_a_raid0_file_owes_it_nothing_to_rebuild() {
    for seed in 0..3 {
        run_virtual(wiped_under_raid0(seed));
    }
}
