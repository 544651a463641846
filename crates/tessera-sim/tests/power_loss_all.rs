//! Every server of a cluster loses power at once (one machine, one rack) while writes are
//! in flight, after other writes were synced: the synced bytes must survive it.
//!
//! **They do not yet** (found in session 24): each store finds its `unsynced` mark after the
//! reboot, starts over empty as a new incarnation and expects to be rebuilt from the others
//! (`tessera-store`'s `boot.rs`), and every other server did the same, so nothing is left
//! to rebuild from and a file synced long before reads as an error. The test is ignored
//! (with this reason) until the store keeps its bytes and the manager resyncs parity from
//! them where no column is left to rebuild from (see the README, *Durability*).

use rand::{Rng, SeedableRng};
use tessera_client::{LayoutRequest, Scheme};
use tessera_sim::{run_virtual, SimCluster};

async fn all_lose_power(seed: u64) {
    let mut cluster = SimCluster::start(seed, 5).await;
    let client = cluster.client();
    let layout = LayoutRequest {
        scheme: Scheme::Raid5,
        stripe_unit: 4096,
        width: Some(5),
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let kept: Vec<u8> = (0..3 * 4 * 4096 + 100).map(|_| rng.gen()).collect();
    let file = client
        .create("/kept", layout.clone())
        .await
        .expect("create");
    client.write_at(&file, 0, &kept).await.expect("write");
    client.sync(&file).await.expect("sync");
    // Other writes, answered and not synced, on every server.
    let other = client.create("/other", layout).await.expect("create");
    let bytes: Vec<u8> = (0..2 * 4 * 4096).map(|_| rng.gen()).collect();
    client.write_at(&other, 0, &bytes).await.expect("write");
    for index in 0..cluster.servers() {
        cluster.power_loss(index, seed + index as u64);
    }
    for index in 0..cluster.servers() {
        assert!(cluster.start_server(index).await.is_none());
    }
    let reader = cluster.client();
    let file = reader.open("/kept").await.expect("open");
    let read = reader.read_at(&file, 0, kept.len() as u64).await;
    assert_eq!(
        read.ok().as_deref(),
        Some(&kept[..]),
        "seed {seed}: synced bytes"
    );
}

#[test]
#[ignore = "known durability bug (session 24): every store renews and empties itself after a power loss of all servers at once, so synced files are lost; see the module doc"]
fn synced_bytes_survive_every_server_losing_power_at_once() {
    for seed in 0..3 {
        run_virtual(all_lose_power(seed));
    }
}
